/**
 * Every lock decision as one Lua script, run atomically on the Redis primary. Each script reads
 * the server clock with TIME, so no decision depends on a client's clock. Written for Redis 6.2
 * semantics (Upstash) and Redis 7.x. Every key a script touches is passed in `KEYS`, and every
 * key a script writes carries a TTL.
 *
 * Keys per lock name, all in one hash slot: `KEYS[1]` the lock hash (`token`, `fence`, `at`,
 * `meta`), whose TTL is the lease; `KEYS[2]` the fence floor hash (`fence`: the last fence issued;
 * `released`: `token:fence` of the last release, so a retried release answers the same; `holdMs`:
 * recent hold times), which outlives the lease by `graceMs`; `KEYS[3]` the wait queue (tokens by
 * arrival) and `KEYS[4]` its tickets (tokens by deadline), which live as long as the latest ticket.
 *
 * @module
 */

import { LIMITS } from "./_validate.ts";
import { defineScript, NOW } from "./_lua.ts";

/**
 * How long a fence floor outlives its lease: fences keep increasing across this window even if
 * the server clock steps back within it. One hour.
 */
export const FENCE_GRACE_MS = 3_600_000;

/** A busy reply never asks a caller to look again sooner than this, in milliseconds. */
export const MIN_RETRY_MS = 5;

// A lock's fence floor outlives the lease by graceMs. A floor that was lost (evicted) is written
// again from the lease's fence, so it never lives without a TTL and never falls below that fence.
const KEEP_FLOOR = `
local function keepFloor(fenceKey, fence, ms)
  redis.call('HSETNX', fenceKey, 'fence', fence)
  redis.call('PEXPIRE', fenceKey, ms)
end
`;

// Hold times feed busy replies' hints. A server clock that steps between grant and release gives
// a sample outside any real hold; each sample and the average stay within 1 ms and the longest TTL.
const MAX_HOLD_MS = LIMITS.ttlMs.max;
const CLAMP = `
local function clamp(value, low, high) return math.min(math.max(value, low), high) end
`;

/**
 * Acquire, with a fair, bounded queue of waiters. Returns `{1, fence, ttlMs, nowMs}` when
 * acquired (or re-acquired by the same token, keeping its fence), `{0, retryAfterMs, nowMs,
 * position, pttl}` when busy: position 0 is the head of the queue, -1 not queued, -2 the queue was
 * full; pttl is the holder's lease left, ms (0 when free but kept for the head of the queue).
 * A new fence is max(now in µs, floor + 1): strictly increasing while the floor lives, and past its
 * expiry or a data loss still above every earlier fence unless the server clock stepped back.
 *
 * Waiters (`ticketMs` > 0) take a FIFO ticket; a free lock goes to the head of the queue only,
 * and everyone else (waiting or not) is busy until it takes it or its ticket lapses. A ticket
 * lives `ticketMs` from each call, so a waiter that gave up or crashed blocks nobody for longer;
 * each call drops every lapsed ticket (at most `maxWaiters`, the queue's bound), wherever it is.
 * `retryAfterMs` is when to look again: the holder's expected time left from recent hold times,
 * one more hold time per place further back, never past the holder's TTL (or, with no holder,
 * the head's ticket), never under MIN_RETRY_MS.
 */
