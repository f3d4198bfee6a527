// The bridge's options from its environment (the production way to run it): every setting,
// each bad value refused by name. The table of variables is in docs/bridge.md.
import type { BridgeOptions, RequestLog } from "./types.ts";

type Env = (name: string) => string | undefined;

/**
 * The bridge's options from its environment (the production way to run it); a missing or bad
 * value throws a `TypeError` or `RangeError` naming the variable.
 */
export async function bridgeOptionsFromEnv(env: Env): Promise<BridgeOptions> {
  const get = (name: string) => env(name) || undefined;
  const token = get("UPSTASH_REDIS_REST_TOKEN");
  if (!token) throw new TypeError("set UPSTASH_REDIS_REST_TOKEN to the token clients must present");
  const [certFile, keyFile] = [get("BRIDGE_TLS_CERT"), get("BRIDGE_TLS_KEY")];
  if (!certFile !== !keyFile) {
    throw new TypeError("set both BRIDGE_TLS_CERT and BRIDGE_TLS_KEY (PEM files), or neither");
  }
  const keyLocking = oneOf(get, "BRIDGE_KEY_LOCKING", ["accept", "strict"]);
  const scriptUser = oneOf(get, "BRIDGE_SCRIPT_USER", ["restricted", "as-configured"]);
  const log = oneOf(get, "BRIDGE_LOG", ["json", "off"]);
  const clusterUrls = get("REDIS_CLUSTER_URLS")?.split(",").map((url) => url.trim()).filter(
    Boolean,
  );
  for (const url of [get("REDIS_URL"), ...(clusterUrls ?? [])]) {
    if (url !== undefined && !/^rediss?:\/\/[^\s]+$/.test(url)) {
      throw new TypeError(`a Redis URL must look like redis://host:port, not "${url}"`);
    }
  }
  const options: BridgeOptions = {
    redisUrl: get("REDIS_URL") ?? "redis://127.0.0.1:6379",
    token,
    hostname: get("BRIDGE_HOSTNAME") ?? "127.0.0.1",
    ...limits(get),
    corsOrigins: get("BRIDGE_CORS_ORIGINS")?.split(",").map((o) => o.trim()).filter(Boolean) ??
      ["*"],
    ...(clusterUrls?.length && { clusterUrls }),
    ...(keyLocking === "strict" && { strictKeyLocking: true }),
    scriptUser,
    ...(get("UPSTASH_REDIS_REST_READONLY_TOKEN") &&
      { readonlyToken: get("UPSTASH_REDIS_REST_READONLY_TOKEN")! }),
    ...(certFile && keyFile &&
      {
        cert: await read("BRIDGE_TLS_CERT", certFile),
        key: await read("BRIDGE_TLS_KEY", keyFile),
      }),
    ...(log === "json" && { log: (entry: RequestLog) => console.log(JSON.stringify(entry)) }),
  };
  return options;
}

// A variable that takes one of some words; unset, the first.
function oneOf<const T extends string>(get: Env, name: string, words: [T, T]): T {
  const value = get(name) ?? words[0];
  if (!(words as string[]).includes(value)) {
    throw new TypeError(`${name} must be ${words[0]} or ${words[1]}, not "${value}"`);
  }
  return value as T;
}

// The numeric settings, each refused outside its range; unset, its default.
function limits(get: Env) {
  const int = (name: string, min: number, max: number): number | undefined => {
    const text = get(name);
    if (text === undefined) return undefined;
    const value = Number(text);
    if (!/^\d+$/.test(text) || value < min || value > max) {
      throw new RangeError(`${name} must be a whole number from ${min} to ${max}, not "${text}"`);
    }
    return value;
  };
  return {
    port: int("BRIDGE_PORT", 0, 65535) ?? 8079,
    poolSize: int("BRIDGE_POOL_SIZE", 1, 256) ?? 4,
    maxBlocking: int("BRIDGE_MAX_BLOCKING", 0, 10_000) ?? 256,
    commandTimeoutMs: int("BRIDGE_COMMAND_TIMEOUT_MS", 1, 3_600_000) ?? 30_000,
    shutdownGraceMs: int("BRIDGE_GRACE_MS", 0, 600_000) ?? 5000,
    scriptTimeoutMs: int("BRIDGE_SCRIPT_TIMEOUT_MS", 100, 3_600_000) ?? 5000,
    maxSubscriptions: int("BRIDGE_MAX_SUBSCRIPTIONS", 0, 100_000) ?? 1024,
    maxBodyBytes: int("BRIDGE_MAX_BODY_BYTES", 1024, 100 << 20) ?? 1 << 20,
    maxCommands: int("BRIDGE_MAX_COMMANDS", 1, 100_000) ?? 1000,
    maxReplyBytes: int("BRIDGE_MAX_REPLY_BYTES", 1024, 1 << 30) ?? 4 << 20,
    maxBytesInFlight: int("BRIDGE_MAX_BYTES_IN_FLIGHT", 1 << 20, 1 << 30) ?? 32 << 20,
    maxScripts: int("BRIDGE_MAX_SCRIPTS", 0, 1_000_000) ?? 1000,
    maxScriptBytes: int("BRIDGE_MAX_SCRIPT_BYTES", 0, 1 << 30) ?? 16 << 20,
    maxConnections: int("BRIDGE_MAX_CONNECTIONS", 1, 100_000) ?? 256,
    headerTimeoutMs: int("BRIDGE_HEADER_TIMEOUT_MS", 100, 600_000) ?? 10_000,
    idleTimeoutMs: int("BRIDGE_IDLE_TIMEOUT_MS", 100, 3_600_000) ?? 60_000,
  };
}

// A TLS file's PEM text; an unreadable one is refused by its variable's name.
async function read(name: string, file: string): Promise<string> {
  try {
    return await Deno.readTextFile(file);
  } catch (error) {
    throw new TypeError(`${name}: cannot read ${file} (${(error as Error).message})`);
  }
}
