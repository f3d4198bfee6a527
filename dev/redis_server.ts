/**
 * Starts a private redis-server on a free loopback port in a temporary directory, for tests, the
 * benchmark and `deno task dev`. Never touches a shared server.
 *
 * @module
 */

/** Options for {@linkcode startRedisServer}. */
export interface RedisServerOptions {
  /** Port to listen on. @default a free one */
  port?: number;
  /** Directory for its data. @default a new temporary directory, removed on stop */
  dir?: string;
  /** Extra `redis-server` arguments, e.g. `["--appendonly", "yes"]`. */
  args?: string[];
  /** Extra environment for redis-server, e.g. libfaketime's to give it a clock of its own. */
  env?: Record<string, string>;
}

/**
 * The persistence the README's guarantees assume of Redis: every write in the append-only file
 * and fsync'd before the reply, so a restart forgets no lease (Upstash persists every write too).
 */
export const DURABLE_ARGS = ["--appendonly", "yes", "--appendfsync", "always"];

/** A running redis-server. */
export interface RedisServer {
  url: string;
  port: number;
  dir: string;
  /** Stops the server (SIGTERM, then SIGKILL after 5 s). Keeps the directory unless `remove`. */
  stop(options?: { remove?: boolean }): Promise<void>;
}

const INSTALL_HINT = "apt-get update && apt-get install -y redis-server";

/** Returns a free TCP port on 127.0.0.1. */
export function freePort(): number {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const { port } = listener.addr as Deno.NetAddr;
  listener.close();
  return port;
}

/**
 * Starts redis-server and resolves once it accepts connections. Without `options.port` it picks a
 * free port; should another process take that port before redis-server binds it, it tries again
 * on another one.
 */
export async function startRedisServer(options: RedisServerOptions = {}): Promise<RedisServer> {
  for (let attempt = 1;; attempt++) {
    try {
      return await startOnce(options, options.port ?? freePort());
    } catch (error) {
      const raced = error instanceof PortTakenError && options.port === undefined;
      if (!raced || attempt === 5) throw error;
    }
  }
}

class PortTakenError extends Error {}

async function startOnce(options: RedisServerOptions, port: number): Promise<RedisServer> {
  const ownDir = options.dir === undefined;
  const dir = options.dir ?? await Deno.makeTempDir({ prefix: "edgelock-redis-" });
  let child: Deno.ChildProcess;
  try {
    child = new Deno.Command("redis-server", {
      ...(options.env && { env: options.env }),
      args: [
        "--port",
        String(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        dir,
        "--save",
        "",
        "--appendonly",
        "no",
        ...(options.args ?? []),
      ],
      stdout: "piped",
      stderr: "piped",
    }).spawn();
  } catch (error) {
    if (ownDir) await Deno.remove(dir, { recursive: true });
    if (error instanceof Deno.errors.NotFound) {
      throw new Error(`redis-server is not installed. Install it with: ${INSTALL_HINT}`);
    }
    throw error;
  }
  // redis-server logs to stdout; keep it for the error message, and drain it so it never blocks.
  const output = Promise.all([child.stdout.text(), child.stderr.text()]).then((texts) =>
    texts.join("").trim()
  );
  const exited = child.status;
  let stopped = false;

  const stop = async ({ remove = ownDir } = {}) => {
    if (!stopped) {
      stopped = true;
      try {
        child.kill("SIGTERM");
      } catch { /* already gone */ }
      const timer = setTimeout(() => {
        try {
          child.kill("SIGKILL");
        } catch { /* already gone */ }
      }, 5000);
      await exited;
      clearTimeout(timer);
      await output;
    }
    if (remove) await Deno.remove(dir, { recursive: true }).catch(() => {});
  };

  const deadline = Date.now() + 10_000;
  // Ask the server itself: a PING on the port could be answered by whoever took it from us.
  const realDir = await Deno.realPath(dir);
  while (!(await answersPing(port, realDir))) {
    const done = await Promise.race([exited.then(() => true), delay(50).then(() => false)]);
    if (done || Date.now() > deadline) {
      await stop({ remove: ownDir });
      const log = await output;
      const message = `redis-server did not start on port ${port}: ${log}`;
      throw /Address already in use/i.test(log) ? new PortTakenError(message) : new Error(message);
    }
  }
  return { url: `redis://127.0.0.1:${port}`, port, dir, stop };
}

// True when the redis-server on `port` answers and is ours: its `dir` is the one we gave it.
async function answersPing(port: number, dir: string): Promise<boolean> {
  let conn: Deno.TcpConn | undefined;
  try {
    conn = await Deno.connect({ hostname: "127.0.0.1", port });
    await conn.write(new TextEncoder().encode("CONFIG GET dir\r\n"));
    const buffer = new Uint8Array(4096);
    const n = await conn.read(buffer);
    return new TextDecoder().decode(buffer.subarray(0, n ?? 0)).includes(`\r\n${dir}\r\n`);
  } catch {
    return false;
  } finally {
    conn?.close();
  }
}

function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
