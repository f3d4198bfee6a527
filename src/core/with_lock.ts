import { sleep } from "./_backoff.ts";
import { sentAtOf } from "./_granted.ts";
import { ACQUIRE_OPTIONS, checkOptions, LEASE_OPTIONS } from "./_validate.ts";
import { busyError, EdgelockError } from "./errors.ts";
import type { Lease, LeaseOptions, LockClient, WithLockOptions } from "./types.ts";
import { InvalidRange, InvalidType } from "./_invalid.ts";

/**
 * Runs `fn` while holding `name`. The lease is renewed with explicit calls every third of its
 * TTL; when renewals fail (lost, or the backend unreachable) `signal` aborts a fifth of the TTL
 * before the lease could expire, and `withLock` then rejects with `lock_lost`. The lock is
 * released at the end either way. The routine's own error is never hidden.
 *
 * Throws `lock_busy` (with `retryAfterMs`) when the lock stays busy for `waitMs` (at once with
 * `ifAvailable`). `mode`, `limit` and `permits` make it a reader's or a semaphore's lease.
 */
export async function withLock<T>(
  locks: Pick<LockClient, "acquire" | "renew" | "release">,
  name: string,
  options: WithLockOptions,
  fn: (lease: Lease, signal: AbortSignal) => Promise<T> | T,
  onLost?: (lease: Lease, error: EdgelockError) => void,
): Promise<T> {
  if (typeof fn !== "function") throw new InvalidType("withLock needs a function to run");
  checkOptions(options, [...ACQUIRE_OPTIONS, "ifAvailable"], "withLock()");
  options ??= {};
  if (options.ifAvailable !== undefined && typeof options.ifAvailable !== "boolean") {
    throw new InvalidType("ifAvailable must be a boolean");
  }
  if (options.ifAvailable && options.waitMs) {
    throw new InvalidRange("ifAvailable means no wait: leave waitMs out");
  }
  const startedAt = performance.now();
  const { ifAvailable: _, ...acquireOptions } = options;
  const result = await locks.acquire(name, acquireOptions);
  if (!result.acquired) throw busyError(name, result);
  let lease = result.lease;
  let lost = false; // a renewal found the lease gone: no release to send
  // Renewals ask for the TTL this call asked for; a reentrant lease may be told it lasts longer.
  const ttlMs = Math.min(options.ttlMs ?? lease.ttlMs, lease.ttlMs);
  try {
    return await hold({
      what: `lock "${name}"`,
      ttlMs,
      // From the request that was granted, not from before the wait; a client that cannot tell
      // falls back to the start of the call, which is earlier and so always safe.
      grantedAt: sentAtOf(lease) ?? startedAt,
      signal: options.signal,
      async renew() {
        const renewal = await locks.renew(lease, { ttlMs });
        if (renewal.renewed) lease = renewal.lease;
        lost = !renewal.renewed;
        return renewal.renewed;
      },
    }, (signal) => fn(lease, signal));
  } catch (error) {
    if (error instanceof EdgelockError && error.code === "lock_lost") onLost?.(lease, error);
    throw error;
  } finally {
    // A failed release is harmless: the lease then runs out on its own within ttlMs.
    if (!lost) await locks.release(lease).catch(() => false);
  }
}

/**
 * Runs `fn` while holding every one of `names` (a multi-name lock: all or none, see
 * `Locks.acquireAll`), renewing all leases in one request every third of the TTL; `signal`
 * aborts when any lease was lost, and `withLocks` then rejects with `lock_lost`. Every lease still
 * held is released at the end either way.
 */
export async function withLocks<T>(
  locks: Pick<LockClient, "acquireAll" | "renewMany" | "release">,
  names: readonly string[],
  options: LeaseOptions,
  fn: (leases: Lease[], signal: AbortSignal) => Promise<T> | T,
): Promise<T> {
  if (typeof fn !== "function") throw new InvalidType("withLocks needs a function to run");
  checkOptions(options, LEASE_OPTIONS, "withLocks()");
  const startedAt = performance.now();
  const result = await locks.acquireAll(names, options);
  if (!result.acquired) throw busyError(names.join(", "), result);
  let leases = result.leases;
  const lost = new Set<string>(); // names whose renewal found the lease gone: no release to send
  try {
    return await hold({
      what: `locks ${names.map((name) => `"${name}"`).join(", ")}`,
      ttlMs: leases[0]!.ttlMs,
      grantedAt: sentAtOf(leases[0]!) ?? startedAt,
      signal: options.signal,
      async renew() {
        const renewals = await locks.renewMany(leases, { ttlMs: leases[0]!.ttlMs });
        leases = leases.map((lease, i) => {
          const renewal = renewals[i]!;
          if (!renewal.renewed) lost.add(lease.name);
          return renewal.renewed ? renewal.lease : lease;
        });
        return lost.size === 0;
      },
    }, (signal) => fn(leases, signal));
  } finally {
    await Promise.all(
      leases.filter((lease) => !lost.has(lease.name)).map((lease) =>
        locks.release(lease).catch(() => false)
      ),
    );
  }
}

