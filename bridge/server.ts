// The bridge's HTTP server and its routes: `/` (one command), `/pipeline`, `/multi-exec`, the
// path-style form, `/subscribe` and `/psubscribe`, `/healthz`, `/metrics`. Each request is
// authorized by token, its commands checked against the policy, run with bounded replies, and
// logged without keys or arguments.
import { createHash, timingSafeEqual } from "node:crypto";
import { Cluster, Redis as IORedis } from "ioredis";
import { BridgeMetrics, type RequestRecord } from "./metrics.ts";
import { KeyLocking, keySpecs } from "./key_locking.ts";
import { refusal, type Role } from "./policy.ts";
import {
  BadRequest,
  type Command,
  cors,
  decodeSegment,
  fromPath,
  parseBatch,
  parseCommand,
  preflight,
  readJson,
  type Slot,
  toArgs,
  toJson,
} from "./protocol.ts";
import {
  ByteBudget,
  type Connection,
  ExclusivePool,
  isBlocking,
  type Prepare,
  runOne,
  runPipeline,
  runTransaction,
  untilReady,
} from "./commands.ts";
import { type Kind, Subscriptions } from "./subscriptions.ts";
import { type Front, startFront } from "./front.ts";
import { ScriptBudget } from "./scripts.ts";
import { connectionCap, restrictScripts } from "./redis_user.ts";

export type { Role };

/** Options for {@linkcode startBridge}; every limit has a default fit for production. */
export interface BridgeOptions {
  /** The redis-server to front, e.g. `redis://127.0.0.1:6379`. */
  redisUrl: string;
  /**
   * Front a Redis Cluster instead: its seed nodes' `redis://` URLs (`redisUrl` is then unused).
   * Each command goes to the node of its keys' slot; a pipeline's commands go one by one (so they
   * may span slots); a transaction's keys must share one slot, as in any cluster.
   */
  clusterUrls?: string[];
  /** The Bearer token clients must present: it may run every data command (`./policy.ts`). */
  token: string;
  /**
   * A second token that may only read, as Upstash's read-only token: the policy's `read`
   * commands (GET, EVAL_RO, XREAD…, PING, TIME) and subscriptions.
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
   * A request with a script still unanswered after this long has the running script killed
   * (`SCRIPT KILL`), so one script cannot keep Redis busy for everyone; one that wrote before it
   * hung cannot be killed (Redis answers UNKILLABLE). @default 5000
   */
  scriptTimeoutMs?: number;
  /**
   * Scripts flagged `allow-key-locking` are always accepted, as on Upstash (the flag is taken off
   * before Redis sees it). Strict, a flagged script whose `redis.call` touches a key it did not
   * pass in `KEYS` is refused, as Upstash refuses it: a check of the script as written (a lint),
   * not a boundary (a script can reach `redis.call` by other names). @default false
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
  /** The largest request body, bytes. @default 1048576 (1 MiB) */
  maxBodyBytes?: number;
  /** The most commands in one `/pipeline` or `/multi-exec`. @default 1000 */
  maxCommands?: number;
  /** The most reply bytes one request may hold; past it the request fails (413). @default 4194304 */
  maxReplyBytes?: number;
  /**
   * The most bytes all requests together may hold, their bodies (four times, for their parsed
   * form) and replies; past it a request fails (503). @default 33554432
   */
  maxBytesInFlight?: number;
  /**
   * The most distinct scripts the read-write token may add to Redis's script cache (which Redis
   * 7.0 never evicts) through EVAL, EVAL_RO and SCRIPT LOAD, the read-only token a tenth of it; a
   * new one past it is refused. A script counts once Redis has it (not when it did not compile).
   * @default 1000
   */
  maxScripts?: number;
  /** The most bytes of script the tokens may add to the cache, all together. @default 16777216 */
  maxScriptBytes?: number;
  /** Client connections open at once; strangers (no whole request yet) go first. @default 256 */
  maxConnections?: number;
  /** A request head must arrive whole within this long of its first byte, ms. @default 10000 */
  headerTimeoutMs?: number;
  /** A connection with nothing in flight and no byte either way this long is closed, ms. @default 60000 */
  idleTimeoutMs?: number;
  /** Origins a browser may call from (CORS); `*` for any. @default ["*"] */
  corsOrigins?: string[];
  /**
   * The Redis user the bridge's data connections use. `restricted` (the default): when the
   * configured user could administer Redis from a script, the bridge makes a user of its own that
   * may not (BRIDGE_ACL_RULES) and connects as it, or refuses to start. `as-configured`: the user
   * in the URL, whatever it may do.
   */
  scriptUser?: "restricted" | "as-configured";
  /**
   * Refused commands this bridge runs anyway for the read-write token, as `name|subcommand` (e.g.
   * `script|flush`): for tests that inject faults through the bridge, never for production.
   */
  extraCommands?: string[];
}

