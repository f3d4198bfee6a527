// What Locks and LockOps share: the Redis client, where the keys live, how scripts run, and the
// event hook.
import {
  checkRedis,
  checkTimeout,
  isAuthFailure,
  keyLockingFor,
  type RedisLike,
  type RunOptions,
  runScript,
  runScripts,
  TOKEN_REFUSED,
} from "./_runner.ts";
import { KeySpace } from "./_keys.ts";
import { redacted } from "./_failure.ts";
import {
  checkDuration,
  checkOptions,
  checkPrefix,
  DEFAULT_PREFIX,
  FENCE_GRACE_MS,
  STORE_OPTIONS,
} from "./_validate.ts";
import type { Script, ScriptCall } from "./lua/_define.ts";
import { EdgelockError } from "./errors.ts";
import type { LockEvent } from "./types.ts";
import { InvalidType } from "./_invalid.ts";

/** Options for {@linkcode LockOps}, and those {@linkcode Locks} has in common with it. */
export interface LockOpsOptions {
  /** Prefix of every Redis key, e.g. per tenant or per app. @default "edgelock" */
  prefix?: string;
  /**
   * How long one Redis request may take, 1–60000 ms; then the call fails with
   * `backend_unavailable` (a paused or unreachable Redis never hangs a caller). @default 2000
   */
  timeoutMs?: number;
  /**
   * How long a name's record (its last fence, about 100 bytes) outlives the lease, 1000–86400000
   * ms. Within it fences keep increasing even if the server clock steps back; after it the name
   * leaves nothing in Redis, and a new fence is still above the old ones unless the clock is
   * behind them. @default 3600000 (an hour)
   */
  fenceWindowMs?: number;
  /**
   * Keep stats and the held index in Redis, in the same scripts (a few more Redis commands per
   * call, no more requests). Give `LockOps` the setting the prefix's `Locks` have: with stats
   * off a break counts nothing, and `list` and `stats` find nothing. @default true
   */
  stats?: boolean;
  /**
   * Lay the keys out for a Redis Cluster: every script's keys, stats included, in one slot, the
   * names spread over 64 slots (see docs/guarantees.md). Choose it once per prefix: the two
   * layouts do not see each other's locks. @default false
   */
  cluster?: boolean;
  /**
   * Send the scripts with Upstash's `allow-key-locking` flag, so Upstash locks only each script's
   * keys and scripts on different names run in parallel. @default on for an Upstash database
   * (`*.upstash.io`), off otherwise (plain Redis refuses the flag)
   */
  keyLocking?: boolean;
  /**
   * Let waiters block on a wake key of their own (`BLPOP`, one request that Redis answers when a
   * release hands them the lock) instead of polling; a Redis or bridge that refuses blocking
   * commands is polled, without error. Needs a client with `exec` (`@upstash/redis`).
   * @default true
   */
  blocking?: boolean;
  /**
   * Told of every operation's outcome, for logs, alerts or tracing (see `@edgelock/edgelock/otel`).
   * Called synchronously; what it throws is ignored.
   */
  onEvent?: (event: LockEvent) => void;
}

type Operation = (LockEvent & { type: "error" })["operation"];

// Errors of the caller's making, which are no `error` event: Redis did not fail.
const CALLER_ERRORS = new Set([
  "invalid_request",
  "mode_mismatch",
  "limit_mismatch",
  "hold_limit",
  "permits_mismatch",
]);

/** A checked set of options, bound to one Redis client. */
export class LockContext {
  readonly redis: RedisLike;
  readonly keys: KeySpace;
  readonly fenceWindowMs: number;
  /** Whether waiters may block on a wake key (the option, and a client that can send BLPOP). */
  readonly canBlock: boolean;
  readonly #run: RunOptions;
  readonly #onEvent: ((event: LockEvent) => void) | undefined;

