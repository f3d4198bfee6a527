// What both entries share: the Redis client settings and the guarded example cron job.
import type { Redis } from "@upstash/redis";
import { cronGuard, type CronResult } from "../src/uses/cron.ts";
import type { Jobs } from "../src/uses/jobs.ts";

/** Client settings for the service: no telemetry, two quick retries of network errors. */
export const REDIS_OPTIONS = {
  enableTelemetry: false,
  retry: { retries: 2, backoff: (n: number) => 50 * 2 ** n },
};

/** The example job's name; replace the job with your own. */
export const EXAMPLE_JOB = "example-heartbeat";

/**
 * Runs the example job at most once for `tick`: it records the tick and its fence in a list of
 * the last 100 runs under `prefix`.
 */
export function runExampleJob(
  jobs: Jobs,
  redis: Pick<Redis, "lpush" | "ltrim">,
  prefix: string,
  tick: number,
): Promise<CronResult<void>> {
  return cronGuard(
    jobs,
    EXAMPLE_JOB,
    { atMostMs: 60_000, atLeastMs: 30_000, tick },
    async (run) => {
      const key = `${prefix}:${EXAMPLE_JOB}:runs`;
      await redis.lpush(key, JSON.stringify({ tick, fence: run.fence }));
      await redis.ltrim(key, 0, 99);
    },
  );
}
