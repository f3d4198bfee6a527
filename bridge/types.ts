// The bridge's public types: what `startBridge` takes (its options), what it logs of each request,
// and what it gives back (a running bridge, its stats).
import type { RequestRecord } from "./metrics.ts";
import type { Role } from "./policy.ts";

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
   * on a connection of its own, at most this many at once; one more is refused (edgelock's
   * waiters then poll). Each waiting acquire holds one. @default 256
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
