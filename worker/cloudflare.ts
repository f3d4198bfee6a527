// Cloudflare Workers entry: configuration from bindings (vars and secrets), one app per isolate.
import { Redis } from "@upstash/redis/cloudflare";
import { requestIdFrom, serviceApp } from "../src/service/app.ts";
import { appSettings, readConfig, SETTINGS } from "../src/service/config.ts";
import { Jobs } from "../src/uses/jobs.ts";
import { problem } from "../src/hono/_problem.ts";
import { EXAMPLE_JOB, REDIS_OPTIONS, runExampleJob } from "./_shared.ts";

/** Bindings: vars in wrangler.toml, secrets with `wrangler secret put`. */
interface Env {
  UPSTASH_REDIS_REST_URL: string;
  UPSTASH_REDIS_REST_TOKEN: string;
  LOCK_API_KEYS: string;
  LOCK_KEY_PREFIX?: string;
  /** The static assets (wrangler.toml's [assets]): the prebuilt OpenAPI document. */
  ASSETS?: { fetch(input: URL | Request): Promise<Response> };
  REDIS_TIMEOUT_MS?: string;
  LOCK_MAX_WAITS?: string;
  LOCK_RATE_LIMIT?: string;
}

/** The parts of Cloudflare's `ExportedHandler` (from @cloudflare/workers-types) this entry uses. */
interface ExportedHandler<E> {
  fetch(request: Request, env: E, ctx: unknown): Response | Promise<Response>;
  scheduled(
    controller: { scheduledTime: number; cron: string },
    env: E,
    ctx: unknown,
  ): Promise<void>;
}

let cached: { settings: string; deps: ReturnType<typeof build> } | undefined;

function build(env: Env) {
  const config = readConfig(env as unknown as Record<string, unknown>);
  const redis = new Redis({ url: config.redisUrl, token: config.redisToken, ...REDIS_OPTIONS });
  // The OpenAPI document is a static asset: the script does not carry it (a smaller, faster
  // start), and every request still runs the Worker first, so a wrong method is its 405. It is
  // fetched by its own path, without the caller's headers: no redirect, no 304, no range.
  const assets = env.ASSETS;
  const app = serviceApp(
    { redis, ...appSettings(config) },
    (url) =>
      assets ? assets.fetch(new URL("/openapi.json", url)) : new Response(null, { status: 404 }),
  );
  const prefix = `${config.keyPrefix}.worker`; // "." keeps it apart from every tenant's "prefix:tenant"
  return { app, redis, prefix, jobs: new Jobs(redis, { prefix }) };
}

// Workers may hand each request a new env object with the same values: rebuild only when a
// setting changed, not per request.
const settingsOf = (env: Env) =>
  JSON.stringify(SETTINGS.map((name) => (env as unknown as Record<string, unknown>)[name] ?? null));

function depsFor(env: Env) {
  const settings = settingsOf(env);
  if (cached?.settings !== settings) cached = { settings, deps: build(env) };
  return cached.deps;
}

export default {
  fetch(request, env) {
    let deps;
    try {
      deps = depsFor(env);
    } catch (error) {
      // The message names the variable and never its value; the fix is the operator's.
      const detail = `The service is misconfigured: ${(error as Error).message}`;
      console.error(JSON.stringify({ level: "error", msg: "config_error", error: detail }));
      const requestId = requestIdFrom(request.headers.get("x-request-id"));
      return problem(500, "config_error", detail, {
        title: "The service is misconfigured",
        headers: { "cache-control": "no-store", "x-request-id": requestId },
        extra: { requestId },
      });
    }
    return deps.app.fetch(request);
  },

  // The cron trigger in wrangler.toml runs the example job; each tick runs at most once, even
  // when Cloudflare fires a trigger twice.
  async scheduled(controller, env) {
    const { redis, jobs, prefix } = depsFor(env);
    const result = await runExampleJob(jobs, redis, prefix, controller.scheduledTime);
    if (!result.ran) console.log(`${EXAMPLE_JOB}: skipped (${result.reason})`);
  },
} satisfies ExportedHandler<Env>;
