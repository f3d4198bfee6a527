// A cron job for Node that must not run twice: however many machines fire the same schedule,
// one run per tick (here the current minute, or TICK), never two at once.
//   UPSTASH_REDIS_REST_URL=… UPSTASH_REDIS_REST_TOKEN=… node cron.mjs
import { Redis } from "@upstash/redis";
import { cronGuard, Jobs } from "@edgelock/edgelock/uses";

const jobs = new Jobs(Redis.fromEnv());
const minute = new Date(Math.floor(Date.now() / 60_000) * 60_000);
const tick = process.env.TICK ? new Date(Number(process.env.TICK)) : minute;

const result = await cronGuard(jobs, "nightly-report", {
  atMostMs: 10 * 60_000, // a crashed run frees the job after 10 minutes
  atLeastMs: 30_000, // another machine's trigger within 30 s does not run it again
  tick,
}, async (run, signal) => {
  // Your job: send run.fence with its writes, and stop if signal aborts.
  await new Promise((resolve) => setTimeout(resolve, 300));
  return `report written under fence ${run.fence}${signal.aborted ? " (lost)" : ""}`;
});
console.log(JSON.stringify(result.ran ? { ran: true, value: result.value } : result));
