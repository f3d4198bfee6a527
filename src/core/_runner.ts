import { EdgelockError } from "./errors.ts";
import { connectFailure, type Diagnosis, failureText, redacted } from "./_failure.ts";
import type { Script, ScriptCall } from "./lua/_define.ts";
import { InvalidRange, InvalidType } from "./_invalid.ts";

export type { ScriptCall };

/**
 * The smallest part of an `@upstash/redis` client that edgelock needs (an `@upstash/redis` `Redis`
 * is one); `pipeline`, for batches in one request, is optional.
 */
export interface RedisLike {
  /** Runs a loaded script by its SHA-1; rejects with Redis's NOSCRIPT error when it is not loaded. */
  evalsha(sha1: string, keys: string[], args: unknown[]): Promise<unknown>;
  /** Runs a script from its source. */
  eval(script: string, keys: string[], args: unknown[]): Promise<unknown>;
  /** Starts a pipeline: commands sent together in one request. */
  pipeline?(): PipelineLike;
  /** Sends one command in a request of its own (`@upstash/redis`): waiters' `BLPOP`. */
  exec?(command: [string, ...string[]]): Promise<unknown>;
}

/** The part of an `@upstash/redis` pipeline that edgelock uses. */
export interface PipelineLike {
  /** Adds a script call by SHA-1. */
  evalsha(sha1: string, keys: string[], args: unknown[]): unknown;
  /** Adds a script call by source. */
  eval(script: string, keys: string[], args: unknown[]): unknown;
  /** Sends the commands; with `keepErrors` each result carries its own error. */
  exec(options: { keepErrors: true }): Promise<{ result: unknown; error?: string }[]>;
}

/** Checks that `redis` can run scripts; `what` (the class) names it in the error. */
export function checkRedis(redis: RedisLike, what: string): RedisLike {
  if (typeof redis?.evalsha !== "function" || typeof redis?.eval !== "function") {
    throw new InvalidType(`${what} needs a Redis client with evalsha and eval (@upstash/redis)`);
  }
  // @upstash/redis made without a URL or token (an unset variable) only warns, then fails calls;
  // an unset token is sent as "Bearer undefined".
  const client = (redis as {
    client?: { hasCredentials?: unknown; headers?: unknown; baseUrl?: unknown };
  }).client;
  const authorization = (client?.headers as { authorization?: unknown } | undefined)?.authorization;
  const noToken = typeof authorization === "string" &&
    /^Bearer (undefined|null)?$/.test(authorization);
  const missing = client?.hasCredentials === false && !client.baseUrl
    ? noToken ? "a URL or token" : "a URL"
    : client?.hasCredentials === false || noToken
    ? "a token"
    : undefined;
  if (missing) {
    throw new EdgelockError(
      "config_error",
      `${what} got an @upstash/redis client without ${missing}: set UPSTASH_REDIS_REST_URL ` +
        "and UPSTASH_REDIS_REST_TOKEN (Redis.fromEnv()), or pass { url, token }",
    );
  }
  return redis;
}

/** How long one Redis request may take before it counts as failed, by default. */
export const DEFAULT_REDIS_TIMEOUT_MS = 2000;

/** How a caller's scripts run: the deadline of one request, and Upstash's per-key locking. */
export interface RunOptions {
  timeoutMs: number;
  /** Send each script's `keyLocked` form (see {@linkcode keyLockingFor}). */
  keyLocking: boolean;
  /** Given the reply of a script that answered after `timeoutMs` (the call failed already). */
  onLate?: (reply: unknown) => void;
}

const DEFAULT_RUN: RunOptions = { timeoutMs: DEFAULT_REDIS_TIMEOUT_MS, keyLocking: false };

/**
 * Whether scripts opt into Upstash's per-key locking: `option` when given, else on for an
 * `@upstash/redis` client whose URL is an Upstash database (`*.upstash.io`), off for anything
 * else (a plain Redis refuses the flag).
 */
