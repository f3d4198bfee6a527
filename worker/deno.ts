// Deno Deploy (and plain Deno) entry: configuration from Deno.env, checked before serving.
import { Redis } from "@upstash/redis";
import { createApp } from "../src/service/mod.ts";
import { appSettings, readConfig, type ServiceConfig } from "../src/service/config.ts";
import { openTelemetry } from "../src/otel/mod.ts";
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

// The example cron job, guarded: each 5-minute tick runs at most once even when several isolates
// or a retry fire it. Deno Deploy finds Deno.cron jobs by running the module's top level, so it is
// registered here, before Deno.serve. Locally Deno.cron needs --unstable-cron; without it the
// job is skipped.
const cron = (Deno as unknown as {
  cron?: (name: string, schedule: string, fn: () => Promise<void>) => Promise<void>;
}).cron;
if (typeof cron === "function") {
  const prefix = `${config.keyPrefix}.deno`; // apart from every tenant's "prefix:tenant"
  const jobs = new Jobs(redis, { prefix });
  cron(EXAMPLE_JOB, "*/5 * * * *", async () => {
    const tick = Math.floor(Date.now() / 300_000) * 300_000; // the 5-minute slot
    const result = await runExampleJob(jobs, redis, prefix, tick);
    if (!result.ran) console.log(`${EXAMPLE_JOB}: skipped (${result.reason})`);
  });
}

// Deno Deploy sets the address (DENO_SERVE_ADDRESS overrides these options); locally PORT
// (default 8000) on HOSTNAME (default 127.0.0.1).
Deno.serve(
  {
    port: Number(Deno.env.get("PORT") ?? 8000),
    hostname: Deno.env.get("HOSTNAME") ?? "127.0.0.1",
  },
  // Spans and metrics through @opentelemetry/api: exported by Deno itself with OTEL_DENO=true.
  createApp({ redis, ...appSettings(config), onEvent: openTelemetry() }).fetch,
);
