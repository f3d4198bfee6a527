/**
 * A local server speaking the Upstash Redis REST protocol in front of a real redis-server, so the
 * unmodified `@upstash/redis` client works in tests and local development. It is a development
 * tool, not a production proxy. Wire details: `shared/UPSTASH_REST.md`.
 *
 * @module
 */
import { Buffer } from "node:buffer";
import { timingSafeEqual } from "node:crypto";
import { Cluster, Redis as IORedis } from "ioredis";
import { cli } from "./_cli.ts";

/** Options for {@linkcode startBridge}. */
export interface BridgeOptions {
  /** The redis-server to front, e.g. `redis://127.0.0.1:6379`. */
  redisUrl: string;
  /**
   * Front a Redis Cluster instead: its seed nodes' `redis://` URLs (`redisUrl` is then unused).
   * Each command goes to the node of its keys' slot; a pipeline's commands go one by one (so they
   * may span slots); a transaction's keys must share one slot, as in any cluster.
   */
  clusterUrls?: string[];
  /** The Bearer token clients must present. */
  token: string;
  /** Port to listen on; 0 picks a free one. @default 8079 */
  port?: number;
  /** @default "127.0.0.1" */
  hostname?: string;
  /** Connections shared by single commands and pipelines. @default 4 */
  poolSize?: number;
  /** Connections each held by one `/multi-exec` at a time. @default 2 */
  transactionPoolSize?: number;
  /**
   * Blocking commands (BLPOP and its family, XREAD/XREADGROUP with BLOCK, WAIT, WAITAOF) run each
   * on a connection of its own, at most this many at once; one more is refused. @default 16
   */
  maxBlocking?: number;
  /**
   * The longest a command may take, ms: then its request fails (a blocking one's connection is
   * dropped). A blocking command's own timeout should be shorter. @default 30000
   */
  commandTimeoutMs?: number;
  /** On close, how long in-flight requests may finish before their connections are cut, ms. @default 5000 */
  shutdownGraceMs?: number;
  /** `/subscribe` and `/psubscribe` streams open at once, each on a connection of its own. @default 1024 */
  maxSubscriptions?: number;
  /** A comment line on every open stream this often, so dead clients are found, ms. @default 15000 */
  heartbeatMs?: number;
}

/** What the bridge has served since it started. */
export interface BridgeStats {
  /** HTTP requests to `/`, `/pipeline` and `/multi-exec`, failed ones included. */
  requests: number;
  /** Redis commands those requests carried. */
  commands: number;
}

/** A running bridge. */
export interface Bridge {
  url: string;
  port: number;
  stats(): BridgeStats;
  close(): Promise<void>;
}

type Arg = string | number | boolean | null;
type Command = [string, ...Arg[]];
type Slot = { result: unknown } | { error: string };
type Kind = "subscribe" | "psubscribe";

const MAX_BODY_BYTES = 10 * 1024 * 1024;

// Refused over REST (as Upstash does): they change a pooled connection's state, stream replies,
// or stop the server for everyone. CLIENT is refused but for its read-only subcommands.
const REJECTED = new Set([
  "multi",
  "exec",
  "discard",
  "watch",
  "unwatch",
  "select",
  "hello",
  "reset",
  "quit",
  "auth",
  "subscribe",
  "psubscribe",
  "ssubscribe",
  "unsubscribe",
  "punsubscribe",
  "sunsubscribe",
  "monitor",
  "sync",
  "psync",
  "readonly",
  "readwrite",
  "debug",
  "shutdown",
  "replicaof",
  "slaveof",
]);
const CLIENT_READS = new Set(["id", "info", "list", "getname"]);

// Commands that may block their connection: each runs on a connection of its own.
const BLOCKING = new Set([
  "blpop",
  "brpop",
  "brpoplpush",
  "blmove",
  "blmpop",
  "bzpopmin",
  "bzpopmax",
  "bzmpop",
  "wait",
  "waitaof",
]);

