/**
 * A fault-injecting HTTP proxy for tests and the torture run: it sits in front of the REST bridge
 * or the service and, per request, injects one fault drawn by the configured probabilities.
 *
 * @module
 */

/** Fault kinds and what each does to one request. */
export const FAULT_KINDS = [
  "delay", // forward after a random delay up to delayMs
  "dropRequest", // break the connection without forwarding: nothing happened
  "dropResponse", // forward, let the target commit, then break the connection: ambiguous
  "duplicate", // forward twice, answer with the second reply
  "error5xx", // answer 503 without forwarding
  "holdResponse", // forward, then hold the reply for holdMs (past a lease) before answering
] as const;
export type FaultKind = typeof FAULT_KINDS[number];

/** Options for {@linkcode startFaultProxy}. */
export interface FaultProxyOptions {
  /** Where requests go, e.g. the bridge's URL. */
  target: string;
  /** Probability of each fault per request, 0–1; they add up to at most 1. @default none */
  faults?: Partial<Record<FaultKind, number>>;
  /** @default 50 */
  delayMs?: number;
  /** @default 1500 */
  holdMs?: number;
  /** @default Math.random */
  random?: () => number;
}

/** A running proxy. */
export interface FaultProxy {
  url: string;
  /** Faults injected so far, by kind, and requests proxied. */
  counts(): Record<FaultKind | "requests", number>;
  /** Changes the fault probabilities from now on. */
  setFaults(faults: Partial<Record<FaultKind, number>>): void;
  close(): Promise<void>;
}

/** Starts a proxy on a free loopback port. */
export function startFaultProxy(options: FaultProxyOptions): FaultProxy {
  const { target, delayMs = 50, holdMs = 1500, random = Math.random } = options;
  let faults = options.faults ?? {};
  const counts = Object.fromEntries([...FAULT_KINDS, "requests"].map((k) => [k, 0])) as Record<
    FaultKind | "requests",
    number
  >;
  const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

  const pick = (): FaultKind | undefined => {
    let roll = random();
    for (const kind of FAULT_KINDS) {
      roll -= faults[kind] ?? 0;
      if (roll < 0) return kind;
    }
    return undefined;
  };

  // A reply that promises more body than it sends: the client sees the connection break.
  const broken = () =>
    new Response(
      new ReadableStream({
        start(controller) {
          controller.enqueue(new Uint8Array([123]));
          controller.close();
        },
      }),
      { status: 200, headers: { "content-length": "1000" } },
    );

  async function forward(request: Request, body: ArrayBuffer): Promise<Response> {
    const url = new URL(request.url);
    const res = await fetch(`${target}${url.pathname}${url.search}`, {
      method: request.method,
      headers: request.headers,
      body: request.method === "GET" || request.method === "HEAD" ? undefined : body,
    });
    // Buffer the reply so the target's connection is free whatever the fault does next.
    return new Response(await res.arrayBuffer(), { status: res.status, headers: res.headers });
  }

  const server = Deno.serve(
    { port: 0, hostname: "127.0.0.1", onListen() {} },
    async (request) => {
      counts.requests++;
      const body = await request.arrayBuffer();
      const kind = pick();
      if (kind) counts[kind]++;
      try {
        switch (kind) {
          case "delay":
            await sleep(random() * delayMs);
            return await forward(request, body);
          case "dropRequest":
            return broken();
          case "dropResponse":
            await (await forward(request, body)).arrayBuffer();
            return broken();
          case "duplicate":
            await (await forward(request, body)).arrayBuffer();
            return await forward(request, body);
          case "error5xx":
            return Response.json({ error: "injected fault" }, { status: 503 });
          case "holdResponse": {
            const res = await forward(request, body);
            await sleep(holdMs);
            return res;
          }
          default:
            return await forward(request, body);
        }
      } catch {
        return broken(); // the target itself is down
      }
    },
  );
  return {
    url: `http://127.0.0.1:${server.addr.port}`,
    counts: () => ({ ...counts }),
    setFaults(next) {
      faults = next;
    },
    close: () => server.shutdown(),
  };
}
