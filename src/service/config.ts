import { type ApiKey, parseApiKeys, parseOperatorKeys } from "./auth.ts";
import type { TenantLimits } from "./_limits.ts";
import { InvalidRange } from "../core/_invalid.ts";

/** The service's settings, read from env vars or Worker bindings by each entry. */
export interface ServiceConfig {
  /** `UPSTASH_REDIS_REST_URL` */
  redisUrl: string;
  /** `UPSTASH_REDIS_REST_TOKEN` */
  redisToken: string;
  /** `LOCK_API_KEYS`, parsed */
  apiKeys: ApiKey[];
  /** `OPERATOR_API_KEYS`, parsed: keys that read every tenant's stats and may break locks */
  operatorKeys: ApiKey[];
  /** `LOCK_KEY_PREFIX` @default "edgelock" */
  keyPrefix: string;
  /** `REDIS_TIMEOUT_MS`: how long one Redis request may take, ms. @default 2000 */
  redisTimeoutMs?: number;
  /** `LOCK_MAX_WAITS` and `LOCK_RATE_LIMIT`: per-tenant caps of one instance. */
  limits: TenantLimits;
  /** `LOCK_KEY_LAYOUT`: `single` (one Redis, the default) or `cluster` (a Redis Cluster). */
  cluster: boolean;
  /**
   * `LOCK_KEY_LOCKING`: `on` or `off` sends the scripts with or without Upstash's
   * `allow-key-locking` flag; `auto` (the default, left undefined) turns it on for `*.upstash.io`.
   */
  keyLocking?: boolean;
}

/** Every setting the service reads; any other `LOCK_*` variable is a mistake. */
export const SETTINGS = [
  "UPSTASH_REDIS_REST_URL",
  "UPSTASH_REDIS_REST_TOKEN",
  "LOCK_API_KEYS",
  "OPERATOR_API_KEYS",
  "LOCK_KEY_PREFIX",
  "LOCK_KEY_LOCKING",
  "REDIS_TIMEOUT_MS",
  "LOCK_MAX_WAITS",
  "LOCK_RATE_LIMIT",
  "LOCK_KEY_LAYOUT",
] as const;

/**
 * Reads and checks the configuration from a plain record (env vars or Worker bindings); throws a
 * RangeError whose message names the variable and what to do. Values are never echoed: they may
 * be secrets.
 */
export function readConfig(env: Record<string, unknown>): ServiceConfig {
  const text = (name: string) => {
    const value = env[name];
    return typeof value === "string" && value.trim() !== "" ? value.trim() : undefined;
  };
  for (const name of Object.keys(env)) {
    if (name.startsWith("LOCK_") && !(SETTINGS as readonly string[]).includes(name)) {
      const near = SETTINGS.find((known) => known.startsWith(name) || name.startsWith(known));
      throw new InvalidRange(
        `${name} is not an edgelock setting${near ? ` (did you mean ${near}?)` : ""}; ` +
          `the settings are ${SETTINGS.join(", ")}`,
      );
    }
  }
  const redisUrl = checkRestUrl(text("UPSTASH_REDIS_REST_URL"));
  const redisToken = text("UPSTASH_REDIS_REST_TOKEN");
  if (!redisToken) {
    throw new InvalidRange(
      "UPSTASH_REDIS_REST_TOKEN is not set: copy the REST token from the Upstash console " +
        "(or the one `deno task dev` prints for its bridge)",
    );
  }
  if (!/^[\x21-\x7e]+$/.test(redisToken) || /^["']|["']$/.test(redisToken)) {
    throw new InvalidRange(
      "UPSTASH_REDIS_REST_TOKEN holds spaces, quotes or non-ASCII characters: paste the token alone",
    );
  }
  const keyPrefix = text("LOCK_KEY_PREFIX") ?? "edgelock";
  if (!/^[A-Za-z0-9._:-]{1,64}$/.test(keyPrefix)) {
    throw new InvalidRange("LOCK_KEY_PREFIX must be 1–64 characters of A-Z a-z 0-9 . _ : -");
  }
  const integer = (name: string, min: number, max: number, unit: string) => {
    const value = text(name);
    if (value === undefined) return undefined;
    if (!/^\d{1,10}$/.test(value) || Number(value) < min || Number(value) > max) {
      throw new InvalidRange(`${name} must be a whole number of ${unit} from ${min} to ${max}`);
    }
    return Number(value);
  };
  const redisTimeoutMs = integer("REDIS_TIMEOUT_MS", 1, 60_000, "milliseconds");
  const apiKeys = parseApiKeys(text("LOCK_API_KEYS"));
  const maxWaits = integer("LOCK_MAX_WAITS", 1, 10_000, "waits per tenant");
  const requestsPerSecond = integer("LOCK_RATE_LIMIT", 0, 1_000_000_000, "requests a second");
  const layout = text("LOCK_KEY_LAYOUT") ?? "single";
  if (layout !== "single" && layout !== "cluster") {
    throw new InvalidRange(
      "LOCK_KEY_LAYOUT must be single (one Redis, Upstash included) or cluster (a Redis Cluster)",
    );
  }
  const locking = text("LOCK_KEY_LOCKING") ?? "auto";
  if (locking !== "auto" && locking !== "on" && locking !== "off") {
    throw new InvalidRange(
      "LOCK_KEY_LOCKING must be auto (on for an Upstash database), on or off (a plain Redis)",
    );
  }
  return {
    redisUrl,
    redisToken,
    apiKeys,
    operatorKeys: parseOperatorKeys(text("OPERATOR_API_KEYS"), apiKeys),
    keyPrefix,
    ...(redisTimeoutMs !== undefined && { redisTimeoutMs }),
    limits: {
      ...(maxWaits !== undefined && { maxWaits }),
      ...(requestsPerSecond !== undefined && { requestsPerSecond }),
    },
    cluster: layout === "cluster",
    ...(locking !== "auto" && { keyLocking: locking === "on" }),
  };
}

function checkRestUrl(value: string | undefined): string {
  const name = "UPSTASH_REDIS_REST_URL";
  if (!value) {
    throw new InvalidRange(
      `${name} is not set: copy the database's REST URL (https://….upstash.io) from the Upstash ` +
        "console, or run `deno task dev`, which prints its bridge's URL",
    );
  }
  const url = URL.canParse(value) ? new URL(value) : undefined;
  if (url && /^rediss?:$/.test(url.protocol)) {
    throw new InvalidRange(
      `${name} is a redis:// URL: use the database's REST URL (https://….upstash.io), not its TCP URL`,
    );
  }
  if (!url || !/^https?:$/.test(url.protocol) || url.username || url.password) {
    throw new InvalidRange(
      `${name} is not an http(s) URL without credentials, like https://….upstash.io`,
    );
  }
  return value;
}

/** The parts of a {@linkcode ServiceConfig} that `createApp` takes besides the Redis client. */
export function appSettings(
  { apiKeys, operatorKeys, keyPrefix, redisTimeoutMs, limits, cluster, keyLocking }: ServiceConfig,
): Omit<ServiceConfig, "redisUrl" | "redisToken"> {
  return {
    apiKeys,
    operatorKeys,
    keyPrefix,
    ...(redisTimeoutMs !== undefined && { redisTimeoutMs }),
    limits,
    cluster,
    ...(keyLocking !== undefined && { keyLocking }),
  };
}