function isBlocking([name, ...args]: Command): boolean {
  const lower = name.toLowerCase();
  if (BLOCKING.has(lower)) return true;
  return (lower === "xread" || lower === "xreadgroup") &&
    args.some((arg) => String(arg).toLowerCase() === "block");
}

class BadRequest extends Error {
  constructor(message: string, readonly status = 400) {
    super(message);
  }
}

/** Starts a bridge; resolves once it is connected to Redis and listening. */
export async function startBridge(options: BridgeOptions): Promise<Bridge> {
  const { redisUrl, token, port = 8079, hostname = "127.0.0.1" } = options;
  const { maxBlocking = 16, commandTimeoutMs = 30_000, shutdownGraceMs = 5000 } = options;
  const { maxSubscriptions = 1024, heartbeatMs = 15_000 } = options;
  if (!token) throw new TypeError("The bridge needs a token (UPSTASH_REDIS_REST_TOKEN)");
  // Blocking commands' connections take no command timeout: the bridge times them and drops them.
  // On a cluster, a subscription's connection goes to the first seed: PUBLISH reaches every node.
  const connect = (commandTimeout: number | undefined = commandTimeoutMs) => {
    const conn = new IORedis(options.clusterUrls?.[0] ?? redisUrl, {
      lazyConnect: true,
      enableOfflineQueue: false,
      maxRetriesPerRequest: 0,
      retryStrategy: () => 100,
      ...(commandTimeout !== undefined && { commandTimeout }),
    });
    conn.on("error", () => {}); // reported per request; ioredis reconnects by itself
    return conn;
  };
  const cluster = options.clusterUrls && new Cluster(
    options.clusterUrls.map((url) => {
      const { hostname: host, port } = new URL(url);
      return { host, port: Number(port) };
    }),
    {
      enableOfflineQueue: false,
      redisOptions: { maxRetriesPerRequest: 0, commandTimeout: commandTimeoutMs },
    },
  );
  cluster?.on("error", () => {}); // reported per request
  const shared = cluster ? [] : Array.from({ length: options.poolSize ?? 4 }, () => connect());
  const exclusive = new ExclusivePool(
    cluster ? [] : Array.from({ length: options.transactionPoolSize ?? 2 }, () => connect()),
  );
  const all = [...shared, ...exclusive.connections];
  try {
    if (cluster) await untilReady(cluster);
    else await Promise.all(all.map((conn) => conn.connect()));
  } catch (error) {
    all.forEach((conn) => conn.disconnect());
    cluster?.disconnect();
    const what = cluster ? `the Redis Cluster at ${options.clusterUrls}` : `Redis at ${redisUrl}`;
    throw new Error(`The bridge cannot reach ${what}`, { cause: error });
  }

  const stats: BridgeStats = { requests: 0, commands: 0 };
  const expected = Buffer.from(token);
  let next = 0;
  let syncToken = 0;
  const pick = (): Connection => cluster ?? shared[next++ % shared.length]!;
  // Blocking commands, on connections of their own (none on a cluster: refused there).
  const blocking = new Set<IORedis>();
  const block = async <T>(fn: (conn: IORedis) => Promise<T>): Promise<T> => {
    if (cluster) {
      throw new BadRequest("ERR blocking commands are not supported on a cluster bridge");
    }
    if (blocking.size >= maxBlocking) {
      throw new BadRequest(`ERR too many blocking commands in flight (at most ${maxBlocking})`);
    }
    const conn = connect(undefined);
    blocking.add(conn);
    let timer: ReturnType<typeof setTimeout> | undefined;
    try {
      await conn.connect();
      const late = new Promise<never>((_, reject) => {
        timer = setTimeout(
          () => reject(new BadRequest(`ERR the command ran past ${commandTimeoutMs} ms`, 504)),
          commandTimeoutMs,
        );
      });
      return await Promise.race([fn(conn), late]);
    } finally {
      clearTimeout(timer);
      blocking.delete(conn);
      conn.disconnect();
    }
  };

  // Pub/sub as Upstash streams it (server-sent events): `data: subscribe,<channel>,<count>`, then
  // `data: message,<channel>,<payload>` (`pmessage,<pattern>,<channel>,<payload>`), raw text. A
  // payload with a newline arrives as several messages: the protocol has no escaping.
  const streams = new Set<() => void>();
  async function subscribe(kind: Kind, name: string, signal: AbortSignal): Promise<Response> {
    if (streams.size >= maxSubscriptions) {
      throw new BadRequest(`ERR too many subscriptions open (at most ${maxSubscriptions})`, 503);
    }
    const conn = connect(undefined);
    let end = () => conn.disconnect();
    streams.add(end);
    try {
      await conn.connect();
      const count = await conn[kind](name);
      const encoder = new TextEncoder();
      const body = new ReadableStream<Uint8Array>({
        start(controller) {
          const send = (text: string) => controller.enqueue(encoder.encode(text));
          const heartbeat = setInterval(() => send(": ping\n\n"), heartbeatMs);
          streams.delete(end);
          end = () => {
            if (!streams.delete(end)) return;
            clearInterval(heartbeat);
            conn.disconnect();
            try {
              controller.close();
            } catch { /* the client went first */ }
          };
          streams.add(end);
          send(`data: ${kind},${name},${count}\n\n`);
          conn.on("message", (channel: string, message: string) => {
            send(`data: message,${channel},${message}\n\n`);
          });
          conn.on("pmessage", (pattern: string, channel: string, message: string) => {
            send(`data: pmessage,${pattern},${channel},${message}\n\n`);
          });
          conn.on("end", () => end());
          signal.addEventListener("abort", () => end());
        },
        cancel: () => end(),
      });
      return new Response(body, {
        headers: {
          "content-type": "text/event-stream",
          "cache-control": "no-cache",
          ...CORS,
        },
      });
    } catch (error) {
      end();
      streams.delete(end);
      throw error;
    }
  }

  function authorized(request: Request, url: URL): boolean {
    const header = request.headers.get("authorization");
    const given = Buffer.from(
      header !== null ? header.replace(/^Bearer /, "") : url.searchParams.get("_token") ?? "",
    );
    if (header !== null && !header.startsWith("Bearer ")) return false;
    return given.length === expected.length && timingSafeEqual(given, expected);
  }

  async function handle(request: Request): Promise<Response> {
    const url = new URL(request.url);
    const path = url.pathname.replace(/\/+$/, "") || "/";
    if (request.method === "OPTIONS") return preflight(request);
    if (path === "/healthz" && request.method === "GET") {
      const ok = await pick().ping().then(() => true, () => false);
      return json(ok ? 200 : 503, { ok });
    }
    if (!authorized(request, url)) return json(401, { error: "Unauthorized" });
    if (path === "/__stats" && request.method === "GET") return json(200, { ...stats });
    const sub = /^\/(p?subscribe)\/(.+)$/.exec(url.pathname);
    if (sub && (request.method === "POST" || request.method === "GET")) {
      stats.requests++;
      await request.body?.cancel();
      try {
        return await subscribe(sub[1] as Kind, decodeURIComponent(sub[2]!), request.signal);
      } catch (error) {
        if (error instanceof BadRequest) return json(error.status, { error: error.message });
        return json(500, { error: "ERR bridge: the subscription could not start" });
      }
    }
    const batch = path === "/pipeline" || path === "/multi-exec";
    if (batch || path === "/") {
      if (request.method !== "POST") return json(405, { error: "Use POST" });
    } else if (request.method !== "POST" && request.method !== "GET") {
      return json(405, { error: "Use GET or POST" });
    }
    stats.requests++;
    const base64 = request.headers.get("upstash-encoding") === "base64";
    const encode = (slot: Slot): Slot =>
      "result" in slot ? { result: toJson(slot.result, base64) } : slot;
    try {
      if (!batch) {
        const command = path === "/"
          ? parseCommand(await readJson(request))
          : await fromPath(request, url);
        stats.commands++;
        const slot = encode(
          isBlocking(command)
            ? await block((conn) => runOne(conn, command))
            : await runOne(pick(), command),
        );
        return json("error" in slot ? 400 : 200, slot);
      }
      const commands = parseBatch(await readJson(request));
      stats.commands += commands.length;
      if (path === "/pipeline") {
        const slots = cluster
          ? await Promise.all(commands.map((command) => runOne(cluster, command)))
          : commands.some(isBlocking)
          ? await block((conn) => runPipeline(conn, commands))
          : await runPipeline(shared[next++ % shared.length]!, commands);
        return json(200, slots.map(encode));
      }
      const slots = cluster
        ? await runTransaction(cluster, commands)
        : await exclusive.use((conn) => runTransaction(conn, commands));
      return Array.isArray(slots) ? json(200, slots.map(encode)) : json(400, slots);
    } catch (error) {
      if (error instanceof BadRequest) return json(error.status, { error: error.message });
      return json(500, { error: `ERR bridge: ${(error as Error).message}` });
    }
  }

  function json(status: number, body: unknown): Response {
    return new Response(JSON.stringify(body), {
      status,
      headers: {
        "content-type": "application/json",
        "upstash-sync-token": String(++syncToken),
        ...CORS,
      },
    });
  }

  const server = Deno.serve({ port, hostname, onListen() {} }, handle);
  let closing: Promise<void> | undefined;
  const actualPort = server.addr.port;
  const disconnect = () => {
    [...all, ...blocking].forEach((conn) => conn.disconnect());
    cluster?.disconnect();
  };
  return {
    url: `http://${hostname}:${actualPort}`,
    port: actualPort,
    stats: () => ({ ...stats }),
    // Stop accepting; let in-flight requests finish for the grace, then cut their connections
    // (they answer 500) so a stuck command never holds the shutdown.
    close() {
      closing ??= (async () => {
        const done = server.shutdown();
        [...streams].forEach((end) => end()); // a stream never finishes by itself
        let timer: ReturnType<typeof setTimeout> | undefined;
        const late = new Promise<void>((resolve) => timer = setTimeout(resolve, shutdownGraceMs));
        await Promise.race([done, late]);
        clearTimeout(timer);
        disconnect();
        await done;
      })();
      return closing;
    },
  };
}

