/**
 * A server speaking the Upstash Redis REST protocol in front of a real redis-server, Valkey or
 * Redis Cluster, so the unmodified `@upstash/redis` client works against Redis you host: in tests,
 * locally, and in production (`deno task bridge`, configured by env: the README's "Running the
 * bridge in production"). Wire details: `shared/UPSTASH_REST.md`.
 *
 * @module
 */
import { Buffer } from "node:buffer";
import { timingSafeEqual } from "node:crypto";
import { Cluster, Redis as IORedis } from "ioredis";
import { cli } from "./_cli.ts";
import { BridgeMetrics, type RequestRecord } from "./_bridge_metrics.ts";
import { KeyLocking, keySpecs, type Prepared } from "./_key_locking.ts";

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
  /** The Bearer token clients must present: it may run every command the bridge allows. */
  token: string;
  /**
   * A second token that may only read, as Upstash's read-only token: commands Redis flags
   * `readonly` (GET, EVAL_RO, XREAD…) or that touch no data (PING, TIME), and subscriptions;
   * anything that writes, publishes, runs a script that may write, or administers is refused.
   */
  readonlyToken?: string;
  /** TLS: the certificate chain and private key, PEM. Both, or neither (plain HTTP). */
  cert?: string;
  key?: string;
  /** Called once per request after its reply (a stream: when it starts). No keys, no arguments. */
  log?: (entry: RequestLog) => void;
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
  /**
   * Scripts flagged `allow-key-locking` are always accepted, as on Upstash (the flag is taken off
   * before Redis sees it). Strict, a flagged script that touches a key it did not pass in `KEYS` is
   * refused, as Upstash refuses it. @default false
   */
  strictKeyLocking?: boolean;
  /**
   * `false` runs blocking commands on the shared pool, as the bridge once did, so they stall it:
   * only for the soak's `--broken blocking` check, which must see the stall. @default true
   */
  isolateBlocking?: boolean;
  /** `/subscribe` and `/psubscribe` streams open at once, each on a connection of its own. @default 1024 */
  maxSubscriptions?: number;
  /** A comment line on every open stream this often, so dead clients are found, ms. @default 15000 */
  heartbeatMs?: number;
}

/** One line of the request log. */
export interface RequestLog extends RequestRecord {
  time: string;
  method: string;
  /** The first command's name, lower-case (no arguments: they may be secrets). */
  command?: string;
  role?: Role;
}

