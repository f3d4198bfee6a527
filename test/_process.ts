// Runs a Deno entry as a subprocess and waits until its output matches `ready`.
import { buildWorker } from "../dev/build_worker.ts";

export interface Spawned {
  child: Deno.ChildProcess;
  /** The match of `ready` in the output: capture what the test needs in it (ports, keys). */
  ready: RegExpExecArray;
  /** Everything it printed so far. */
  output(): string;
  /** Sends `signal` and waits for the exit status. */
  stop(signal?: Deno.Signal): Promise<Deno.CommandStatus>;
}

/**
 * Spawns `deno <args>` and resolves once everything it printed (stdout and stderr together)
 * matches `ready`. Make `ready` cover every line the test reads, up to its newline, so that a
 * line printed later or cut between two chunks cannot race the test.
 */
export async function spawnDeno(
  args: string[],
  env: Record<string, string>,
  ready: RegExp,
  timeoutMs = 30_000,
): Promise<Spawned> {
  const child = new Deno.Command(Deno.execPath(), {
    args,
    env: { ...env, NO_COLOR: "1" },
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  let text = "";
  let resolveReady: (match: RegExpExecArray) => void;
  const isReady = new Promise<RegExpExecArray>((resolve) => resolveReady = resolve);
  const pump = async (stream: ReadableStream<Uint8Array>) => {
    for await (const chunk of stream.pipeThrough(new TextDecoderStream())) {
      text += chunk;
      const match = ready.exec(text);
      if (match) resolveReady(match);
    }
  };
  const pumps = Promise.all([pump(child.stdout), pump(child.stderr)]);
  let stopped: Promise<Deno.CommandStatus> | undefined;
  const stop = (signal: Deno.Signal = "SIGTERM") =>
    stopped ??= (async () => {
      try {
        child.kill(signal);
      } catch { /* already exited */ }
      const status = await child.status;
      await pumps;
      return status;
    })();
  let timer: ReturnType<typeof setTimeout> | undefined;
  const outcome = await Promise.race([
    isReady,
    child.status.then(() => "exited" as const),
    new Promise<"timeout">((resolve) => timer = setTimeout(() => resolve("timeout"), timeoutMs)),
  ]);
  clearTimeout(timer);
  if (typeof outcome === "string") {
    await stop("SIGKILL");
    throw new Error(`deno ${args.join(" ")} did not start (${outcome}):\n${text}`);
  }
  return { child, ready: outcome, output: () => text, stop };
}

/** What `Deno.serve` prints once it listens; the first group is the port (start with PORT=0). */
export const LISTENING = /Listening on http:\/\/127\.0\.0\.1:(\d+)\//;

/**
 * Builds the Cloudflare Worker as `deno task build:worker` does (what wrangler deploys) into a temp
 * dir: `worker.js`, and its static assets in `assets/` beside it.
 */
export async function bundleWorker(): Promise<string> {
  const dir = await Deno.makeTempDir({ prefix: "edgelock-worker-" });
  const out = `${dir}/worker.js`;
  await buildWorker(out, `${dir}/assets`);
  return out;
}

/**
 * Sends `request` as raw bytes to 127.0.0.1:`port`, closes the writing side, and returns the
 * reply's status code and body (chunks joined): for requests no fetch would send, such as a body
 * cut short. Gives up after 10 s. The half-close ends the request: Deno.serve fails to read even a
 * whole body of a few KiB sent this way, so test a large body with fetch.
 */
export async function sendRaw(
  port: number,
  request: string,
): Promise<{ status: number; body: string }> {
  const conn = await Deno.connect({ hostname: "127.0.0.1", port });
  const timer = setTimeout(() => conn.close(), 10_000);
  try {
    await conn.write(new TextEncoder().encode(request));
    await conn.closeWrite();
    const reply = await new Response(conn.readable).text();
    const [head = "", ...rest] = reply.split("\r\n\r\n");
    let body = rest.join("\r\n\r\n");
    if (/transfer-encoding: chunked/i.test(head)) body = body.replace(/(^|\r\n)[0-9a-f]+\r\n/g, "");
    return { status: Number(head.split(" ")[1]), body: body.trim() };
  } finally {
    clearTimeout(timer);
  }
}
