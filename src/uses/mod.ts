/**
 * The three uses on the "exactly once" state machine, without a web framework: `Store` (claims,
 * completions, cron job starts), `dedupe()` for event ids and `cronGuard()` for scheduled jobs.
 *
 * @example
 * ```ts
 * import { Redis } from "@upstash/redis";
 * import { dedupe, Store } from "@edgelock/edgelock/uses";
 *
 * const store = new Store(Redis.fromEnv());
 * const claim = await dedupe(store, { namespace: "stripe", id: "evt_123" });
 * if (claim.state === "claimed") {
 *   // … process the event once, then:
 *   await claim.done();
 * }
 * ```
 *
 * @module
 */
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
export { dedupe, DEDUPE_RETENTION_MS, type DedupeOptions, type DedupeResult } from "./dedupe.ts";