const CORS = {
  "access-control-allow-origin": "*",
  "access-control-expose-headers": "upstash-sync-token",
};

// A browser's CORS preflight: any origin may call with a token (the token is the access control).
function preflight(request: Request): Response {
  return new Response(null, {
    status: 204,
    headers: {
      ...CORS,
      "access-control-allow-methods": "GET, POST, OPTIONS",
      "access-control-allow-headers": request.headers.get("access-control-request-headers") ??
        "authorization, content-type, upstash-encoding",
      "access-control-max-age": "86400",
    },
  });
}

// The REST docs' form: `/set/foo/bar?EX=100` is SET foo bar EX 100; a POST body is the last
// argument (`curl -X POST -d value …/set/foo`).
async function fromPath(request: Request, url: URL): Promise<Command> {
  const parts = url.pathname.split("/").filter(Boolean).map((part) => {
    try {
      return decodeURIComponent(part);
    } catch {
      throw new BadRequest("ERR the path is not valid percent-encoding");
    }
  });
  const args: string[] = parts.slice(1);
  for (const [key, value] of url.searchParams) {
    if (key !== "_token") args.push(key, ...(value === "" ? [] : [value]));
  }
  if (request.method === "POST") {
    const body = new TextDecoder().decode(await readBody(request));
    if (body !== "") args.push(body);
  }
  return [parts[0]!, ...args];
}