/** What {@linkcode hold} keeps alive. */
export interface HoldOptions {
  /** Named in errors, e.g. `lock "x"`. */
  what: string;
  /** The lease length each renewal grants, ms. */
  ttlMs: number;
  /** `performance.now()` when the request that granted the lease was sent. */
  grantedAt: number;
  /** Renews the lease: true when renewed, false when lost; throws when the backend failed. */
  renew(): Promise<boolean>;
  /** Aborts the routine's signal too. */
  signal?: AbortSignal;
  /**
   * Renew on after the signal aborted for lack of a renewal, while the routine runs, until the
   * lease is another's: for a routine that cannot stop (a middleware's handler) whose lease no
   * other call shares a token with (a claim's). Never for a lease whose token a caller may reuse:
   * a renewal by token could then take over that token's next lease. @default false
   */
  renewAfterAbort?: boolean;
}

/**
 * Runs `fn` while renewing a lease every third of its TTL, and aborts `fn`'s signal a fifth of
 * the TTL before the lease could expire unrenewed (or at once when it was lost). Rejects with
 * `lock_lost` when the lease was lost, even if `fn` returned; `fn`'s own error wins. With
 * `renewAfterAbort`, renewals go on (every third of the TTL) after the signal aborted for lack of
 * one, until the lease is another's or `fn` ends.
 */
export async function hold<T>(
  { what, ttlMs, grantedAt, renew, signal: outer, renewAfterAbort = false }: HoldOptions,
  fn: (signal: AbortSignal) => Promise<T> | T,
): Promise<T> {
  const lost = new AbortController();
  const stop = new AbortController();
  const onOuterAbort = () => lost.abort(outer?.reason);
  // A signal aborted already (while the lease was being acquired) fires no event.
  if (outer?.aborted) onOuterAbort();
  else outer?.addEventListener("abort", onOuterAbort, { once: true });

  // The lease is surely valid until `ttlMs` after the request that granted it was sent.
  let watchdog: ReturnType<typeof setTimeout> | undefined;
  const arm = (sentAt: number) => {
    clearTimeout(watchdog);
    watchdog = setTimeout(() => {
      lost.abort(new EdgelockError("lock_lost", `Lost ${what}: it could not be renewed in time`));
    }, Math.max(0, sentAt + ttlMs - ttlMs / 5 - performance.now()));
  };
  arm(grantedAt);

  let taken = false; // another token holds it now: renewing can never succeed again
  const keepAlive = (async () => {
    let wait = ttlMs / 3;
    while (!stop.signal.aborted && !taken && (renewAfterAbort || !lost.signal.aborted)) {
      try {
        await sleep(wait, stop.signal);
      } catch {
        return; // stopped
      }
      const sentAt = performance.now();
      try {
        const renewed = await renew();
        if (stop.signal.aborted) return;
        if (!renewed) {
          taken = true;
          lost.abort(new EdgelockError("lock_lost", `Lost ${what}: another token holds it now`));
          return;
        }
        if (!lost.signal.aborted) arm(sentAt);
        wait = ttlMs / 3;
      } catch {
        // The backend failed: try again soon while the watchdog guards the deadline, and at the
        // usual pace once it has fired.
        wait = lost.signal.aborted ? ttlMs / 3 : ttlMs / 12;
      }
    }
  })();

  const finish = async () => {
    stop.abort();
    clearTimeout(watchdog);
    outer?.removeEventListener("abort", onOuterAbort);
    await keepAlive;
  };
  let value: T;
  try {
    value = await fn(lost.signal);
  } catch (error) {
    await finish();
    throw error;
  }
  await finish();
  if (lost.signal.aborted) throw lost.signal.reason;
  return value;
}
