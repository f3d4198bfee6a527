/**
 * The edgelock HTTP service as a Hono app, runtime-agnostic: each runtime's entry builds its
 * dependencies (a Redis client, the API keys) from its own environment.
 *
 * @example
 * ```ts
 * import { Redis } from "@upstash/redis";
 * import { appSettings, createApp, readConfig } from "@edgelock/edgelock/service";
 *
 * const config = readConfig(Deno.env.toObject());
 * const redis = new Redis({ url: config.redisUrl, token: config.redisToken });
 * Deno.serve(createApp({ redis, ...appSettings(config) }).fetch);
 * ```
 *
 * @module
 */
import type { Hono } from "hono";
import { type AppDeps, serviceApp } from "./app.ts";
import type { AppEnv } from "./_env.ts";
import DOCUMENT from "./openapi.json" with { type: "json" };

export { type AppDeps, MAX_BODY_BYTES, type RequestLog } from "./app.ts";
export type { AppEnv, TenantStores } from "./_env.ts";
export { DEFAULT_LIMITS, type TenantLimits } from "./_limits.ts";
export { type ApiKey, parseApiKeys, parseOperatorKeys } from "./auth.ts";
export { appSettings, readConfig, type ServiceConfig } from "./config.ts";

/** The edgelock HTTP service as a Hono app, its OpenAPI document built in; runtime-agnostic. */
export function createApp(deps: AppDeps): Hono<AppEnv> {
  return serviceApp(deps, () => Response.json(DOCUMENT));
}