export function keyLockingFor(redis: RedisLike, option: unknown): boolean {
  if (option !== undefined) {
    if (typeof option !== "boolean") throw new InvalidType("keyLocking must be true or false");
    return option;
  }
  const url = (redis as { client?: { baseUrl?: unknown } }).client?.baseUrl;
  if (typeof url !== "string") return false;
  try {
    return /(^|\.)upstash\.io$/.test(new URL(url).hostname);
  } catch {
    return false;
  }
}

/**
 * Runs a script in one request: EVALSHA, and EVAL only when Redis answers NOSCRIPT (after a
 * restart, failover or SCRIPT FLUSH). A refused token becomes `config_error`; any other failure,
 * and no answer within `timeoutMs`, `backend_unavailable`.
 */
export async function runScript(
  redis: RedisLike,
  plain: Script,
  keys: string[],
  args: (string | number)[],
  { timeoutMs, keyLocking, onLate }: RunOptions = DEFAULT_RUN,
): Promise<unknown> {
  const script = keyLocking ? plain.keyLocked : plain;
  const sha1 = await script.sha1();
  const evalsha = () => deadline(redis.evalsha(sha1, keys, args), script, timeoutMs, onLate);
  try {
    return await evalsha();
  } catch (error) {
    if (!isNoScript(error)) throw await explained(redis, script, error);
  }
  // Calls that meet NOSCRIPT while another call's EVAL loads the script wait for it and run
  // EVALSHA again: a cold cache under a burst (a deploy, a failover, SCRIPT FLUSH) sends the
  // source once, not once per call in one auto-pipelined request too large to send.
  const loads = loading.get(redis) ?? new Map<string, Promise<unknown>>();
  loading.set(redis, loads);
  const pending = loads.get(sha1);
  if (pending) {
    await pending.catch(() => {});
    try {
      return await evalsha();
    } catch (error) {
      if (!isNoScript(error)) throw await explained(redis, script, error);
    }
  }
  const load = deadline(redis.eval(script.source, keys, args), script, timeoutMs, onLate);
  loads.set(sha1, load);
  try {
    return await load;
  } catch (error) {
    throw await explained(redis, script, error);
  } finally {
    if (loads.get(sha1) === load) loads.delete(sha1);
  }
}

// The scripts an EVAL is loading now, by client and SHA-1.
const loading = new WeakMap<RedisLike, Map<string, Promise<unknown>>>();

/**
 * Runs one script for each call in a single `/pipeline` request (each call atomic on its own,
 * so the keys of different calls may live in different cluster slots), in order: `plain`, or
 * the call's own `script`. Calls that Redis answers NOSCRIPT go again as EVAL in one more request
 * (after the others, then). Without `pipeline`, the calls run side by side.
 */
export async function runScripts(
  redis: RedisLike,
  plain: Script,
  calls: readonly (ScriptCall & { script?: Script })[],
  options: RunOptions = DEFAULT_RUN,
): Promise<unknown[]> {
  if (typeof redis.pipeline !== "function") {
    return Promise.all(
      calls.map(({ keys, args, script }) => runScript(redis, script ?? plain, keys, args, options)),
    );
  }
  const { timeoutMs } = options;
  const scripts = calls.map((call) => {
    const script = call.script ?? plain;
    return options.keyLocking ? script.keyLocked : script;
  });
  const sha1s = await Promise.all(scripts.map((script) => script.sha1()));
  const run = async (indexes: number[], evalsha: boolean) => {
    const pipeline = redis.pipeline!();
    for (const i of indexes) {
      const { keys, args } = calls[i]!;
      if (evalsha) pipeline.evalsha(sha1s[i]!, keys, args);
      else pipeline.eval(scripts[i]!.source, keys, args);
    }
    try {
      return await deadline(pipeline.exec({ keepErrors: true }), scripts[indexes[0]!]!, timeoutMs);
    } catch (error) {
      throw await explained(redis, scripts[indexes[0]!]!, error);
    }
  };
  const replies: unknown[] = new Array(calls.length);
  // Each reply into its place; the indexes that met NOSCRIPT are returned.
  const settle = (indexes: number[], results: { result: unknown; error?: string }[]) => {
    const missing: number[] = [];
    results.forEach(({ result, error }, j) => {
      if (error === undefined) replies[indexes[j]!] = result;
      else if (/^NOSCRIPT /.test(String(error))) missing.push(indexes[j]!);
      else throw unavailable(scripts[indexes[j]!]!, new Error(String(error)));
    });
    return missing;
  };
  const all = calls.map((_, i) => i);
  const missing = settle(all, await run(all, true));
  // NOSCRIPT: the first missing call loads its script with EVAL, the rest go as EVALSHA, so a
  // batch of a thousand sends the source once. Those still missing (other cluster nodes, other
  // scripts) go as EVAL.
  if (missing.length > 0) {
    const [head, ...rest] = missing;
    settle([head!], await run([head!], false));
    const still = rest.length > 0 ? settle(rest, await run(rest, true)) : [];
    if (still.length > 0 && settle(still, await run(still, false)).length > 0) {
      throw unavailable(scripts[still[0]!]!, new Error("Redis answered NOSCRIPT to EVAL"));
    }
  }
  return replies;
}

