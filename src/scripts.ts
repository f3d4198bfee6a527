/**
 * Every lock decision as one Lua script, run atomically on the Redis primary. Each script reads
 * the server clock with TIME, so no decision depends on a client's clock. Written for Redis 6.2
 * semantics (Upstash) and Redis 7.x.
 *
 * Keys per lock name: `KEYS[1]` the lock hash (`token`, `fence`, `meta`), whose TTL is the lease;
 * `KEYS[2]` the fence floor, the last fence issued, which outlives the lease by `graceMs`.
 *
 * @module
 */

/** A Lua script with its SHA-1, computed once with Web Crypto. */
export interface Script {
  readonly name: string;
  readonly source: string;
  sha1(): Promise<string>;
}

/** Defines a script; its SHA-1 is computed on first use and then cached. */
export function defineScript(name: string, source: string): Script {
  let sha1: Promise<string> | undefined;
  return {
    name,
    source,
    sha1: () => sha1 ??= digest(source),
  };
}

async function digest(source: string): Promise<string> {
  const hash = await crypto.subtle.digest("SHA-1", new TextEncoder().encode(source));
  return Array.from(new Uint8Array(hash), (b) => b.toString(16).padStart(2, "0")).join("");
}

// Shared preamble: the server clock in microseconds and milliseconds. Microseconds since the
// epoch are about 1.8e15, well inside the 2^53 that Lua doubles and JSON numbers hold exactly.
const NOW = `
local time  = redis.call('TIME')
local nowUs = tonumber(time[1]) * 1000000 + tonumber(time[2])
local nowMs = math.floor(nowUs / 1000)
`;

/**
 * Acquire. Returns `{1, fence, ttlMs, nowMs}` when acquired (or re-acquired by the same token,
 * keeping its fence), `{0, pttl, nowMs}` when another token holds the lock.
 * A new fence is max(now in µs, floor + 1): strictly increasing while the floor lives, and past
 * its expiry or a data loss still above every earlier fence unless the server clock stepped back.
 */
export const ACQUIRE = defineScript(
  "acquire",
  `
local lockKey  = KEYS[1]
local fenceKey = KEYS[2]
local token    = ARGV[1]
local ttlMs    = tonumber(ARGV[2]) -- milliseconds
local meta     = ARGV[3]           -- JSON object text, or '' for none
local graceMs  = tonumber(ARGV[4]) -- how long the fence floor outlives the lease
${NOW}
local holder = redis.call('HGET', lockKey, 'token')
if holder == token then
  local fence = redis.call('HGET', lockKey, 'fence')
  redis.call('PEXPIRE', lockKey, ttlMs)
  redis.call('SET', fenceKey, fence, 'PX', ttlMs + graceMs)
  return {1, tonumber(fence), ttlMs, nowMs}
end
if holder then
  return {0, redis.call('PTTL', lockKey), nowMs}
end
local floor = tonumber(redis.call('GET', fenceKey) or '0')
local fence = string.format('%.0f', math.max(nowUs, floor + 1))
redis.call('HSET', lockKey, 'token', token, 'fence', fence)
if meta ~= '' then redis.call('HSET', lockKey, 'meta', meta) end
redis.call('PEXPIRE', lockKey, ttlMs)
redis.call('SET', fenceKey, fence, 'PX', ttlMs + graceMs)
return {1, tonumber(fence), ttlMs, nowMs}
`,
);

/** Renew. Returns `{1, fence, ttlMs, nowMs}`, or `{0, nowMs}` when the token no longer holds it. */
export const RENEW = defineScript(
  "renew",
  `
local lockKey  = KEYS[1]
local fenceKey = KEYS[2]
local token    = ARGV[1]
local ttlMs    = tonumber(ARGV[2]) -- milliseconds
local graceMs  = tonumber(ARGV[3])
${NOW}
if redis.call('HGET', lockKey, 'token') ~= token then
  return {0, nowMs}
end
local fence = redis.call('HGET', lockKey, 'fence')
redis.call('PEXPIRE', lockKey, ttlMs)
redis.call('SET', fenceKey, fence, 'PX', ttlMs + graceMs)
return {1, tonumber(fence), ttlMs, nowMs}
`,
);

/** Release. Returns 1 when the token held the lock and it is now free, else 0. */
export const RELEASE = defineScript(
  "release",
  `
local lockKey = KEYS[1]
local token   = ARGV[1]
if redis.call('HGET', lockKey, 'token') ~= token then
  return 0
end
redis.call('DEL', lockKey)
return 1
`,
);

/** Inspect. Returns `{1, fence, pttl, nowMs, meta}` when held, else `{0, nowMs}`; never the token. */
export const INSPECT = defineScript(
  "inspect",
  `
local lockKey = KEYS[1]
${NOW}
local fields = redis.call('HMGET', lockKey, 'fence', 'meta')
if not fields[1] then
  return {0, nowMs}
end
return {1, tonumber(fields[1]), redis.call('PTTL', lockKey), nowMs, fields[2] or ''}
`,
);

/** Health check: proves Redis runs scripts. Returns 1. */
export const PING = defineScript("ping", "return 1");
