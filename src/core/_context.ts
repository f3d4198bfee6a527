// What Locks and LockOps share: the Redis client, where the keys live, how scripts run, and the
// event hook.
import {
  checkRedis,
  checkTimeout,
  keyLockingFor,
  type RedisLike,
  type RunOptions,
  runScript,
  runScripts,
} from "./_runner.ts";
import { KeySpace } from "./_keys.ts";
import { checkDuration, checkPrefix, DEFAULT_PREFIX, FENCE_GRACE_MS } from "./_validate.ts";
import type { Script, ScriptCall } from "./lua/_define.ts";
import { EdgelockError } from "./errors.ts";
import type { LockEvent } from "./types.ts";

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
   * names spread over 64 slots (see the README). Choose it once per prefix: the two layouts do not
   * see each other's locks. @default false
   */
  cluster?: boolean;
  /**
   * Send the scripts with Upstash's `allow-key-locking` flag, so Upstash locks only each script's
   * keys and scripts on different names run in parallel. @default on for an Upstash database
   * (`*.upstash.io`), off otherwise (plain Redis refuses the flag)
   */
  keyLocking?: boolean;
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
  readonly #run: RunOptions;
  readonly #onEvent: ((event: LockEvent) => void) | undefined;

  constructor(
    redis: RedisLike,
    what: string,
    options: LockOpsOptions & { stats?: unknown },
  ) {
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
    if (options.onEvent !== undefined && typeof options.onEvent !== "function") {
      throw new TypeError("onEvent must be a function");
    }
    this.#onEvent = options.onEvent;
  }

  /** Runs one script call in one request. */
  run(script: Script, { keys, args }: ScriptCall): Promise<unknown> {
    return runScript(this.redis, script, keys, args, this.#run);
  }

  /** Runs one script per call in one pipeline (side by side when the client has none). */
  runMany(script: Script, calls: readonly ScriptCall[]): Promise<unknown[]> {
    if (calls.length === 1) return this.run(script, calls[0]!).then((reply) => [reply]);
    return runScripts(this.redis, script, calls, this.#run);
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

/** An event's time and how long since `started` (a `performance.now()`). */
export function timing(started: number): { at: number; durationMs: number } {
  return { at: Date.now(), durationMs: performance.now() - started };
}