/** One line of the request log. */
export interface RequestLog extends RequestRecord {
  time: string;
  method: string;
  /** The first command's name, lower-case (no arguments: they may be secrets). */
  command?: string;
  role?: Role;
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

type Seen = { route: string; commands: number; errors: number; command?: string; role?: Role };

/** Starts a bridge; resolves once it is connected to Redis and listening. */
export async function startBridge(options: BridgeOptions): Promise<Bridge> {
  const { redisUrl, token, port = 8079, hostname = "127.0.0.1" } = options;
  const { maxBlocking = 16, commandTimeoutMs = 30_000, shutdownGraceMs = 5000 } = options;
  const { maxBodyBytes = 1 << 20, maxCommands = 1000, maxScripts = 1000 } = options;
  const { maxScriptBytes = 16 << 20 } = options;
  const origins = options.corsOrigins ?? ["*"];
  const extra = new Set(options.extraCommands ?? []);
  const budget = new ByteBudget(
    options.maxReplyBytes ?? 4 << 20,
    options.maxBytesInFlight ?? 32 << 20,
  );
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
  // Scripts run as the bridge's Redis user: one that may administer would let any EVAL do it.
  const scriptUser = fronts(options)
    ? undefined
    : await restrictScripts(redisUrl, options.scriptUser);
  const dataUrl = scriptUser?.url ?? redisUrl;
  // Blocking commands' connections take no command timeout: the bridge times them and drops them.
  // On a cluster, a subscription's connection goes to the first seed: PUBLISH reaches every node.
  const connect = (commandTimeout: number | undefined = commandTimeoutMs) => {
    const conn = new IORedis(options.clusterUrls?.[0] ?? dataUrl, {
      lazyConnect: true,
      enableOfflineQueue: false,
      enableReadyCheck: false, // its INFO is not for the bridge's restricted user
      maxRetriesPerRequest: 0,
      retryStrategy: () => 100,
      ...(commandTimeout !== undefined && { commandTimeout }),
    });
    // Reported per request; ioredis reconnects by itself. A Redis that restarted without its ACL
    // refuses the bridge's own user: it is made again, and the next reconnect gets in.
    conn.on("error", (error: Error) => {
      if (/WRONGPASS|NOAUTH/.test(error.message)) scriptUser?.renew();
    });
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
    await scriptUser?.remove();
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
  // A connection of its own for SCRIPT KILL: the pool's may be waiting on the running script.
  const scriptTimeoutMs = options.scriptTimeoutMs ?? 5000;
  let killer: IORedis | undefined;
  const watchScripts = (commands: Command[]) => {
    if (cluster || !commands.some(([name]) => /^(eval|evalsha)(_ro)?$/i.test(name))) return;
    // Redis takes SCRIPT KILL once a script has run past its busy threshold (5 s by default).
    return setTimeout(() => {
      killer ??= connect(undefined);
      killer.connect().catch(() => {}).then(() => killer!.call("SCRIPT", "KILL")).catch(() => {});
    }, scriptTimeoutMs);
  };
  const subscriptions = new Subscriptions(
    options.maxSubscriptions ?? 1024,
    options.heartbeatMs ?? 15_000,
    () => connect(undefined),
  );

  // Tokens are compared as SHA-256 digests, in constant time, every one whichever matches: the
  // comparison reveals neither a token's length nor which token came close.
  const digest = (text: string) => createHash("sha256").update(text).digest();
  const tokens: [Uint8Array, Role][] = [[digest(token), "readwrite"]];
  if (options.readonlyToken) tokens.push([digest(options.readonlyToken), "readonly"]);
  const keyLocking = new KeyLocking(
    options.strictKeyLocking ? keySpecs(await pick().call("COMMAND") as unknown[][]) : undefined,
  );
  function roleOf(request: Request, url: URL): Role | undefined {
    const header = request.headers.get("authorization");
    if (header !== null && !header.startsWith("Bearer ")) return undefined;
    const given = digest(
      header !== null ? header.slice("Bearer ".length) : url.searchParams.get("_token") ?? "",
    );
    let role: Role | undefined;
    for (const [expected, which] of tokens) if (timingSafeEqual(given, expected)) role = which;
    return role;
  }

  const scriptCache = new ScriptBudget(maxScripts, maxScriptBytes);
  const prepareFor = (role: Role): Prepare => (command) => {
    const [name, args] = toArgs(command);
    const refused = refusal(role, name, args, role === "readwrite" ? extra : undefined);
    if (refused) return { error: refused };
    return scriptCache.admit(role, name, args, keyLocking.prepare(name, args));
  };

  // Each request is timed, counted in the metrics, and logged (its route, first command's name and
  // status: never a key or an argument).
  const metrics = new BridgeMetrics();
  let sharedInFlight = 0;
  async function handle(request: Request, info: Deno.ServeHandlerInfo<Deno.Addr>) {
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
    info: Deno.ServeHandlerInfo<Deno.Addr>,
    seen: Seen,
  ): Promise<Response> {
    const url = new URL(request.url);
    const path = url.pathname.replace(/\/+$/, "") || "/";
    const corsHeaders = cors(origins, request.headers.get("origin"));
    // A reply's bytes count against the bytes in flight until it has been sent (a client that
    // does not read holds them), JSON's escaping included.
    const share = budget.open();
    info.completed.finally(share.done).catch(() => {}); // what it held, once the reply is sent
    const json = (status: number, body: unknown): Response => {
      let text = JSON.stringify(body);
      try {
        share.hold(text.length);
      } catch (error) {
        status = (error as BadRequest).status;
        text = JSON.stringify({ error: (error as Error).message });
      }
      return new Response(text, {
        status,
        headers: {
          "content-type": "application/json",
          "upstash-sync-token": String(++syncToken),
          ...corsHeaders,
        },
      });
    };
    if (request.method === "OPTIONS") return preflight(request, origins);
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
          subscription: { in_use: subscriptions.open, size: subscriptions.max },
          connection: { in_use: front?.open() ?? 0, size: maxConnections },
          bytes_in_flight: { in_use: budget.used, size: budget.total },
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
    const prepare = prepareFor(role);
    let watchdog: ReturnType<typeof setTimeout> | undefined;
    try {
      if (sub && (request.method === "POST" || request.method === "GET")) {
        stats.requests++;
        await request.body?.cancel();
        // Subscribing only reads: either token may. A line break would forge events.
        const name = decodeSegment(sub[2]!);
        if (/[\r\n]/.test(name)) throw new BadRequest("ERR a channel name has no line breaks");
        return await subscriptions.stream(sub[1] as Kind, name, info.completed, corsHeaders);
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
      if (!batch) {
        const command: Command = path === "/"
          ? parseCommand(await readJson(request, maxBodyBytes, share.body))
          : await fromPath(request, url, maxBodyBytes, share.body);
        stats.commands++;
        seen.commands = 1;
        seen.command = command[0].toLowerCase();
        watchdog = watchScripts([command]);
        const slot = encode(
          isolate(command)
            ? await block((conn) => runOne(conn, command, prepare, share.take))
            : await shareOne((conn) => runOne(conn, command, prepare, share.take)),
        );
        return json("error" in slot ? 400 : 200, slot);
      }
      const commands = parseBatch(
        await readJson(request, maxBodyBytes, share.body),
        maxCommands,
      );
      stats.commands += commands.length;
      seen.commands = commands.length;
      seen.command = commands[0]![0].toLowerCase();
      watchdog = watchScripts(commands);
      if (path === "/pipeline") {
        const slots = cluster
          ? await Promise.all(
            commands.map((command) => runOne(cluster, command, prepare, share.take)),
          )
          : commands.some(isolate)
          ? await block((conn) => runPipeline(conn, commands, prepare, share.take))
          : await shareOne((conn) => runPipeline(conn as IORedis, commands, prepare, share.take));
        return json(200, slots.map(encode));
      }
      const slots = cluster
        ? await runTransaction(cluster, commands, prepare, share.take)
        : await exclusive.use((conn) => runTransaction(conn, commands, prepare, share.take));
      return Array.isArray(slots) ? json(200, slots.map(encode)) : json(400, encode(slots));
    } catch (error) {
      seen.errors = Math.max(seen.errors, 1);
      if (error instanceof BadRequest) return json(error.status, { error: error.message });
      return json(500, { error: "ERR bridge: Redis did not answer" });
    } finally {
      clearTimeout(watchdog);
    }
  }

  let closing: Promise<void> | undefined;
  // The front owns the client connections (timeouts, a cap); the HTTP server listens behind it
  // on a Unix socket in a directory of its own.
  const maxConnections = await connectionCap(options.maxConnections ?? 256, [
    maxBlocking,
    shared.length,
    exclusive.connections.length,
  ]);
  const socketDir = await Deno.makeTempDir({ prefix: "edgelock-bridge-" });
  const socket = `${socketDir}/http.sock`;
  // Should the HTTP server still fail (Deno's accept loop gives up on an error such as running
  // out of file descriptors), it starts again on the same socket: the bridge never exits for it.
  let server: Deno.HttpServer<Deno.UnixAddr>;
  const listen = (first = false) => {
    try {
      Deno.removeSync(socket);
    } catch { /* not there */ }
    try {
      server = Deno.serve({ path: socket, onListen() {} }, handle);
    } catch (error) {
      if (first) throw error;
      setTimeout(listen, 250); // out of descriptors still: try again shortly
      return;
    }
    server.finished.catch(() => {
      if (!closing) setTimeout(listen, 100);
    });
  };
  listen(true);
  let front: Front | undefined;
  try {
    front = startFront({
      hostname,
      port,
      ...(options.cert && options.key && { cert: options.cert, key: options.key }),
      target: socket,
      maxConnections,
      maxBodyBytes,
      headerTimeoutMs: options.headerTimeoutMs ?? 10_000,
      idleTimeoutMs: options.idleTimeoutMs ?? 60_000,
    });
  } catch (error) {
    await server!.shutdown();
    all.forEach((conn) => conn.disconnect());
    cluster?.disconnect();
    await Deno.remove(socketDir, { recursive: true }).catch(() => {});
    throw error;
  }
  const started = front;
  const disconnect = () => {
    [...all, ...blocking].forEach((conn) => conn.disconnect());
    killer?.disconnect();
    scriptUser?.remove();
    cluster?.disconnect();
  };
  return {
    url: `${options.cert ? "https" : "http"}://${hostname}:${started.port}`,
    port: started.port,
    stats: () => ({ ...stats }),
    // Stop accepting; let in-flight requests finish for the grace, then cut their connections
    // (they answer 500) so a stuck command never holds the shutdown.
    close() {
      closing ??= (async () => {
        await started.stop(); // no new connections; those open finish their requests
        subscriptions.endAll(); // a stream never finishes by itself
        const done = server!.shutdown();
        let timer: ReturnType<typeof setTimeout> | undefined;
        const late = new Promise<void>((resolve) => timer = setTimeout(resolve, shutdownGraceMs));
        await Promise.race([done, late]);
        clearTimeout(timer);
        disconnect();
        await done;
        await started.close();
        await Deno.remove(socketDir, { recursive: true }).catch(() => {});
      })();
      return closing;
    },
  };
}

// A Redis Cluster: the bridge does not make its restricted user there (docs/bridge.md).
function fronts(options: BridgeOptions): boolean {
  return (options.clusterUrls?.length ?? 0) > 0;
}