// The request goes on (fetch has no way to take a command back), but the caller stops waiting.
function deadline<T>(
  request: Promise<T>,
  script: Script,
  timeoutMs: number,
  onLate?: (reply: T) => void,
): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  let lapsed = false;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      lapsed = true;
      reject(new Error(`Redis did not answer the ${script.name} script in ${timeoutMs} ms`));
    }, timeoutMs);
  });
  // A late failure after the deadline is nobody's to handle; a late reply is `onLate`'s.
  request.then((reply) => lapsed && onLate?.(reply)).catch(() => {});
  return Promise.race([request, timeout]).finally(() => clearTimeout(timer));
}

// @upstash/redis reports Redis errors as UpstashError with Redis's own text, e.g.
// "NOSCRIPT No matching script. Please use EVAL." (single command) or
// "Command failed: NOSCRIPT No matching script…" (auto-pipelined); TCP clients (ioredis'
// ReplyError, node-redis' ErrorReply) carry the same text.
function isNoScript(error: unknown): boolean {
  return error instanceof Error && /(^|: )NOSCRIPT /.test(error.message);
}

// Upstash answers a wrong token with HTTP 401 {"error":"WRONGPASS invalid or missing auth token"}
// (serverless-redis-http: "Unauthorized"); the client keeps only that text. Not an outage: a
// retry cannot help.
/** What a refused REST token is told as. */
export const TOKEN_REFUSED = "Redis refused the REST token (HTTP 401): check " +
  "UPSTASH_REDIS_REST_TOKEN and that UPSTASH_REDIS_REST_URL names the same database";

/** Redis or the REST endpoint refused the credentials (a wrong token or password). */
export function isAuthFailure(error: unknown): boolean {
  return error instanceof Error &&
    /^(WRONGPASS|NOAUTH|Unauthorized|Invalid token)\b/i.test(error.message);
}

// A Redis Cluster refuses a script whose keys span slots: with edgelock, the single layout's stats
// and held index (per prefix) beside a lock's keys. A setting to change, not an outage.
function isCrossSlot(error: unknown): boolean {
  return error instanceof Error && /(^|: )CROSSSLOT /.test(error.message);
}

// A key of another type where a script expects its own: something else writes under the prefix.
function isWrongType(error: unknown): boolean {
  return error instanceof Error && /(^|: |@user_script:\d+: )WRONGTYPE /.test(error.message);
}

// A REST URL with a path: Upstash (and the bridge) take the path's first segment for a command.
function unknownCommand(error: unknown): string | undefined {
  if (!(error instanceof Error)) return undefined;
  const command = /^ERR unknown command '([^']*)'/.exec(error.message)?.[1];
  return command && !/^(EVALSHA|EVAL|BLPOP|XREAD)$/i.test(command) ? command : undefined;
}