// The body, refused past MAX_BODY_BYTES bytes (not characters) without reading it all.
async function readBody(request: Request): Promise<Uint8Array> {
  const declared = Number(request.headers.get("content-length") ?? 0);
  if (declared > MAX_BODY_BYTES) {
    await request.body?.cancel();
    throw new BadRequest("ERR request body too large", 413);
  }
  const chunks: Uint8Array[] = [];
  let size = 0;
  for await (const chunk of request.body ?? []) {
    size += chunk.byteLength;
    if (size > MAX_BODY_BYTES) throw new BadRequest("ERR request body too large", 413);
    chunks.push(chunk);
  }
  const body = new Uint8Array(size);
  let at = 0;
  for (const chunk of chunks) body.set(chunk, (at += chunk.byteLength) - chunk.byteLength);
  return body;
}

async function readJson(request: Request): Promise<unknown> {
  const text = new TextDecoder().decode(await readBody(request));
  try {
    return JSON.parse(text);
  } catch {
    throw new BadRequest("ERR request body is not valid JSON");
  }
}

function parseCommand(value: unknown): Command {
  if (
    !Array.isArray(value) || value.length === 0 || typeof value[0] !== "string" ||
    !value.every((arg) => arg === null || ["string", "number", "boolean"].includes(typeof arg))
  ) {
    throw new BadRequest(
      "ERR a command is a non-empty JSON array of strings, numbers and booleans",
    );
  }
  return value as Command;
}