export const ACQUIRE = defineScript(
  "acquire",
  `
local lockKey    = KEYS[1]
local fenceKey   = KEYS[2]
local queueKey   = KEYS[3]           -- sorted set: waiting tokens by arrival
local ticketsKey = KEYS[4]           -- sorted set: waiting tokens by ticket deadline, ms
local token      = ARGV[1]
local ttlMs      = tonumber(ARGV[2]) -- milliseconds
local meta       = ARGV[3]           -- JSON object text, or '' for none
local graceMs    = tonumber(ARGV[4]) -- how long the fence floor outlives the lease
local ticketMs   = tonumber(ARGV[5]) -- milliseconds a waiter's ticket lives; 0: do not queue
local maxWaiters = tonumber(ARGV[6]) -- the queue's bound
${NOW}${KEEP_FLOOR}${CLAMP}
local holder = redis.call('HGET', lockKey, 'token')
if holder == token then
  local fence = redis.call('HGET', lockKey, 'fence')
  redis.call('PEXPIRE', lockKey, ttlMs)
  keepFloor(fenceKey, fence, ttlMs + graceMs)
  return {1, tonumber(fence), ttlMs, nowMs}
end
local head = redis.call('ZRANGE', queueKey, 0, 0)[1]
if head then -- the queue and its tickets hold the same tokens: no head, no tickets
  local lapsed = redis.call('ZRANGEBYSCORE', ticketsKey, '-inf', nowMs, 'LIMIT', 0, maxWaiters)
  if #lapsed > 0 then
    redis.call('ZREM', queueKey, unpack(lapsed))
    redis.call('ZREM', ticketsKey, unpack(lapsed))
    head = redis.call('ZRANGE', queueKey, 0, 0)[1]
  end
end
if not holder and (not head or head == token) then
  if head then
    redis.call('ZREM', queueKey, token)
    redis.call('ZREM', ticketsKey, token)
  end
  local floor = tonumber(redis.call('HGET', fenceKey, 'fence') or '0') or 0
  local fence = string.format('%.0f', math.max(nowUs, floor + 1))
  redis.call('HSET', lockKey, 'token', token, 'fence', fence, 'at', nowMs)
  if meta ~= '' then redis.call('HSET', lockKey, 'meta', meta) end
  redis.call('PEXPIRE', lockKey, ttlMs)
  redis.call('HSET', fenceKey, 'fence', fence)
  redis.call('PEXPIRE', fenceKey, ttlMs + graceMs)
  return {1, tonumber(fence), ttlMs, nowMs}
end
local pttl = 0
if holder then pttl = ttlOrSet(lockKey, ${LIMITS.ttlMs.max}) end
local position = -1
if ticketMs > 0 then
  if redis.call('ZSCORE', queueKey, token) then
    position = 0
  elseif redis.call('ZCARD', queueKey) >= maxWaiters then
    position = -2
  else
    -- Arrival order from the queue itself: one past the last waiter's place.
    local last = redis.call('ZRANGE', queueKey, -1, -1, 'WITHSCORES')[2]
    redis.call('ZADD', queueKey, (tonumber(last) or 0) + 1, token)
    position = 0
  end
  if position == 0 then
    redis.call('ZADD', ticketsKey, nowMs + ticketMs, token)
    -- The queue lives as long as its latest ticket, so no ticket dies before its deadline.
    local latest = tonumber(redis.call('ZRANGE', ticketsKey, -1, -1, 'WITHSCORES')[2])
    redis.call('PEXPIRE', queueKey, math.max(latest - nowMs, 1))
    redis.call('PEXPIRE', ticketsKey, math.max(latest - nowMs, 1))
    position = redis.call('ZRANK', queueKey, token)
  end
end
local holdMs = clamp(tonumber(redis.call('HGET', fenceKey, 'holdMs') or '20') or 20, 1, ${MAX_HOLD_MS})
-- The holder's expected time left, then one hold per waiter ahead. A holder past the usual hold
-- time may hold much longer: look again after half the time it has held so far (backoff).
local left = holdMs
local cap
local held = 0
if holder then
  held = clamp(nowMs - (tonumber(redis.call('HGET', lockKey, 'at') or nowMs) or nowMs), 0, ${MAX_HOLD_MS})
  left = math.max(holdMs - held, held / 2, 1)
  cap = pttl
else
  -- Free, but kept for the head: it takes the lock or its ticket lapses by then.
  cap = (tonumber(redis.call('ZSCORE', ticketsKey, head)) or nowMs) - nowMs
end
-- Within the usual hold the head looks twice per hold, so the hand-off waits for its next look;
-- past it, the head backs off like everyone else.
if position == 0 and (not holder or held <= holdMs) then left = math.min(left, math.max(holdMs / 2, 1)) end
local retryAfter = math.min(left + holdMs * math.max(position, 0), cap)
return {0, math.floor(math.max(${MIN_RETRY_MS}, retryAfter)), nowMs, position, pttl}
`,
);