// Redis 7 refuses a shebang flag it does not know: the key-locking flag sent to a plain Redis.
function isUnknownFlag(error: unknown): boolean {
  return error instanceof Error && /Unexpected flag in script shebang/.test(error.message);
}

function unavailable(script: Script, failure: unknown): EdgelockError {
  if (failure instanceof EdgelockError) return failure;
  const cause = redacted(failure);
  if (isUnknownFlag(cause)) {
    return new EdgelockError(
      "config_error",
      "This Redis does not know Upstash's allow-key-locking script flag: pass { keyLocking: " +
        "false } (LOCK_KEY_LOCKING=off for the service) for a plain Redis",
      { cause },
    );
  }
  if (isCrossSlot(cause)) {
    return new EdgelockError(
      "config_error",
      `This Redis is a cluster, and the ${script.name} script's keys span slots: pass ` +
        "{ cluster: true } (LOCK_KEY_LAYOUT=cluster for the service) to lay the keys out by slot",
      { cause },
    );
  }
  if (isAuthFailure(cause)) {
    const rest = (cause as Error).name === "UpstashError";
    return new EdgelockError(
      "config_error",
      rest
        ? TOKEN_REFUSED
        : "Redis refused the connection's credentials: check the user and password of its URL",
      { cause },
    );
  }
  if (cause instanceof Error && /(^|: )NOPERM\b/.test(cause.message)) {
    return new EdgelockError(
      "config_error",
      "Redis refused a script to this token or user (NOPERM): a read-only REST token cannot " +
        "run edgelock's scripts; use the read-write token, or a user allowed EVAL and EVALSHA",
      { cause },
    );
  }
  if (isWrongType(cause)) {
    return new EdgelockError(
      "config_error",
      `Redis refused the ${script.name} script: a key under edgelock's prefix holds another type of ` +
        "value, so something else writes there: give edgelock a prefix of its own (the prefix " +
        "option; LOCK_KEY_PREFIX for the service)",
      { cause },
    );
  }
  const unknown = unknownCommand(cause);
  if (unknown !== undefined) {
    return new EdgelockError(
      "config_error",
      `The REST endpoint took "${unknown}" for a command: UPSTASH_REDIS_REST_URL must be the ` +
        "database's root URL, without a path",
      { cause },
    );
  }
  const reason = cause instanceof Error ? cause.message : String(cause);
  if (/^Redis did not answer/.test(reason)) {
    return new EdgelockError("backend_unavailable", reason, { cause, retryAfterMs: 1000 });
  }
  return new EdgelockError(
    "backend_unavailable",
    // Not "did not run": the request may have reached Redis, its reply lost on the way back.
    `The ${script.name} script failed or its reply was lost: ${reason}`,
    { cause, retryAfterMs: 1000 },
  );
}