function parseBatch(value: unknown): Command[] {
  if (!Array.isArray(value) || value.length === 0) {
    throw new BadRequest("ERR a batch is a non-empty JSON array of commands");
  }
  return value.map(parseCommand);
}

// ioredis reshapes some replies by lower-case command name (HGETALL into an object); an upper-case
// name passes every reply through raw, as RESP2 gave it.
function toArgs([name, ...args]: Command): [string, string[]] {
  // Numbers keep their JSON text; booleans and null become the text the client expects back.
  return [name.toUpperCase(), args.map((arg) => String(arg))];
}

function rejection(name: string, args: string[] = []): string | undefined {
  const lower = name.toLowerCase();
  if (lower === "client" && !CLIENT_READS.has(String(args[0] ?? "").toLowerCase())) {
    return `ERR command 'CLIENT ${
      args[0] ?? ""
    }' is not supported over REST (it changes the connection)`;
  }
  return REJECTED.has(lower) ? `ERR command '${name}' is not supported over REST` : undefined;
}

// A connection of the pool, or the cluster client (which routes each command by its keys' slot).
type Connection = IORedis | Cluster;

function untilReady(cluster: Cluster): Promise<void> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("not ready within 10 s")), 10_000);
    cluster.once("ready", () => (clearTimeout(timer), resolve()));
  });
}

async function runOne(conn: Connection, command: Command): Promise<Slot> {
  const [name, args] = toArgs(command);
  const rejected = rejection(name, args);
  if (rejected) return { error: rejected };
  try {
    return { result: await conn.callBuffer(name, ...args) };
  } catch (error) {
    return { error: redisError(error) };
  }
}

async function runPipeline(conn: IORedis, commands: Command[]): Promise<Slot[]> {
  const pipeline = conn.pipeline();
  const slots: (Slot | undefined)[] = commands.map((command) => {
    const [name, args] = toArgs(command);
    const rejected = rejection(name, args);
    if (!rejected) pipeline.callBuffer(name, ...args);
    return rejected ? { error: rejected } : undefined;
  });
  const replies = pipeline.length > 0 ? (await pipeline.exec()) ?? [] : [];
  let i = 0;
  return slots.map((slot) => slot ?? fromReply(replies[i++]));
}

async function runTransaction(conn: Connection, commands: Command[]): Promise<Slot[] | Slot> {
  for (const command of commands) {
    const rejected = rejection(...toArgs(command));
    if (rejected) return { error: rejected };
  }
  const multi = conn.multi();
  for (const command of commands) {
    const [name, args] = toArgs(command);
    multi.callBuffer(name, ...args);
  }
  try {
    const replies = await multi.exec();
    if (replies === null) return { error: "EXECABORT Transaction discarded" };
    return replies.map(fromReply);
  } catch (error) {
    return { error: redisError(error) };
  }
}