/** Leave the queue (a waiter gave up). Returns 1 when its ticket was removed. */
export const LEAVE_QUEUE = defineScript(
  "leave_queue",
  `
local queueKey   = KEYS[1]
local ticketsKey = KEYS[2]
local token      = ARGV[1]
redis.call('ZREM', ticketsKey, token)
return redis.call('ZREM', queueKey, token)
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
${NOW}${KEEP_FLOOR}
local lock = redis.call('HMGET', lockKey, 'token', 'fence')
if lock[1] ~= token then
  return {0, nowMs}
end
redis.call('PEXPIRE', lockKey, ttlMs)
keepFloor(fenceKey, lock[2], ttlMs + graceMs)
return {1, tonumber(lock[2]), ttlMs, nowMs}
`,
);

/**
 * Release. Returns 1 when the token held the lock and it is now free, also when this lease's
 * release already freed it (a retried or duplicated request), else 0. The last release is kept as
 * `token:fence`: with the lease's fence, a retry matches exactly that lease; without it, only
 * while no lease was granted since. So a token whose later lease was lost learns so, even though
 * an earlier lease of the same token was released.
 */
export const RELEASE = defineScript(
  "release",
  `
local lockKey  = KEYS[1]
local fenceKey = KEYS[2]
local token    = ARGV[1]
local graceMs  = tonumber(ARGV[2])
local fence    = ARGV[3]           -- the lease's fence, or '' when the caller does not know it
local lock = redis.call('HMGET', lockKey, 'token', 'fence', 'at')
if lock[1] ~= token or (fence ~= '' and lock[2] ~= fence) then
  local floor = redis.call('HMGET', fenceKey, 'fence', 'released')
  if fence == '' then fence = floor[1] end
  if fence and floor[2] == token .. ':' .. fence then return 1 end
  return 0
end
${NOW}${CLAMP}
redis.call('DEL', lockKey)
-- A moving average of hold times, for waiters' hints. A negative hold means the server clock
-- stepped back: no sample. A forward step counts as at most the longest lease.
local sample = nowMs - (tonumber(lock[3]) or nowMs)
local holdMs = tonumber(redis.call('HGET', fenceKey, 'holdMs'))
if sample >= 0 then
  sample = clamp(sample, 1, ${MAX_HOLD_MS})
  holdMs = (clamp(holdMs or sample, 1, ${MAX_HOLD_MS}) + sample) / 2
end
-- The floor is written again (it may have been lost).
redis.call('HSET', fenceKey, 'fence', lock[2], 'released', token .. ':' .. lock[2],
  'holdMs', string.format('%.1f', holdMs or 20))
redis.call('PEXPIRE', fenceKey, graceMs)
return 1
`,
);

/**
 * Inspect. Returns `{1, fence, pttl, nowMs, meta}` when held, else `{0, nowMs}`; never the token.
 * A lock found without a TTL gets the longest lease from now (it would otherwise be held forever).
 */
export const INSPECT = defineScript(
  "inspect",
  `
local lockKey = KEYS[1]
${NOW}
local fields = redis.call('HMGET', lockKey, 'fence', 'meta')
if not fields[1] then
  return {0, nowMs}
end
return {1, tonumber(fields[1]), ttlOrSet(lockKey, ${LIMITS.ttlMs.max}), nowMs, fields[2] or ''}
`,
);

/** Health check: proves Redis runs scripts. Returns 1. */
export const PING = defineScript("ping", "return 1");
