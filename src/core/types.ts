/** A held lock. A plain value: renewing returns a new lease rather than changing this one. */
export interface Lease {
  /** The lock name. */
  readonly name: string;
  /** The owner token; only its holder can renew or release. */
  readonly token: string;
  /** Strictly increasing per name; resources should reject writes carrying an older fence. */
  readonly fence: number;
  /** The lease length this lease was granted with, in milliseconds. */
  readonly ttlMs: number;
  /** When the lease ends, epoch milliseconds of the Redis server clock. */
  readonly expiresAt: number;
  /** The Redis server clock when it was granted, epoch milliseconds. */
  readonly serverTime: number;
  /** `shared` (a read-write lock's reader) or `semaphore`; absent when exclusive. */
  readonly mode?: "shared" | "semaphore";
  /** A semaphore's permits in all. */
  readonly limit?: number;
  /** This lease's permits of a semaphore. */
  readonly permits?: number;
  /** A reentrant lease's hold count: releases it takes to free it. Only with `reentrant`. */
  readonly holdCount?: number;
  /**
   * This reentrant acquire's hold: its release ends this hold only, once, however often it is
   * retried. Only with `reentrant`.
   */
  readonly hold?: string;
  /**
   * Who waited when it was granted (opaque; absent when no one did): its release, by any process,
   * hands the lock to the next waiter in the same request. Keep it with the lease.
   */
  readonly next?: string;
}

/**
 * What renew and release need of a lease: its name and owner token. With its `fence` too, a
 * retried release answers `true` for exactly that lease; with its `next`, another process's
 * release hands over as the acquiring one's would.
 */
export type LeaseRef = Pick<Lease, "name" | "token"> & {
  readonly ttlMs?: number;
  readonly fence?: number;
  readonly hold?: string;
  readonly next?: string;
};

/** Options for `acquire`. */
export interface AcquireOptions extends LeaseOptions {
  /**
   * `exclusive`: one holder. `shared`: any number of shared holders (up to 1000) and no
   * exclusive one, a read-write lock's readers (exclusive holders being its writers). Fair: a
   * waiting exclusive caller blocks shared callers that come after it. @default "exclusive"
   */
  mode?: "exclusive" | "shared";
  /**
   * Makes it a counting semaphore of `limit` permits, 1–1000: holders together hold at most
   * that many. Every caller of a name passes the same `limit`; while it is held, a caller with
   * another limit gets `limit_mismatch`, and one with another mode `mode_mismatch`.
   */
  limit?: number;
  /** How many of a semaphore's permits this lease takes, 1–`limit`. @default 1 */
  permits?: number;
  /**
   * Acquiring again with the holder's token counts a hold (Redisson's hold count) instead of
   * answering the same lease: it then takes as many releases to free. Each hold has an id (the
   * lease's `hold`), so a retried acquire or release of one hold counts once. The lease lasts
   * until the latest end any of its holds was told: no hold shortens it. @default false
   */
  reentrant?: boolean;
  /**
   * A reentrant acquire's hold id, 8–32 characters of `A-Z a-z 0-9 _ -`: choose it before the
   * first attempt when you retry yourself, so a retry counts the hold once. @default a new
   * random id
   */
  hold?: string;
}

/** Options for `acquire` and `acquireAll`: the lease, its token, and how long to wait. */
export interface LeaseOptions {
  /** Lease length, 100–300000 ms. @default 10000 */
  ttlMs?: number;
  /** How long to wait for a busy lock, 0–30000 ms. @default 0 */
  waitMs?: number;
  /**
   * The owner token, 16–128 characters of `A-Z a-z 0-9 _ -`. Choose it before the first attempt
   * to make retries safe: acquiring again with the holder's token returns the same fence.
   * @default a new random token
   */
  token?: string;
  /**
   * The `token` was made for this call alone, as the one made when none is given is: once a
   * release of it went through, a late copy of the call (a retried request's first attempt that
   * arrives last) is refused with `lock_lost` instead of granted a lease no one would release.
   * Never set it for a token that other calls use. @default false, true without `token`
   */
  freshToken?: boolean;
  /** A JSON object (at most 1 KiB) that `inspect` shows, e.g. who holds the lock. */
  meta?: Record<string, unknown>;
  /** Stops waiting; the call then rejects with the signal's reason. */
  signal?: AbortSignal;
}

/**
 * The outcome of `acquire`: a lease, or why not: `busy` (another token holds it, or waiters
 * ahead keep it) or `queue_full` (too many waiters on this name already).
 *
 * `retryAfterMs` is a poll hint, not a promise: when the holder is likely done, estimated from
 * recent hold times on this name (and one hold per waiter ahead), never later than the holder's
 * lease end. `lockExpiresAt` (Redis server clock, epoch ms) is when the current lease ends unless
 * it is renewed; absent when no token holds the lock (it is kept for the head of the queue).
 */
export type AcquireResult =
  | { acquired: true; lease: Lease }
  | {
    acquired: false;
    retryAfterMs: number;
    lockExpiresAt?: number;
    reason: "busy" | "queue_full";
  };

/** Options for `renew`. */
export interface RenewOptions {
  /** The new lease length from now, 100–300000 ms. @default the lease's own ttlMs, else 10000 */
  ttlMs?: number;
}

/** The outcome of `renew`: a fresh lease with the same fence, or the lock was lost. */
export type RenewResult = { renewed: true; lease: Lease } | { renewed: false };