/** What a token may do. */
export type Role = "readwrite" | "readonly";

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
type Seen = { route: string; commands: number; errors: number; command?: string; role?: Role };

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
  const isolate = options.isolateBlocking === false ? () => false : isBlocking;
  if (!token) throw new TypeError("The bridge needs a token (UPSTASH_REDIS_REST_TOKEN)");
  if (options.readonlyToken === token) {
    throw new TypeError("The read-only token must differ from the read-write token");
  }
  if (!options.cert !== !options.key) {
    throw new TypeError(
      "TLS needs both a certificate and its key (BRIDGE_TLS_CERT, BRIDGE_TLS_KEY)",
    );
  }
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
  async function subscribe(kind: Kind, name: string, done: Promise<void>): Promise<Response> {
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
          done.finally(() => end()).catch(() => {}); // the client went away
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

  const tokens: [Buffer, Role][] = [[Buffer.from(token), "readwrite"]];
  if (options.readonlyToken) tokens.push([Buffer.from(options.readonlyToken), "readonly"]);
  const readOnly = options.readonlyToken ? await readOnlyPolicy(pick()) : rejection;
  const keyLocking = new KeyLocking(
    options.strictKeyLocking ? keySpecs(await pick().call("COMMAND") as unknown[][]) : undefined,
  );
  function roleOf(request: Request, url: URL): Role | undefined {
    const header = request.headers.get("authorization");
    if (header !== null && !header.startsWith("Bearer ")) return undefined;
    const given = Buffer.from(
      header !== null ? header.slice("Bearer ".length) : url.searchParams.get("_token") ?? "",
    );
    // Every token is compared, in constant time, whichever matches.
    let role: Role | undefined;
    for (const [expected, which] of tokens) {
      if (given.length === expected.length && timingSafeEqual(given, expected)) role = which;
    }
    return role;
  }

  // Each request is timed, counted in the metrics, and logged (its route, first command's name and
  // status: never a key or an argument).
  const metrics = new BridgeMetrics();
  let sharedInFlight = 0;
  async function handle(request: Request, info: Deno.ServeHandlerInfo): Promise<Response> {
    const started = performance.now();
    const seen: Seen = { route: "", commands: 0, errors: 0 };
    const response = await dispatch(request, info, seen);
    if (seen.route) {
      const record = {
        route: seen.route,
        status: response.status,
        seconds: (performance.now() - started) / 1000,
        commands: seen.commands,
        errors: seen.errors,
      };
      metrics.record(record);
      options.log?.({
        time: new Date().toISOString(),
        method: request.method,
        ...record,
        ...(seen.command && { command: seen.command }),
        ...(seen.role && { role: seen.role }),
      });
    }
    return response;
  }

  async function dispatch(
    request: Request,
    info: Deno.ServeHandlerInfo,
    seen: Seen,
  ): Promise<Response> {
    const url = new URL(request.url);
    const path = url.pathname.replace(/\/+$/, "") || "/";
    if (request.method === "OPTIONS") return preflight(request);
    if (path === "/healthz" && request.method === "GET") {
      const ok = await pick().ping().then(() => true, () => false);
      return json(ok ? 200 : 503, { ok });
    }
    if (path === "/metrics" && request.method === "GET") {
      return new Response(
        metrics.text({
          shared: { in_use: sharedInFlight, size: shared.length },
          transaction: { in_use: exclusive.busy, size: exclusive.connections.length },
          blocking: { in_use: blocking.size, size: maxBlocking },
          subscription: { in_use: streams.size, size: maxSubscriptions },
        }),
        { headers: { "content-type": "text/plain; version=0.0.4" } },
      );
    }
    const sub = /^\/(p?subscribe)\/(.+)$/.exec(url.pathname);
    const batch = path === "/pipeline" || path === "/multi-exec";
    seen.route = sub ? sub[1]! : batch ? path.slice(1) : path === "/" ? "command" : "path";
    const role = roleOf(request, url);
    if (!role) return json(401, { error: "Unauthorized" });
    seen.role = role;
    if (path === "/__stats" && request.method === "GET") return json(200, { ...stats });
    const refuse = role === "readonly" ? readOnly : rejection;
    const prepare: Prepare = (command) => {
      const [name, args] = toArgs(command);
      const refused = refuse(name, args);
      return refused ? { error: refused } : keyLocking.prepare(name, args);
    };
    if (sub && (request.method === "POST" || request.method === "GET")) {
      stats.requests++;
      await request.body?.cancel();
      try {
        return await subscribe(sub[1] as Kind, decodeURIComponent(sub[2]!), info.completed);
      } catch (error) {
        if (error instanceof BadRequest) return json(error.status, { error: error.message });
        return json(500, { error: "ERR bridge: the subscription could not start" });
      }
    }
    if (batch || path === "/") {
      if (request.method !== "POST") return json(405, { error: "Use POST" });
    } else if (request.method !== "POST" && request.method !== "GET") {
      return json(405, { error: "Use GET or POST" });
    }
    stats.requests++;
    const base64 = request.headers.get("upstash-encoding") === "base64";
    const encode = (slot: Slot): Slot => {
      if ("error" in slot) seen.errors++;
      return "result" in slot ? { result: toJson(slot.result, base64) } : slot;
    };
    const shareOne = async <T>(fn: (conn: Connection) => Promise<T>): Promise<T> => {
      sharedInFlight++;
      try {
        return await fn(pick());
      } finally {
        sharedInFlight--;
      }
    };
    try {
      if (!batch) {
        const command = path === "/"
          ? parseCommand(await readJson(request))
          : await fromPath(request, url);
        stats.commands++;
        seen.commands = 1;
        seen.command = command[0].toLowerCase();
        const slot = encode(
          isolate(command)
            ? await block((conn) => runOne(conn, command, prepare))
            : await shareOne((conn) => runOne(conn, command, prepare)),
        );
        return json("error" in slot ? 400 : 200, slot);
      }
      const commands = parseBatch(await readJson(request));
      stats.commands += commands.length;
      seen.commands = commands.length;
      seen.command = commands[0]![0].toLowerCase();
      if (path === "/pipeline") {
        const slots = cluster
          ? await Promise.all(commands.map((command) => runOne(cluster, command, prepare)))
          : commands.some(isolate)
          ? await block((conn) => runPipeline(conn, commands, prepare))
          : await shareOne((conn) => runPipeline(conn as IORedis, commands, prepare));
        return json(200, slots.map(encode));
      }
      const slots = cluster
        ? await runTransaction(cluster, commands, prepare)
        : await exclusive.use((conn) => runTransaction(conn, commands, prepare));
      return Array.isArray(slots) ? json(200, slots.map(encode)) : json(400, encode(slots));
    } catch (error) {
      seen.errors = Math.max(seen.errors, 1);
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

  const tls = options.cert && options.key ? { cert: options.cert, key: options.key } : {};
  const server = Deno.serve({ port, hostname, onListen() {}, ...tls }, handle);
  let closing: Promise<void> | undefined;
  const actualPort = server.addr.port;
  const disconnect = () => {
    [...all, ...blocking].forEach((conn) => conn.disconnect());
    cluster?.disconnect();
  };
  return {
    url: `${options.cert ? "https" : "http"}://${hostname}:${actualPort}`,
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

type Refuse = (name: string, args: string[]) => string | undefined;

// Which commands a read-only token may run, from Redis's own command table (`COMMAND`): those
// flagged `readonly`, and those in no category that writes, publishes, scripts or administers.
// A subcommand (`SCRIPT LOAD`, `CLIENT KILL`) is judged as itself.
async function readOnlyPolicy(conn: Connection): Promise<Refuse> {
  const unsafe = ["@write", "@admin", "@dangerous", "@scripting", "@pubsub"];
  const allowed = new Set<string>();
  const containers = new Set<string>();
  const judge = (entry: unknown[]): void => {
    const name = String(entry[0]).toLowerCase();
    const flags = entry[2] as string[];
    const categories = (entry[6] ?? []) as string[];
    const subcommands = entry[9];
    if (Array.isArray(subcommands) && subcommands.length > 0) {
      containers.add(name);
      subcommands.forEach((sub) => judge(sub as unknown[]));
    } else if (flags.includes("readonly") || !categories.some((c) => unsafe.includes(c))) {
      allowed.add(name);
    }
  };
  (await conn.call("COMMAND") as unknown[][]).forEach(judge);
  return (name, args) => {
    const lower = name.toLowerCase();
    const full = containers.has(lower) ? `${lower}|${String(args[0] ?? "").toLowerCase()}` : lower;
    if (allowed.has(full)) return rejection(name, args);
    return `NOPERM this token is read-only: '${full.replace("|", " ")}' may write or administer`;
  };
}

// A connection of the pool, or the cluster client (which routes each command by its keys' slot).
type Connection = IORedis | Cluster;

function untilReady(cluster: Cluster): Promise<void> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("not ready within 10 s")), 10_000);
    cluster.once("ready", () => (clearTimeout(timer), resolve()));
  });
}

