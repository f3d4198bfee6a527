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
}

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

/** Starts redis-server and resolves once it accepts connections. */
export async function startRedisServer(options: RedisServerOptions = {}): Promise<RedisServer> {
  const port = options.port ?? freePort();
  const ownDir = options.dir === undefined;
  const dir = options.dir ?? await Deno.makeTempDir({ prefix: "edgelock-redis-" });
  let child: Deno.ChildProcess;
  try {
    child = new Deno.Command("redis-server", {
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
      stdout: "null",
      stderr: "piped",
    }).spawn();
  } catch (error) {
    if (ownDir) await Deno.remove(dir, { recursive: true });
    if (error instanceof Deno.errors.NotFound) {
      throw new Error(`redis-server is not installed. Install it with: ${INSTALL_HINT}`);
    }
    throw error;
  }
  const stderr = child.stderr.text();
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
      await stderr;
    }
    if (remove) await Deno.remove(dir, { recursive: true }).catch(() => {});
  };

  const deadline = Date.now() + 10_000;
  while (!(await answersPing(port))) {
    const done = await Promise.race([exited.then(() => true), delay(50).then(() => false)]);
    if (done || Date.now() > deadline) {
      await stop({ remove: ownDir });
      throw new Error(`redis-server did not start on port ${port}: ${(await stderr).trim()}`);
    }
  }
  return { url: `redis://127.0.0.1:${port}`, port, dir, stop };
}

async function answersPing(port: number): Promise<boolean> {
  let conn: Deno.TcpConn | undefined;
  try {
    conn = await Deno.connect({ hostname: "127.0.0.1", port });
    await conn.write(new TextEncoder().encode("PING\r\n"));
    const buffer = new Uint8Array(16);
    const n = await conn.read(buffer);
    return new TextDecoder().decode(buffer.subarray(0, n ?? 0)).startsWith("+PONG");
  } catch {
    return false;
  } finally {
    conn?.close();
  }
}

function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