/** What anyone may know of a lock; never the holder's token. */
export type LockInfo =
  | { name: string; held: false }
  | {
    name: string;
    held: true;
    fence: number;
    ttlMs: number;
    expiresAt: number;
    /** Callers waiting in its queue now. */
    waiters?: number;
    meta?: Record<string, unknown>;
    /** How it is held. */
    mode?: "exclusive" | "shared" | "semaphore";
    /** How many hold it (1 when exclusive). */
    holders?: number;
    /** A semaphore's permits held; an exclusive lease's hold count. */
    permits?: number;
    /** A semaphore's permits in all. */
    limit?: number;
  };

/**
 * The outcome of `acquireAll`: a lease per name, in order (one token, one fence per name), or
 * why not, as for `acquire`.
 */
export type AcquireAllResult =
  | { acquired: true; leases: Lease[] }
  | Exclude<AcquireResult, { acquired: true }>;

/** Options for `list`. */
export interface ListOptions {
  /** Only names that start with this. @default "" */
  prefix?: string;
  /** The `cursor` of the previous page. */
  cursor?: string;
  /** The most locks on this page, 1–1000. @default 100 */
  limit?: number;
}

/** One page of held locks, by name; `cursor` is absent on the last page. */
export interface LockList {
  /** The held locks of this page, by name. */
  locks: (LockInfo & { held: true })[];
  /** Pass it to the next call for the next page. */
  cursor?: string;
}

/** Who breaks a lock and why, for the audit stream. */
export interface BreakOptions {
  /** Who broke it (an operator's name), 1–64 printable characters. */
  by: string;
  /** Why, up to 200 printable characters. @default "" */
  reason?: string;
  /**
   * This break's id, 8–32 characters of `A-Z a-z 0-9 _ -`: a retry with the same id answers the
   * same and ends no lease granted since. @default a new one per call (a request the Redis
   * client sends again takes effect once; another call is another break)
   */
  id?: string;
  /**
   * The fence of the lease to break, as `inspect` showed it: a lease granted since (the stuck one
   * ran out, and another caller took the name) is left alone, `{ broken: false }`. A shared or
   * semaphore name is broken (every holder's lease) only while a holder of that fence holds it.
   * @default whichever lease holds the name
   */
  fence?: number;
}

/** The outcome of `break`: the fence of the lease that was ended, or not held. */
export type BreakResult = { broken: true; fence: number } | { broken: false };

/** One entry of the audit stream. */
export interface AuditEntry {
  /** The stream entry's id. */
  id: string;
  /** What was done. */
  action: "break";
  /** The lock's name. */
  name: string;
  /** The fence of the lease that was ended. */
  fence: number;
  /** Who did it. */
  by: string;
  /** Why, as given. */
  reason: string;
  /** When, ms since the epoch (server clock). */
  at: number;
}

/**
 * What a `Locks` tells its `onEvent` hook: one event per operation's outcome (`wait` for each
 * look that found the lock busy while waiting), `lost` when `withLock` aborted its routine, and
 * `error` when Redis failed. `at` is when it ended (`Date.now()`), `durationMs` how long the
 * operation took.
 */
export type LockEvent =
  & { name: string; at: number; durationMs: number }
  & (
    | {
      type: "acquire";
      outcome: "granted" | "busy" | "timeout" | "queue_full" | "aborted";
      fence?: number;
      waitedMs: number;
    }
    | { type: "wait"; position: number; retryAfterMs: number }
    | { type: "renew"; outcome: "renewed" | "lost"; fence?: number }
    | { type: "release"; outcome: "released" | "lost"; fence?: number }
    | { type: "lost"; fence: number; reason: string }
    | {
      type: "error";
      operation:
        | "acquire"
        | "renew"
        | "release"
        | "inspect"
        | "list"
        | "break"
        | "stats"
        | "audit";
      error: unknown;
    }
  );

/** Options for `withLock`. */
export interface WithLockOptions extends AcquireOptions {
  /** Do not wait: reject with `lock_busy` at once when it is held (as `waitMs: 0`). */
  ifAvailable?: boolean;
}

/** What both the embedded library and the HTTP client offer. */
export interface LockClient {
  /** Acquires `name`, waiting up to `waitMs` when it is busy. */
  acquire(name: string, options?: AcquireOptions): Promise<AcquireResult>;
  /** Acquires every name exclusively, all or none: a lease per name, one token. */
  acquireAll(names: readonly string[], options?: LeaseOptions): Promise<AcquireAllResult>;
  /** Extends a lease that is still held by its token. */
  renew(lease: LeaseRef, options?: RenewOptions): Promise<RenewResult>;
  /** Renews up to 1000 leases in one request; results in the same order. */
  renewMany(leases: readonly LeaseRef[], options?: RenewOptions): Promise<RenewResult[]>;
  /** Frees a lease; `false` when its token no longer held it. */
  release(lease: LeaseRef): Promise<boolean>;
  /** Tells whether `name` is held, decided on the Redis primary. */
  inspect(name: string): Promise<LockInfo>;
  /** Runs `fn` while holding all of `names`, renewing the leases; see {@linkcode withLocks}. */
  withLocks<T>(
    names: readonly string[],
    options: LeaseOptions,
    fn: (leases: Lease[], signal: AbortSignal) => Promise<T> | T,
  ): Promise<T>;
  /** Runs `fn` while holding `name`, renewing the lease; see {@linkcode withLock}. */
  withLock<T>(
    name: string,
    options: WithLockOptions,
    fn: (lease: Lease, signal: AbortSignal) => Promise<T> | T,
  ): Promise<T>;
}
