// The Web Locks API (`navigator.locks`), distributed: the same calls, backed by Locks.
import { sleep } from "./_backoff.ts";
import type { LockOpsOptions } from "./_context.ts";
import { checkRedis, type RedisLike } from "./_runner.ts";
import {
  checkDuration,
  checkLockName,
  checkOptions,
  newToken,
  STORE_OPTIONS,
} from "./_validate.ts";
import { sentAtOf } from "./_granted.ts";
import { Locks, type LocksOptions } from "./locks.ts";
import { LockOps } from "./ops.ts";
import type { Lease } from "./types.ts";
import { hold } from "./with_lock.ts";
import { InvalidRange, InvalidType } from "./_invalid.ts";

/** Options for {@linkcode LockManager}: those of `Locks`, and the lease each request holds. */
export interface LockManagerOptions extends LocksOptions {
  /**
   * The lease a granted request holds, renewed every third of it while its callback runs, ms;
   * an instance that dies frees the name this long after its last renewal. @default 30000
   */
  ttlMs?: number;
  /** This manager's id in `query()` and in the audit of a steal, 1–64 characters. @default random */
  clientId?: string;
}

/** The mode of a Web Lock. */
export type LockManagerMode = "exclusive" | "shared";

/** Options for {@linkcode LockManager.request}, as `navigator.locks.request` takes them. */
export interface LockManagerRequestOptions {
  /** Exclusive (one holder) or shared (many holders, no exclusive one). @default "exclusive" */
  mode?: LockManagerMode;
  /** Call back at once with `null` when the lock is not free now, instead of waiting. */
  ifAvailable?: boolean;
  /** End the current holders' leases (audited) and take the lock: exclusive only. */
  steal?: boolean;
  /** Aborts the wait (not a granted lock): the request rejects with the signal's reason. */
  signal?: AbortSignal;
}

/** What a granted request's callback gets: the Web Lock's name and mode, and the lease. */
export interface HeldLock {
  /** The lock's name. */
  readonly name: string;
  /** The mode it is held in. */
  readonly mode: LockManagerMode;
  /** The lease as granted (its fence is `lease.fence`). */
  readonly lease: Lease;
  /** The lease's fence: pass it to the resource, which refuses a smaller one. */
  readonly fence: number;
  /** Aborts when the lease was lost (stolen, broken, or not renewed in time). */
  readonly signal: AbortSignal;
}

/** One lock or request in {@linkcode LockManager.query}'s snapshot. */
export interface LockManagerLockInfo {
  /** The lock's name. */
  name: string;
  /** The mode it is held in, or asked for. */
  mode: LockManagerMode;
  /** The manager's `clientId`, for its own locks and requests; absent for other holders. */
  clientId?: string;
}

/** What {@linkcode LockManager.query} reports. */
export interface LockManagerSnapshot {
  /** Every lock held under the prefix (from the held index: needs `stats`, on by default). */
  held: LockManagerLockInfo[];
  /** This manager's requests that wait. */
  pending: LockManagerLockInfo[];
}

/** What a request runs while it holds its lock: given `null` when `ifAvailable` found it held. */
export type LockManagerCallback<T> = (lock: HeldLock | null) => T | PromiseLike<T>;

const DEFAULT_LEASE_MS = 30_000;
// A request waits in turns of the longest wait one acquire takes, until granted or aborted.
const TURN_MS = 30_000;
const MANAGER_OPTIONS = ["maxWaiters", "ttlMs", "clientId"] as const;
const REQUEST_OPTIONS = ["mode", "ifAvailable", "steal", "signal"] as const;

/**
 * The Web Locks API's `LockManager` over edgelock: `request(name, options?, callback)` holds the
 * lock (across every instance sharing the Redis and prefix) while the callback's promise is
 * pending, renewing its lease meanwhile, and releases it when the promise settles; the request
 * resolves or rejects as the callback did. What carries over from the Web Locks semantics:
 * `mode: "shared"`, `ifAvailable` (the callback gets `null`), `steal`, `signal` (aborts the wait
 * with its reason), the refusal of names starting with `-` and of invalid option mixes
 * (`NotSupportedError`), and `query()`. Where a distributed lock differs: a lease can be lost
 * (the callback's `lock.signal` aborts, and the request rejects with `lock_lost` once the
 * callback settles); `steal` ends the holders' leases but then waits in line behind requests
 * already queued; a wait rejoins the queue every 30 s (the longest one acquire waits).
 *
 * @example
 * ```ts
 * import { Redis } from "@upstash/redis";
 * import { LockManager } from "@edgelock/edgelock";
 *
 * const locks = new LockManager(Redis.fromEnv());
 * await locks.request("invoice:42", async (lock) => {
 *   await fetch("https://billing.example.com/invoices/42", {
 *     method: "PUT",
 *     headers: { "x-fence": String(lock!.fence) },
 *     signal: lock!.signal,
 *   });
 * });
 * ```
 */
export class LockManager {
  readonly #locks: Locks;
  readonly #ops: LockOps;
  readonly #ttlMs: number;
  readonly #clientId: string;
  // This manager's requests, by a token of their own: the held and the pending.
  readonly #requests = new Map<string, LockManagerLockInfo & { granted: boolean }>();