// A command as Redis will get it, or the reason it is refused.
type Prepare = (command: Command) => Prepared | { error: string };

async function runOne(conn: Connection, command: Command, prepare: Prepare): Promise<Slot> {
  const prepared = prepare(command);
  if ("error" in prepared) return prepared;
  try {
    return fixed(prepared, { result: await conn.callBuffer(prepared.name, ...prepared.args) });
  } catch (error) {
    return { error: redisError(error) };
  }
}

async function runPipeline(conn: IORedis, commands: Command[], prepare: Prepare): Promise<Slot[]> {
  const pipeline = conn.pipeline();
  const all = commands.map(prepare);
  for (const prepared of all) {
    if (!("error" in prepared)) pipeline.callBuffer(prepared.name, ...prepared.args);
  }
  const replies = pipeline.length > 0 ? (await pipeline.exec()) ?? [] : [];
  let i = 0;
  return all.map((prepared) =>
    "error" in prepared ? prepared : fixed(prepared, fromReply(replies[i++]))
  );
}

async function runTransaction(
  conn: Connection,
  commands: Command[],
  prepare: Prepare,
): Promise<Slot[] | Slot> {
  const all = commands.map(prepare);
  const refused = all.find((prepared) => "error" in prepared);
  if (refused) return refused as { error: string };
  const multi = conn.multi();
  for (const prepared of all as Prepared[]) multi.callBuffer(prepared.name, ...prepared.args);
  try {
    const replies = await multi.exec();
    if (replies === null) return { error: "EXECABORT Transaction discarded" };
    return replies.map((reply, i) => fixed(all[i] as Prepared, fromReply(reply)));
  } catch (error) {
    return { error: redisError(error) };
  }
}

