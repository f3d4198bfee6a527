/**
 * The three uses without a web framework: `Records` (claims and completions, for idempotency and
 * deduplication), `dedupe()` for event ids, `Jobs` and `cronGuard()` for scheduled jobs.
 *
 * @example
 * ```ts
 * import { Redis } from "@upstash/redis";
 * import { dedupe, Records } from "@edgelock/edgelock/uses";
 *
 * const records = new Records(Redis.fromEnv());
 * const claim = await dedupe(records, { namespace: "stripe", id: "evt_123" });
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
  type ClaimRenewal,
  type ClaimResult,
  MAX_RESPONSE_BYTES,
  recordId,
  type RecordKind,
  Records,
  type RecordState,
  type RecordStore,
  safeName,
  SEGMENT_PATTERN,
  type StoreOptions,
} from "./records.ts";
export {
  type JobExtension,
  Jobs,
  type JobStart,
  type JobStore,
  type StartJobOptions,
} from "./jobs.ts";
export { cronGuard, type CronResult, type JobRun } from "./cron.ts";
export { dedupe, DEDUPE_RETENTION_MS, type DedupeOptions, type DedupeResult } from "./dedupe.ts";