  /** A manager over `redis`; throws a TypeError or RangeError naming a bad option. */
  constructor(redis: RedisLike, options: LockManagerOptions = {}) {
    checkRedis(redis, "LockManager");
    checkOptions(options, [...STORE_OPTIONS, ...MANAGER_OPTIONS], "new LockManager()");
    const { ttlMs, clientId = newToken(), maxWaiters, ...store } = options;
    this.#ttlMs = checkDuration(ttlMs, "ttlMs", DEFAULT_LEASE_MS);
    if (typeof clientId !== "string" || !/^[\x21-\x7e]{1,64}$/.test(clientId)) {
      throw new InvalidRange("clientId must be 1–64 printable ASCII characters");
    }
    this.#clientId = clientId;
    this.#locks = new Locks(redis, { ...store, ...(maxWaiters !== undefined && { maxWaiters }) });
    this.#ops = new LockOps(redis, store satisfies LockOpsOptions);
  }

  /** Holds `name` exclusively while `callback`'s promise is pending; resolves as it did. */
  request<T>(name: string, callback: LockManagerCallback<T>): Promise<T>;
  /** Holds `name` as `options` ask while `callback`'s promise is pending; resolves as it did. */
  request<T>(
    name: string,
    options: LockManagerRequestOptions,
    callback: LockManagerCallback<T>,
  ): Promise<T>;
  async request<T>(
    name: string,
    ...args: [LockManagerCallback<T>] | [LockManagerRequestOptions, LockManagerCallback<T>]
  ): Promise<T> {
    const [options, callback] = args.length === 1 ? [{}, args[0]] : args;
    checkOptions(options ?? undefined, REQUEST_OPTIONS, "request()");
    const { mode = "exclusive", ifAvailable = false, steal = false, signal } = options ?? {};
    if (typeof callback !== "function") throw new InvalidType("request needs a callback");
    if (mode !== "exclusive" && mode !== "shared") {
      throw new InvalidType(`mode must be "exclusive" or "shared", not ${JSON.stringify(mode)}`);
    }
    // The Web Locks API's own refusals, in its order.
    if (steal && ifAvailable) notSupported("steal and ifAvailable cannot be used together");
    if (steal && mode !== "exclusive") notSupported('steal needs mode "exclusive"');
    if (signal && (steal || ifAvailable)) {
      notSupported("signal cannot be used with steal or ifAvailable");
    }
    if (typeof name === "string" && name.startsWith("-")) {
      notSupported("lock names starting with '-' are reserved");
    }
    checkLockName(name);
    signal?.throwIfAborted();

    const token = newToken();
    const request = { name, mode, clientId: this.#clientId, granted: false };
    this.#requests.set(token, request);
    try {
      if (steal) {
        await this.#ops.break(name, { by: this.#clientId, reason: "stolen: LockManager steal" });
      }
      const granted = await this.#acquire(name, mode, token, ifAvailable, signal);
      if (!granted) {
        // Neither held nor pending, as in the Web Locks API, while it is told "not available".
        this.#requests.delete(token);
        return await callback(null);
      }
      request.granted = true;
      return await this.#hold(granted.lease, granted.at, mode, callback);
    } finally {
      this.#requests.delete(token);
    }
  }

  /** The locks held under the prefix, and this manager's waiting requests. */
  async query(): Promise<LockManagerSnapshot> {
    const held: LockManagerLockInfo[] = [];
    const mine = new Set([...this.#requests.values()].filter((r) => r.granted).map((r) => r.name));
    let cursor: string | undefined;
    do {
      const page = await this.#ops.list({ limit: 1000, ...(cursor && { cursor }) });
      for (const info of page.locks) {
        if (info.mode === "semaphore") continue; // no Web Lock has permits
        held.push({
          name: info.name,
          mode: info.mode ?? "exclusive",
          ...(mine.has(info.name) && { clientId: this.#clientId }),
        });
      }
      cursor = page.cursor;
    } while (cursor);
    const pending = [...this.#requests.values()].filter((r) => !r.granted).map((
      { name, mode, clientId },
    ) => ({ name, mode, clientId }));
    return { held, pending };
  }

  // The lease once granted, and when the request that was granted was sent; undefined when
  // `ifAvailable` and the lock is not free now.
  async #acquire(
    name: string,
    mode: LockManagerMode,
    token: string,
    ifAvailable: boolean,
    signal: AbortSignal | undefined,
  ): Promise<{ lease: Lease; at: number } | undefined> {
    for (;;) {
      const started = performance.now();
      const result = await this.#locks.acquire(name, {
        token,
        ttlMs: this.#ttlMs,
        waitMs: ifAvailable ? 0 : TURN_MS,
        ...(mode === "shared" && { mode }),
        ...(signal && { signal }),
      });
      if (result.acquired) return { lease: result.lease, at: sentAtOf(result.lease) ?? started };
      if (ifAvailable) return undefined;
      // A full queue, or a turn over: wait as told, then join again.
      await sleep(result.retryAfterMs, signal);
    }
  }

  async #hold<T>(
    lease: Lease,
    grantedAt: number,
    mode: LockManagerMode,
    callback: LockManagerCallback<T>,
  ): Promise<T> {
    let current = lease;
    let lost = false;
    try {
      return await hold(
        {
          what: `lock "${lease.name}"`,
          ttlMs: this.#ttlMs,
          grantedAt,
          renew: async () => {
            const renewal = await this.#locks.renew(current, { ttlMs: this.#ttlMs });
            if (renewal.renewed) current = renewal.lease;
            lost = !renewal.renewed;
            return renewal.renewed;
          },
        },
        async (signal) =>
          await callback({ name: lease.name, mode, lease, fence: lease.fence, signal }),
      );
    } finally {
      if (!lost) await this.#locks.release(current).catch(() => false);
    }
  }
}

function notSupported(message: string): never {
  throw new DOMException(message, "NotSupportedError");
}
