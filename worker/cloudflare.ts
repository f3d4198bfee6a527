// Cloudflare Workers entry: configuration from bindings (vars and secrets), one app per isolate.
import { Redis } from "@upstash/redis/cloudflare";
import { createApp } from "../src/service/app.ts";
import { appSettings, readConfig } from "../src/service/config.ts";
import { Store } from "../src/uses/store.ts";
import { EXAMPLE_JOB, REDIS_OPTIONS, runExampleJob } from "./_shared.ts";

/** Bindings: vars in wrangler.toml, secrets with `wrangler secret put`. */
interface Env {
  UPSTASH_REDIS_REST_URL: string;
  UPSTASH_REDIS_REST_TOKEN: string;
  LOCK_API_KEYS: string;
  LOCK_KEY_PREFIX?: string;
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

let cached: { env: Env; deps: ReturnType<typeof build> } | undefined;

function build(env: Env) {
  const config = readConfig(env as unknown as Record<string, unknown>);
  const redis = new Redis({ url: config.redisUrl, token: config.redisToken, ...REDIS_OPTIONS });
  const app = createApp({ redis, ...appSettings(config) });
  const prefix = `${config.keyPrefix}.worker`; // "." keeps it apart from every tenant's "prefix:tenant"
  return { app, redis, prefix, store: new Store(redis, { prefix }) };
}

function depsFor(env: Env) {
  if (cached?.env !== env) cached = { env, deps: build(env) };
  return cached.deps;
}

export default {
  fetch(request, env) {
    let deps;
    try {
      deps = depsFor(env);
    } catch (error) {
      console.error("edgelock: bad configuration:", (error as Error).message);
      return Response.json({
        type: "urn:edgelock:problem:internal_error",
        title: "The service is misconfigured",
        status: 500,
        detail: (error as Error).message,
        code: "internal_error",
      }, { status: 500, headers: { "content-type": "application/problem+json" } });
    }
    return deps.app.fetch(request);
  },

  // The cron trigger in wrangler.toml runs the example job; each tick runs at most once, even
  // when Cloudflare fires a trigger twice.
  async scheduled(controller, env) {
    const { redis, store, prefix } = depsFor(env);
    const result = await runExampleJob(store, redis, prefix, controller.scheduledTime);
    if (!result.ran) console.log(`${EXAMPLE_JOB}: skipped (${result.reason})`);
  },
} satisfies ExportedHandler<Env>;
