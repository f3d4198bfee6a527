/**
 * edgelock: distributed locks with fencing tokens for edge runtimes, on Redis over REST. This
 * root entry is the lock core only (no web framework, no schema library): `Locks`, `withLock`,
 * errors and types. The uses (`/uses`), Hono middleware (`/hono`), the HTTP service (`/service`)
 * and the typed client (`/client`) are entries of their own.
 *
 * @example
 * ```ts
 * import { Redis } from "@upstash/redis";
 * import { Locks } from "@edgelock/edgelock";
 *
 * const locks = new Locks(Redis.fromEnv());
 * await locks.withLock("report:daily", { ttlMs: 5000 }, async (lease, signal) => {
 *   // Long work renews the lease every third of ttlMs; signal aborts if it is lost.
 *   await fetch("https://example.com/reports", {
 *     method: "POST",
 *     headers: { "x-fence": String(lease.fence) },
 *     signal,
 *   });
 * });
 * ```
 *
 * @module
 */
export {
  DEFAULT_MAX_WAITERS,
  DEFAULT_TTL_MS,
  Locks,
  type LocksOptions,
  MAX_BATCH,
} from "./locks.ts";
export { LockOps } from "./ops.ts";
export {
  type HeldLock,
  LockManager,
  type LockManagerCallback,
  type LockManagerLockInfo,
  type LockManagerMode,
  type LockManagerOptions,
  type LockManagerRequestOptions,
  type LockManagerSnapshot,
} from "./lock_manager.ts";
export type { LockOpsOptions } from "./_context.ts";
export { withLock, withLocks } from "./with_lock.ts";
export { EdgelockError, type EdgelockErrorOptions, type ErrorCode } from "./errors.ts";
export type { PipelineLike, RedisLike } from "./_runner.ts";
export { MAX_SHARED } from "./lua/acquire_shared.ts";
export { MAX_LIMIT, MAX_NAMES } from "./_validate.ts";
export type {
  AcquireAllResult,
  AcquireOptions,
  AcquireResult,
  AuditEntry,
  BreakOptions,
  BreakResult,
  Lease,
  LeaseOptions,
  LeaseRef,
  ListOptions,
  LockClient,
  LockEvent,
  LockInfo,
  LockList,
  RenewOptions,
  RenewResult,
  WithLockOptions,
} from "./types.ts";
export type { Counts, Histogram, MinuteStats, Stats } from "./stats.ts";