  constructor(
    redis: RedisLike,
    what: string,
    options: LockOpsOptions & { stats?: unknown },
    more: readonly string[] = [],
  ) {
    checkOptions(options, [...STORE_OPTIONS, ...more], `new ${what}()`);
    const { prefix = DEFAULT_PREFIX, timeoutMs, fenceWindowMs, cluster = false } = options;
    const { stats = true } = options;
    checkRedis(redis, what);
    this.redis = redis;
    this.keys = new KeySpace(checkPrefix(prefix), stats, cluster);
    this.#run = {
      timeoutMs: checkTimeout(timeoutMs),
      keyLocking: keyLockingFor(redis, options.keyLocking),
    };
    this.fenceWindowMs = checkDuration(fenceWindowMs, "fenceWindowMs", FENCE_GRACE_MS);
    const { blocking = true } = options;
    if (typeof blocking !== "boolean") throw new InvalidType("blocking must be true or false");
    this.canBlock = blocking && typeof redis.exec === "function";
    if (options.onEvent !== undefined && typeof options.onEvent !== "function") {
      throw new InvalidType("onEvent must be a function");
    }
    this.#onEvent = options.onEvent;
  }

  /** Runs one script call in one request. */
  run(script: Script, { keys, args }: ScriptCall): Promise<unknown> {
    return runScript(this.redis, script, keys, args, this.#run);
  }

  /**
   * Runs one script per call in one pipeline, in order (side by side when the client has none):
   * `script`, or the call's own.
   */
  runMany(
    script: Script,
    calls: readonly (ScriptCall & { script?: Script })[],
  ): Promise<unknown[]> {
    if (calls.length === 1) {
      return this.run(calls[0]!.script ?? script, calls[0]!).then((reply) => [reply]);
    }
    return runScripts(this.redis, script, calls, this.#run);
  }

  /**
   * Waits up to `ms` for a message on the list `key` (BLPOP, a request of its own): the message,
   * or null when none came. Rejects when Redis refuses the command, fails or does not answer
   * `timeoutMs` past the block, or as soon as `signal` aborts.
   */
  block(key: string, ms: number, signal?: AbortSignal): Promise<string | null> {
    const seconds = (Math.ceil(ms) / 1000).toFixed(3);
    return this.#blocking(["BLPOP", key, seconds], ms, signal).then((reply) => {
      if (reply === null) return null;
      if (Array.isArray(reply) && typeof reply[1] === "string") return reply[1];
      throw new EdgelockError(
        "backend_unavailable",
        "Redis answered BLPOP with an unexpected reply",
      );
    });
  }

  /**
   * Waits up to `ms` for a ring after `id` on the readers' bell `key`, or a grant on the reader's
   * own wake key `own` (XREAD BLOCK on both, a request of its own): the grant, from a ring under
   * `field` (the reader's wake id) or from `own`, `""` for none; whether a ring asks the readers it
   * did not grant to look (`more`); the bell's last ring's id (`id` when none rang); whether `own`
   * had an entry. `null` when nothing came. Rejects as {@linkcode block} does.
   */
  listen(
    key: string,
    id: string,
    field: string,
    own: string,
    ms: number,
    signal?: AbortSignal,
  ): Promise<{ grant: string; more: boolean; id: string; own: boolean } | null> {
    const command: [string, ...string[]] = [
      "XREAD",
      "BLOCK",
      String(Math.ceil(ms)),
      "STREAMS",
      key,
      own,
      id,
      "0-0",
    ];
    return this.#blocking(command, ms, signal).then((reply) => {
      if (reply === null) return null;
      const heard = { grant: "", more: false, id, own: false };
      // [[key, [[id, [field, value, …]], …]], …]: the streams that had entries
      for (const stream of Array.isArray(reply) ? reply : [undefined]) {
        const [from, entries] = Array.isArray(stream) ? stream : [];
        const last = Array.isArray(entries) ? entries.at(-1)?.[0] : undefined;
        if ((from !== key && from !== own) || typeof last !== "string") {
          throw new EdgelockError(
            "backend_unavailable",
            "Redis answered XREAD with an unexpected reply",
          );
        }
        if (from === key) heard.id = last;
        else heard.own = true;
        const name = from === key ? field : "grant";
        for (const [, fields] of entries as [unknown, unknown[]][]) {
          for (let i = 0; Array.isArray(fields) && i + 1 < fields.length; i += 2) {
            if (fields[i] === name) heard.grant = String(fields[i + 1]);
            if (from === key && fields[i] === "more" && String(fields[i + 1]) === "1") {
              heard.more = true;
            }
          }
        }
      }
      return heard;
    });
  }

  #blocking(
    command: [string, ...string[]],
    ms: number,
    signal: AbortSignal | undefined,
  ): Promise<unknown> {
    const request = this.redis.exec!(command);
    return withDeadline(request, ms + this.#run.timeoutMs, signal).catch((error) => {
      throw signal?.aborted ? error : unavailableBlock(error);
    });
  }

  /** Tells the hook; what it throws is ignored. */
  emit(event: LockEvent): void {
    try {
      this.#onEvent?.(event);
    } catch {
      // the application's hook never breaks a lock operation
    }
  }

  /** Runs an operation; a Redis failure is told as an `error` event, then rethrown. */
  async observe<T>(name: string, operation: Operation, run: () => Promise<T>): Promise<T> {
    if (!this.#onEvent) return run();
    const started = performance.now();
    try {
      return await run();
    } catch (error) {
      if (error instanceof EdgelockError && !CALLER_ERRORS.has(error.code)) {
        this.emit({ type: "error", name, operation, error, ...timing(started) });
      }
      throw error;
    }
  }
}

// A request that is abandoned (not cancelled: fetch cannot take a command back) after `ms`, or
// when `signal` aborts.
function withDeadline<T>(request: Promise<T>, ms: number, signal?: AbortSignal): Promise<T> {
  request.catch(() => {}); // a late failure is nobody's to handle
  let timer: ReturnType<typeof setTimeout> | undefined;
  let onAbort: (() => void) | undefined;
  const cut = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no answer in ${ms} ms`)), ms);
    onAbort = () => reject(signal!.reason);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
  return Promise.race([request, cut]).finally(() => {
    clearTimeout(timer);
    signal?.removeEventListener("abort", onAbort!);
  });
}

// A refused BLPOP is no outage: the waiter polls instead. Only a refused token is told.
function unavailableBlock(failure: unknown): EdgelockError {
  const cause = redacted(failure);
  if (isAuthFailure(cause)) return new EdgelockError("config_error", TOKEN_REFUSED, { cause });
  return new EdgelockError("backend_unavailable", "Redis did not serve a blocking wait", { cause });
}

/** An event's time and how long since `started` (a `performance.now()`). */
export function timing(started: number): { at: number; durationMs: number } {
  return { at: Date.now(), durationMs: performance.now() - started };
}
