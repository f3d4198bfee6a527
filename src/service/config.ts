import { type ApiKey, parseApiKeys } from "./auth.ts";
import type { TenantLimits } from "./_limits.ts";

/** The service's settings, read from env vars or Worker bindings by each entry. */
export interface ServiceConfig {
  /** `UPSTASH_REDIS_REST_URL` */
  redisUrl: string;
  /** `UPSTASH_REDIS_REST_TOKEN` */
  redisToken: string;
  /** `LOCK_API_KEYS`, parsed */
  apiKeys: ApiKey[];
  /** `LOCK_KEY_PREFIX` @default "edgelock" */
  keyPrefix: string;
  /** `REDIS_TIMEOUT_MS`: how long one Redis request may take, ms. @default 2000 */
  redisTimeoutMs?: number;
  /** `LOCK_MAX_WAITS` and `LOCK_RATE_LIMIT`: per-tenant caps of one instance. */
  limits: TenantLimits;
}

/** Reads and checks the configuration from a plain record; throws a RangeError naming the variable. */
export function readConfig(env: Record<string, unknown>): ServiceConfig {
  const text = (name: string) => {
    const value = env[name];
    return typeof value === "string" && value.trim() !== "" ? value.trim() : undefined;
  };
  const redisUrl = text("UPSTASH_REDIS_REST_URL");
  const redisToken = text("UPSTASH_REDIS_REST_TOKEN");
  if (!redisUrl || !URL.canParse(redisUrl)) {
    throw new RangeError("UPSTASH_REDIS_REST_URL must be set to the database's REST URL");
  }
  if (!redisToken) throw new RangeError("UPSTASH_REDIS_REST_TOKEN must be set");
  const keyPrefix = text("LOCK_KEY_PREFIX") ?? "edgelock";
  if (!/^[A-Za-z0-9._:-]{1,64}$/.test(keyPrefix)) {
    throw new RangeError("LOCK_KEY_PREFIX must be 1–64 characters of A-Z a-z 0-9 . _ : -");
  }
  const integer = (name: string) => {
    const value = text(name);
    if (value === undefined) return undefined;
    if (!/^\d{1,9}$/.test(value)) throw new RangeError(`${name} must be a whole number`);
    return Number(value);
  };
  const redisTimeoutMs = integer("REDIS_TIMEOUT_MS");
  const maxWaits = integer("LOCK_MAX_WAITS");
  const requestsPerSecond = integer("LOCK_RATE_LIMIT");
  return {
    redisUrl,
    redisToken,
    apiKeys: parseApiKeys(text("LOCK_API_KEYS")),
    keyPrefix,
    ...(redisTimeoutMs !== undefined && { redisTimeoutMs }),
    limits: {
      ...(maxWaits !== undefined && { maxWaits }),
      ...(requestsPerSecond !== undefined && { requestsPerSecond }),
    },
  };
}

/** The parts of a {@linkcode ServiceConfig} that `createApp` takes besides the Redis client. */
export function appSettings(
  { apiKeys, keyPrefix, redisTimeoutMs, limits }: ServiceConfig,
): { apiKeys: ApiKey[]; keyPrefix: string; redisTimeoutMs?: number; limits: TenantLimits } {
  return { apiKeys, keyPrefix, ...(redisTimeoutMs !== undefined && { redisTimeoutMs }), limits };
}
