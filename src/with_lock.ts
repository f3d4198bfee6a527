import { sleep } from "./_backoff.ts";
import { EdgelockError } from "./errors.ts";
import type { Lease, LockClient, WithLockOptions } from "./types.ts";

/**
 * Runs `fn` while holding `name`. The lease is renewed with explicit calls every third of its
 * TTL; when renewals fail (lost, or the backend unreachable) `signal` aborts a fifth of the TTL
 * before the lease could expire, and `withLock` then rejects with `lock_lost`. The lock is
 * released at the end either way. The routine's own error is never hidden.
 *
 * Throws `lock_busy` (with `retryAfterMs`) when the lock stays busy for `waitMs`.
 */
export async function withLock<T>(
  locks: Pick<LockClient, "acquire" | "renew" | "release">,
  name: string,
  options: WithLockOptions,
  fn: (lease: Lease, signal: AbortSignal) => Promise<T> | T,
): Promise<T> {
  if (typeof fn !== "function") throw new TypeError("withLock needs a function to run");
  const startedAt = performance.now();
  const result = await locks.acquire(name, options);
  if (!result.acquired) {
    throw new EdgelockError(
      "lock_busy",
      `Cannot acquire lock "${name}": another token holds it`,
      { retryAfterMs: result.retryAfterMs },
    );
  }
  let lease = result.lease;
  const { ttlMs } = lease;
  const lost = new AbortController();
  const stop = new AbortController();
  const onOuterAbort = () => lost.abort(options.signal?.reason);
  options.signal?.addEventListener("abort", onOuterAbort, { once: true });

  // The lease is surely valid until `ttlMs` after the request that granted it was sent.
  let watchdog: ReturnType<typeof setTimeout> | undefined;
  const arm = (sentAt: number) => {
    clearTimeout(watchdog);
    const abortAt = sentAt + ttlMs - ttlMs / 5;
    watchdog = setTimeout(() => {
      lost.abort(
        new EdgelockError("lock_lost", `Lost lock "${name}": it could not be renewed in time`),
      );
    }, Math.max(0, abortAt - performance.now()));
  };
  arm(startedAt);

  const keepAlive = (async () => {
    let wait = ttlMs / 3;
    while (!stop.signal.aborted && !lost.signal.aborted) {
      try {
        await sleep(wait, stop.signal);
      } catch {
        return; // stopped
      }
      const sentAt = performance.now();
      try {
        const renewal = await locks.renew(lease, { ttlMs });
        if (stop.signal.aborted) return;
        if (!renewal.renewed) {
          lost.abort(
            new EdgelockError("lock_lost", `Lost lock "${name}": another token holds it now`),
          );
          return;
        }
        lease = renewal.lease;
        arm(sentAt);
        wait = ttlMs / 3;
      } catch {
        wait = ttlMs / 12; // the backend failed; try again soon, the watchdog guards the deadline
      }
    }
  })();

  let value: T;
  try {
    value = await fn(lease, lost.signal);
  } catch (error) {
    await finish();
    throw error;
  }
  await finish();
  if (lost.signal.aborted) throw lost.signal.reason;
  return value;

  async function finish() {
    stop.abort();
    clearTimeout(watchdog);
    options.signal?.removeEventListener("abort", onOuterAbort);
    await keepAlive;
    // A failed release is harmless: the lease then runs out on its own within ttlMs.
    await locks.release(lease).catch(() => false);
  }
}