function fixed({ fix }: Prepared, slot: Slot): Slot {
  return fix && "result" in slot ? { result: fix(slot.result) } : slot;
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

  get busy(): number {
    return this.connections.length - this.#idle.length;
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

type Env = (name: string) => string | undefined;

/**
 * The bridge's options from its environment (the production way to run it); a missing or bad
 * value throws a `TypeError` or `RangeError` naming the variable.
 */
export async function bridgeOptionsFromEnv(env: Env): Promise<BridgeOptions> {
  const get = (name: string) => env(name) || undefined;
  const int = (name: string, min: number, max: number): number | undefined => {
    const text = get(name);
    if (text === undefined) return undefined;
    const value = Number(text);
    if (!/^\d+$/.test(text) || value < min || value > max) {
      throw new RangeError(`${name} must be a whole number from ${min} to ${max}, not "${text}"`);
    }
    return value;
  };
  const token = get("UPSTASH_REDIS_REST_TOKEN");
  if (!token) throw new TypeError("set UPSTASH_REDIS_REST_TOKEN to the token clients must present");
  const [certFile, keyFile] = [get("BRIDGE_TLS_CERT"), get("BRIDGE_TLS_KEY")];
  if (!certFile !== !keyFile) {
    throw new TypeError("set both BRIDGE_TLS_CERT and BRIDGE_TLS_KEY (PEM files), or neither");
  }
  const read = async (name: string, file: string) => {
    try {
      return await Deno.readTextFile(file);
    } catch (error) {
      throw new TypeError(`${name}: cannot read ${file} (${(error as Error).message})`);
    }
  };
  const keyLocking = get("BRIDGE_KEY_LOCKING") ?? "accept";
  if (keyLocking !== "accept" && keyLocking !== "strict") {
    throw new TypeError(`BRIDGE_KEY_LOCKING must be accept or strict, not "${keyLocking}"`);
  }
  const log = get("BRIDGE_LOG") ?? "json";
  if (log !== "json" && log !== "off") {
    throw new TypeError(`BRIDGE_LOG must be json or off, not "${log}"`);
  }
  const clusterUrls = get("REDIS_CLUSTER_URLS")?.split(",").map((url) => url.trim()).filter(
    Boolean,
  );
  for (const url of [get("REDIS_URL"), ...(clusterUrls ?? [])]) {
    if (url !== undefined && !/^rediss?:\/\/[^\s]+$/.test(url)) {
      throw new TypeError(`a Redis URL must look like redis://host:port, not "${url}"`);
    }
  }
  const options: BridgeOptions = {
    redisUrl: get("REDIS_URL") ?? "redis://127.0.0.1:6379",
    token,
    hostname: get("BRIDGE_HOSTNAME") ?? "127.0.0.1",
    port: int("BRIDGE_PORT", 0, 65535) ?? 8079,
    poolSize: int("BRIDGE_POOL_SIZE", 1, 256) ?? 4,
    maxBlocking: int("BRIDGE_MAX_BLOCKING", 0, 10_000) ?? 16,
    commandTimeoutMs: int("BRIDGE_COMMAND_TIMEOUT_MS", 1, 3_600_000) ?? 30_000,
    shutdownGraceMs: int("BRIDGE_GRACE_MS", 0, 600_000) ?? 5000,
    ...(clusterUrls?.length && { clusterUrls }),
    ...(keyLocking === "strict" && { strictKeyLocking: true }),
    ...(get("UPSTASH_REDIS_REST_READONLY_TOKEN") &&
      { readonlyToken: get("UPSTASH_REDIS_REST_READONLY_TOKEN")! }),
    ...(certFile && keyFile &&
      {
        cert: await read("BRIDGE_TLS_CERT", certFile),
        key: await read("BRIDGE_TLS_KEY", keyFile),
      }),
    ...(log === "json" && { log: (entry: RequestLog) => console.log(JSON.stringify(entry)) }),
  };
  return options;
}

if (import.meta.main) {
  // Flags first (so --help and a bad flag need no env); a flag given overrides its variable.
  const flags = cli(
    "edgelock bridge",
    'deno task bridge [flags]   (configured by env: see the README\'s "Running the bridge")',
    {
      port: { type: "number", min: 0, max: 65535, help: "port, 0 for a free one (BRIDGE_PORT)" },
      hostname: { type: "string", help: "address (BRIDGE_HOSTNAME)" },
      redis: { type: "string", help: "the redis-server (REDIS_URL)" },
      "grace-ms": {
        type: "number",
        min: 0,
        max: 600_000,
        help: "on SIGTERM, how long in-flight requests may finish (BRIDGE_GRACE_MS)",
      },
    },
  );
  const overrides: Record<string, number | string | undefined> = {
    BRIDGE_PORT: flags.port,
    BRIDGE_HOSTNAME: flags.hostname,
    REDIS_URL: flags.redis,
    BRIDGE_GRACE_MS: flags["grace-ms"],
  };
  let fromEnv: BridgeOptions;
  try {
    fromEnv = await bridgeOptionsFromEnv((name) =>
      overrides[name]?.toString() ?? Deno.env.get(name)
    );
  } catch (error) {
    console.error(`edgelock bridge: ${(error as Error).message}`);
    Deno.exit(2);
  }
  try {
    const bridge = await startBridge(fromEnv);
    const front = fromEnv.clusterUrls
      ? `the Redis Cluster at ${fromEnv.clusterUrls}`
      : fromEnv.redisUrl;
    console.error(`Upstash REST bridge on ${bridge.url} in front of ${front}`);
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
          ? `port ${fromEnv.port} is in use; choose another with --port`
          : (error as Error).message
      }`,
    );
    Deno.exit(1);
  }
}
