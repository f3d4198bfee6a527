// Deno Deploy (and plain Deno) entry: configuration from Deno.env, checked before serving.
import { Redis } from "@upstash/redis";
import { createApp } from "../src/service/app.ts";
import { appSettings, readConfig, type ServiceConfig } from "../src/service/config.ts";
import { Jobs } from "../src/uses/jobs.ts";
import { EXAMPLE_JOB, REDIS_OPTIONS, runExampleJob } from "./_shared.ts";

let config: ServiceConfig;
try {
  config = readConfig(Deno.env.toObject());
} catch (error) {
  console.error(`edgelock: ${(error as Error).message}`);
  Deno.exit(1);
}
const redis = new Redis({ url: config.redisUrl, token: config.redisToken, ...REDIS_OPTIONS });
const app = createApp({ redis, ...appSettings(config) });

// Deno Deploy picks its own port; locally PORT (default 8000) on HOSTNAME (default 127.0.0.1).
Deno.serve(
  {
    port: Number(Deno.env.get("PORT") ?? 8000),
    hostname: Deno.env.get("HOSTNAME") ?? "127.0.0.1",
  },
  app.fetch,
);

// The example cron job, guarded: Deno Deploy may start it on several isolates at once. Deno.cron
// needs Deno Deploy or --unstable-cron; elsewhere it is skipped.
const cron = (Deno as unknown as {
  cron?: (name: string, schedule: string, fn: () => Promise<void>) => Promise<void>;
}).cron;
if (typeof cron === "function") {
  const prefix = `${config.keyPrefix}.deno`; // apart from every tenant's "prefix:tenant"
  const jobs = new Jobs(redis, { prefix });
  cron(EXAMPLE_JOB, "*/5 * * * *", async () => {
    const tick = Math.floor(Date.now() / 300_000) * 300_000; // the 5-minute slot
    await runExampleJob(jobs, redis, prefix, tick);
  });
}
