/**
 * edgelock: distributed locks with fencing tokens for edge runtimes, on Redis over REST.
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
export { DEFAULT_MAX_WAITERS, Locks, type LocksOptions } from "./locks.ts";
export { withLock } from "./with_lock.ts";
export { EdgelockError, type EdgelockErrorOptions, type ErrorCode } from "./errors.ts";
export type { RedisLike } from "./_runner.ts";
export type {
  AcquireOptions,
  AcquireResult,
  Lease,
  LeaseRef,
  LockClient,
  LockInfo,
  RenewOptions,
  RenewResult,
  WithLockOptions,
} from "./types.ts";
export { type AppDeps, createApp, MAX_BODY_BYTES } from "./app.ts";
export { DEFAULT_LIMITS, type TenantLimits } from "./_limits.ts";
export { type ApiKey, parseApiKeys } from "./auth.ts";
export { type ClientOptions, createClient } from "./client.ts";
export { appSettings, readConfig, type ServiceConfig } from "./config.ts";
export {
  type ClaimOptions,
  type ClaimResult,
  type JobStart,
  recordId,
  type RecordKind,
  type RecordState,
  safeName,
  type StartJobOptions,
  Store,
  type StoreOptions,
} from "./store.ts";
export { cronGuard, type CronResult, type JobRun } from "./cron.ts";
export {
  dedupe,
  type DedupeOptions,
  type DedupeResult,
  webhookDedupe,
  type WebhookDedupeOptions,
} from "./dedupe.ts";
export { idempotency, type IdempotencyOptions } from "./idempotency.ts";
