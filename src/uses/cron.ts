import type { JobStore, StartJobOptions } from "./jobs.ts";
import { hold } from "../core/with_lock.ts";
import { checkOptions, JOB_OPTIONS } from "../core/_validate.ts";
import { InvalidType } from "../core/_invalid.ts";

/** What a guarded run learns about itself. */
export interface JobRun {
  /** The job's name. */
  job: string;
  /** This run's owner token. */
  token: string;
  /** Strictly increasing per job: pass it to resources that refuse stale writers. */
  fence: number;
}

/** The outcome of {@linkcode cronGuard}. */
export type CronResult<T> =
  | { ran: true; value: T }
  | { ran: false; reason: "running" | "too_soon" | "tick_done"; retryAfterMs: number };

/**
 * Runs a scheduled job at most once across triggers, with ShedLock semantics: it never waits
 * (a run elsewhere means skip); `atMostMs` frees the lock if a run crashes; the lock is kept
 * until `atLeastMs` after the start, so a second trigger on a skewed clock cannot re-run it; with
 * `tick` (e.g. Cloudflare's `controller.scheduledTime`) each tick runs at most once. A run longer
 * than a third of `atMostMs` is extended with explicit calls, and its signal aborts if it cannot be.
 *
 * @example
 * ```ts
 * import { Redis } from "@upstash/redis/cloudflare";
 * import { cronGuard, Jobs } from "@edgelock/edgelock/uses";
 *
 * type Env = { UPSTASH_REDIS_REST_URL: string; UPSTASH_REDIS_REST_TOKEN: string };
 * export default {
 *   scheduled(
 *     controller: { scheduledTime: number },
 *     env: Env,
 *     ctx: { waitUntil(promise: Promise<unknown>): void },
 *   ) {
 *     const jobs = new Jobs(Redis.fromEnv(env));
 *     ctx.waitUntil(cronGuard(jobs, "nightly-report", {
 *       atMostMs: 600_000,
 *       atLeastMs: 60_000,
 *       tick: controller.scheduledTime,
 *     }, (run, signal) =>
 *       fetch("https://reports.example.com/nightly", {
 *         method: "POST",
 *         headers: { "x-fence": String(run.fence) },
 *         signal,
 *       })));
 *   },
 * };
 * ```
 */
export async function cronGuard<T>(
  jobs: JobStore,
  job: string,
  options: StartJobOptions,
  fn: (run: JobRun, signal: AbortSignal) => Promise<T> | T,
): Promise<CronResult<T>> {
  if (typeof fn !== "function") throw new InvalidType("cronGuard needs a function to run");
  checkOptions(options, JOB_OPTIONS, "cronGuard()");
  const grantedAt = performance.now();
  const start = await jobs.start(job, options);
  if (!start.run) return { ran: false, reason: start.reason, retryAfterMs: start.retryAfterMs };
  const { token, fence } = start;
  try {
    const value = await hold({
      what: `job "${job}"`,
      ttlMs: options.atMostMs,
      grantedAt,
      renew: async () => (await jobs.extend(job, token, options.atMostMs)).extended,
    }, (signal) => fn({ job, token, fence }, signal));
    return { ran: true, value };
  } finally {
    await jobs.finish(job, token).catch(() => false);
  }
}
