// Cloudflare Workers entry: configuration from bindings (vars and secrets), one app per isolate.
import { Redis } from "@upstash/redis/cloudflare";
import { createApp } from "../src/app.ts";
import { readConfig } from "../src/config.ts";

/** Bindings: vars in wrangler.toml, secrets with `wrangler secret put`. */
export interface Env {
  UPSTASH_REDIS_REST_URL: string;
  UPSTASH_REDIS_REST_TOKEN: string;
  LOCK_API_KEYS: string;
  LOCK_KEY_PREFIX?: string;
}

/** The part of Cloudflare's `ExportedHandler` (from @cloudflare/workers-types) this entry uses. */
interface ExportedHandler<E> {
  fetch(request: Request, env: E, ctx: unknown): Response | Promise<Response>;
}

let cached: { env: Env; app: ReturnType<typeof createApp> } | undefined;

function appFor(env: Env) {
  if (cached?.env !== env) {
    const config = readConfig(env as unknown as Record<string, unknown>);
    const redis = new Redis({
      url: config.redisUrl,
      token: config.redisToken,
      enableTelemetry: false,
      retry: { retries: 2, backoff: (n) => 50 * 2 ** n },
    });
    cached = {
      env,
      app: createApp({ redis, apiKeys: config.apiKeys, keyPrefix: config.keyPrefix }),
    };
  }
  return cached.app;
}

export default {
  fetch(request, env) {
    let app;
    try {
      app = appFor(env);
    } catch (error) {
      console.error("edgelock: bad configuration:", (error as Error).message);
      return Response.json(
        {
          type: "urn:edgelock:problem:internal_error",
          title: "The service is misconfigured",
          status: 500,
          detail: (error as Error).message,
          code: "internal_error",
        },
        { status: 500, headers: { "content-type": "application/problem+json" } },
      );
    }
    return app.fetch(request);
  },
} satisfies ExportedHandler<Env>;
