/**
 * A proxy that adds a fixed one-way delay each way (before forwarding, and before answering), so a
 * loopback bench pays what an edge function pays for a round trip to Redis: 2 × `delayMs`.
 *
 * @module
 */

/** A running proxy. */
export interface LatencyProxy {
  /** Where to send requests instead of `target`. */
  url: string;
  close(): Promise<void>;
}

/** Starts a proxy in front of `target` on a free loopback port. */
export function startLatencyProxy(target: string, delayMs: number): LatencyProxy {
  if (!Number.isFinite(delayMs) || delayMs < 0) throw new RangeError("delayMs must be ≥ 0");
  const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
  const base = new URL(target);
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, async (request) => {
    const url = new URL(request.url);
    const body = await request.arrayBuffer();
    await sleep(delayMs);
    const reply = await fetch(new URL(url.pathname + url.search, base), {
      method: request.method,
      headers: request.headers,
      body: request.method === "GET" || request.method === "HEAD" ? undefined : body,
    });
    const bytes = await reply.arrayBuffer();
    await sleep(delayMs);
    return new Response(bytes, { status: reply.status, headers: reply.headers });
  });
  return {
    url: `http://127.0.0.1:${server.addr.port}`,
    close: () => server.shutdown(),
  };
}