function fromReply(reply: [Error | null, unknown] | undefined): Slot {
  if (!reply) return { error: "ERR no reply" };
  return reply[0] ? { error: redisError(reply[0]) } : { result: reply[1] };
}

function redisError(error: unknown): string {
  if (error instanceof Error && error.name === "ReplyError") return error.message;
  throw error; // not Redis answering: a transport failure, reported as the whole request failing
}

/** RESP2 reply (as ioredis gives it with buffers) → the JSON the Upstash client expects. */
function toJson(value: unknown, base64: boolean): unknown {
  if (value === null || value === undefined) return null;
  if (typeof value === "number") return value;
  if (Buffer.isBuffer(value)) return base64 ? value.toString("base64") : value.toString("utf8");
  if (typeof value === "string") return base64 ? Buffer.from(value).toString("base64") : value;
  if (Array.isArray(value)) return value.map((item) => toJson(item, base64));
  if (value instanceof Error) return toJson(value.message, base64);
  return String(value);
}

/** Connections lent to one transaction at a time, so MULTI … EXEC never interleaves. */
class ExclusivePool {
  #idle: IORedis[];
  #waiting: ((conn: IORedis) => void)[] = [];

  constructor(readonly connections: IORedis[]) {
    this.#idle = [...connections];
  }

  async use<T>(fn: (conn: IORedis) => Promise<T>): Promise<T> {
    const conn = this.#idle.pop() ??
      await new Promise<IORedis>((resolve) => this.#waiting.push(resolve));
    try {
      return await fn(conn);
    } finally {
      const waiter = this.#waiting.shift();
      if (waiter) waiter(conn);
      else this.#idle.push(conn);
    }
  }
}

if (import.meta.main) {
  const flags = cli(
    "edgelock bridge",
    "deno task bridge [flags]   (env: UPSTASH_REDIS_REST_TOKEN, the token clients present)",
    {
      port: { type: "number", default: 8079, min: 0, max: 65535, help: "port, 0 for a free one" },
      redis: { type: "string", default: "redis://127.0.0.1:6379", help: "the redis-server" },
      "grace-ms": {
        type: "number",
        default: 5000,
        min: 0,
        max: 600_000,
        help: "on SIGTERM, how long in-flight requests may finish",
      },
    },
  );
  // A Redis Cluster instead, from its seed nodes: REDIS_CLUSTER_URLS=redis://h:p,redis://h:p
  const clusterUrls = Deno.env.get("REDIS_CLUSTER_URLS")?.split(",").filter(Boolean);
  const token = Deno.env.get("UPSTASH_REDIS_REST_TOKEN");
  if (!token) {
    console.error(
      "edgelock bridge: set UPSTASH_REDIS_REST_TOKEN to the token clients must present",
    );
    Deno.exit(2);
  }
  try {
    const bridge = await startBridge({
      redisUrl: flags.redis,
      token,
      port: flags.port,
      shutdownGraceMs: flags["grace-ms"],
      ...(clusterUrls?.length && { clusterUrls }),
    });
    const front = clusterUrls?.length ? `the Redis Cluster at ${clusterUrls}` : flags.redis;
    console.log(`Upstash REST bridge on ${bridge.url} in front of ${front}`);
    const stop = async () => {
      await bridge.close();
      Deno.exit(0);
    };
    Deno.addSignalListener("SIGINT", stop);
    Deno.addSignalListener("SIGTERM", stop);
  } catch (error) {
    const inUse = error instanceof Deno.errors.AddrInUse;
    console.error(
      `edgelock bridge: ${
        inUse
          ? `port ${flags.port} is in use; choose another with --port`
          : (error as Error).message
      }`,
    );
    Deno.exit(1);
  }
}