// A failure as `unavailable` says, unless a look at the client's URL names the cause: a host that
// does not resolve, TLS to a plain HTTP server, a server that is not an Upstash REST endpoint (a
// reply without `result`, e.g. the edgelock service's own URL) are `config_error`, which no retry
// helps; nothing listening, or a connection reset, stays `backend_unavailable` (a restart looks
// the same), named. The look is one POST without the token, at most a second (two for https).
async function explained(
  redis: RedisLike,
  script: Script,
  failure: unknown,
): Promise<EdgelockError> {
  const error = unavailable(script, failure);
  if (error.code !== "backend_unavailable") return error;
  const url = (redis as { client?: { baseUrl?: unknown } }).client?.baseUrl;
  if (typeof url !== "string" || !/^https?:\/\//.test(url)) return error;
  // Calls failing together share one look.
  let look = looking.get(redis);
  if (!look) {
    look = diagnose(url).finally(() => looking.delete(redis));
    looking.set(redis, look);
  }
  const found = await look;
  if (!found) return error;
  // A refused connection names the cause, but may pass (a restart): still worth a retry.
  // The look's own failure (ECONNREFUSED) is the cause, rather than the request's timeout.
  const cause = found.cause ?? error.cause;
  return found.retry
    ? new EdgelockError("backend_unavailable", found.message, { cause, retryAfterMs: 1000 })
    : new EdgelockError("config_error", found.message, { cause });
}

// The look at a client's URL in flight, by client.
const looking = new WeakMap<RedisLike, Promise<Diagnosis | undefined>>();

async function diagnose(url: string): Promise<Diagnosis | undefined> {
  const { origin, protocol } = new URL(url);
  const fix = "check UPSTASH_REDIS_REST_URL (Redis's REST URL, not the edgelock service's)";
  const post = (to: string) =>
    fetch(to, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: '["PING"]',
      signal: AbortSignal.timeout(1000),
    });
  try {
    const response = await post(url);
    const body = parseJsonText(await response.text());
    if (body && ("result" in body || "error" in body)) return undefined; // a REST endpoint
    return {
      message:
        `${origin} answers HTTP ${response.status}, but not as an Upstash Redis REST endpoint: ${fix}`,
      retry: false,
    };
  } catch (error) {
    const found = connectFailure(error, url, fix);
    if (found === undefined) return closedOrNotHttp(error, url, fix);
    if (found !== "timeout") return found;
    // TLS to a plain HTTP server may hang rather than fail: does it answer plain HTTP?
    if (protocol !== "https:") return undefined;
    const plain = await post(url.replace(/^https:/, "http:")).then(() => true, () => false);
    return plain
      ? { message: `${origin} answers plain HTTP, not TLS: use http:// (${fix})`, retry: false }
      : undefined;
  }
}

// A look that failed in no way `connectFailure` names. Something answered, but not in HTTP (TLS
// addressed with http://): config_error. A connection closed or reset is an outage, named with
// what it would be should it last: a proxy restarting, a load balancer without a live backend and
// Redis's own TCP port (which hangs up on an HTTP request) all look the same, and looking again
// would only make each failing call slower (helper-64: a 400 ms outage told as config_error).
export function closedOrNotHttp(error: unknown, url: string, fix: string): Diagnosis {
  const { origin } = new URL(url);
  const text = failureText(error).slice(0, 200);
  const cause = redacted(error);
  if (/invalid HTTP|HTTP version|invalid status/i.test(text)) {
    return { message: `${origin} answers, but not in HTTP (${text}): ${fix}`, retry: false, cause };
  }
  return {
    message:
      `${origin} closed the connection (${text}): if this lasts, is it Redis's TCP port? ${fix}`,
    retry: true,
    cause,
  };
}

/** Checks that a script reply is an array of `count` numbers, then optional strings. */
export function integers(script: Script, reply: unknown, count: number): number[] {
  if (
    Array.isArray(reply) && reply.length >= count &&
    reply.slice(0, count).every((value) => Number.isSafeInteger(value))
  ) {
    return reply.slice(0, count) as number[];
  }
  throw new EdgelockError(
    "backend_unavailable",
    `Redis answered the ${script.name} script with an unexpected reply: ${
      JSON.stringify(reply)?.slice(0, 200)
    }`,
  );
}

/** Checks a timeout option: a positive integer of milliseconds, at most a minute. */
export function checkTimeout(value: unknown): number {
  if (value === undefined) return DEFAULT_REDIS_TIMEOUT_MS;
  if (typeof value !== "number") throw new InvalidType("timeoutMs must be a number");
  if (!Number.isInteger(value) || value < 1 || value > 60_000) {
    throw new InvalidRange("timeoutMs must be an integer from 1 to 60000 milliseconds");
  }
  return value;
}

// The Upstash client may already have JSON-parsed the text (automaticDeserialization).
export function parseJsonText(raw: unknown): Record<string, unknown> | undefined {
  if (typeof raw === "object" && raw !== null) return raw as Record<string, unknown>;
  if (typeof raw !== "string" || raw === "") return undefined;
  try {
    return JSON.parse(raw);
  } catch {
    return undefined;
  }
}
