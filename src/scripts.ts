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

/**
 * How long a fence floor outlives its lease: fences keep increasing across this window even if
 * the server clock steps back within it. One hour.
 */
export const FENCE_GRACE_MS = 3_600_000;

/** A busy reply never asks a caller to look again sooner than this, in milliseconds. */
export const MIN_RETRY_MS = 5;

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
// ttlOrSet: a key's TTL; one without a TTL (a PERSIST, a restore, a hand repair) would hold its
// name forever, so it gets `ms` now. Only for keys that exist.
const NOW = `
local time  = redis.call('TIME')
local nowUs = tonumber(time[1]) * 1000000 + tonumber(time[2])
local nowMs = math.floor(nowUs / 1000)
local function ttlOrSet(key, ms)
  local pttl = redis.call('PTTL', key)
  if pttl >= 0 then return pttl end
  redis.call('PEXPIRE', key, ms)
  return ms
end
`;

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
 * position}` when busy: position 0 is the head of the queue, -1 not queued, -2 the queue was full.
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
return {0, math.floor(math.max(${MIN_RETRY_MS}, retryAfter)), nowMs, position}
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

// ---- Records: absent → claimed (short lease, owner token, fence) → completed (retention) ----
// KEYS[1] the record hash (state, token, fence, fingerprint, retentionMs, response), whose TTL
// is the lease while claimed and the retention once completed; KEYS[2] the fence floor.

/**
 * Claim. Returns `{1, fence, leaseMs, nowMs}` when claimed (again, for the same token),
 * `{0, pttl, nowMs}` while another token's claim is in progress, `{2, nowMs, response}` when
 * completed, `{3, nowMs}` when the fingerprint differs from the first claim's.
 */
export const CLAIM = defineScript(
  "claim",
  `
local recordKey   = KEYS[1]
local fenceKey    = KEYS[2]
local token       = ARGV[1]
local leaseMs     = tonumber(ARGV[2]) -- milliseconds
local retentionMs = ARGV[3]           -- milliseconds, applied on complete
local fingerprint = ARGV[4]           -- '' for none
local graceMs     = tonumber(ARGV[5])
${NOW}
local record = redis.call('HMGET', recordKey, 'state', 'token', 'fence', 'fingerprint', 'response')
local state, holder, fence, known = record[1], record[2], record[3], record[4]
if state then
  if fingerprint ~= '' and known and known ~= '' and known ~= fingerprint then
    return {3, nowMs}
  end
  if state == 'completed' then
    ttlOrSet(recordKey, tonumber(redis.call('HGET', recordKey, 'retentionMs')) or ${LIMITS.retentionMs.max})
    return {2, nowMs, record[5] or ''}
  end
  -- Another token's claim, or a record this script did not write: in progress until its TTL.
  if state ~= 'claimed' or holder ~= token or not tonumber(fence) then
    return {0, ttlOrSet(recordKey, leaseMs), nowMs}
  end
  redis.call('PEXPIRE', recordKey, leaseMs)
  redis.call('SET', fenceKey, fence, 'PX', leaseMs + graceMs)
  return {1, tonumber(fence), leaseMs, nowMs}
end
local floor = tonumber(redis.call('GET', fenceKey) or '0') or 0
fence = string.format('%.0f', math.max(nowUs, floor + 1))
redis.call('HSET', recordKey, 'state', 'claimed', 'token', token, 'fence', fence,
  'fingerprint', fingerprint, 'retentionMs', retentionMs)
redis.call('PEXPIRE', recordKey, leaseMs)
redis.call('SET', fenceKey, fence, 'PX', leaseMs + graceMs)
return {1, tonumber(fence), leaseMs, nowMs}
`,
);

/**
 * Renew a claim. Returns `{1, fence, leaseMs, nowMs}`, or `{0, nowMs}` when the token's claim
 * is gone (expired, released, taken over or completed).
 */
export const RENEW_CLAIM = defineScript(
  "renew_claim",
  `
local recordKey = KEYS[1]
local fenceKey  = KEYS[2]
local token     = ARGV[1]
local leaseMs   = tonumber(ARGV[2]) -- milliseconds
local graceMs   = tonumber(ARGV[3])
${NOW}
local record = redis.call('HMGET', recordKey, 'state', 'token', 'fence')
if record[1] ~= 'claimed' or record[2] ~= token then
  return {0, nowMs}
end
redis.call('PEXPIRE', recordKey, leaseMs)
redis.call('SET', fenceKey, record[3], 'PX', leaseMs + graceMs)
return {1, tonumber(record[3]), leaseMs, nowMs}
`,
);

/**
 * Complete a claim: keeps the response for the claim's retention. Returns 1, also when this
 * token already completed it (a retry), else 0: a late worker never overwrites a newer result.
 */
export const COMPLETE = defineScript(
  "complete",
  `
local recordKey = KEYS[1]
local token     = ARGV[1]
local response  = ARGV[2] -- JSON text, or ''
local record = redis.call('HMGET', recordKey, 'state', 'token', 'retentionMs')
if record[2] ~= token then
  return 0
end
if record[1] == 'completed' then
  return 1
end
local retentionMs = tonumber(record[3])
if record[1] ~= 'claimed' or not retentionMs then
  return 0 -- not a claim this script wrote (an older layout, a hand edit): not held
end
redis.call('HSET', recordKey, 'state', 'completed', 'response', response)
redis.call('PEXPIRE', recordKey, retentionMs)
return 1
`,
);

/** Release a claim (the work failed cleanly). Returns 1 when this token's claim was removed. */
export const RELEASE_CLAIM = defineScript(
  "release_claim",
  `
local recordKey = KEYS[1]
local token     = ARGV[1]
local record = redis.call('HMGET', recordKey, 'state', 'token')
if record[1] ~= 'claimed' or record[2] ~= token then
  return 0
end
redis.call('DEL', recordKey)
return 1
`,
);

/**
 * Read a record, never its token. Returns `{0, nowMs}` when absent, `{1, nowMs, pttl, fence}`
 * while claimed, `{2, nowMs, pttl, response}` when completed.
 */
export const GET_RECORD = defineScript(
  "get_record",
  `
local recordKey = KEYS[1]
${NOW}
local record = redis.call('HMGET', recordKey, 'state', 'fence', 'response')
if not record[1] then
  return {0, nowMs}
end
local pttl = ttlOrSet(recordKey, record[1] == 'completed' and ${LIMITS.retentionMs.max} or ${LIMITS.leaseMs.max})
if record[1] ~= 'completed' then
  return {1, nowMs, pttl, tonumber(record[2]) or 0}
end
return {2, nowMs, pttl, record[3] or ''}
`,
);

// ---- Cron jobs, ShedLock semantics ----
// KEYS[1] the job lock (token, fence, finished, notBefore), TTL atMostMs while running and the rest
// of atLeastMs after finish; KEYS[2] the fence floor; KEYS[3] the tick marker (used with a tick).

/**
 * Start a run. Returns `{1, fence, atMostMs, nowMs}` when this caller should run the job,
 * `{0, reason, retryAfterMs, nowMs}` when not: 1 running elsewhere, 2 too soon after the
 * last start, 3 this tick already ran.
 */
export const START_JOB = defineScript(
  "start_job",
  `
local jobKey       = KEYS[1]
local fenceKey     = KEYS[2]
local tickKey      = KEYS[3]
local token        = ARGV[1]
local atMostMs     = tonumber(ARGV[2]) -- milliseconds: the crash safety net
local atLeastMs    = tonumber(ARGV[3]) -- milliseconds: held at least this long after start
local tickKeepMs   = tonumber(ARGV[4]) -- milliseconds a tick marker is kept
local graceMs      = tonumber(ARGV[5])
local hasTick      = ARGV[6] == '1'
${NOW}
if hasTick and redis.call('EXISTS', tickKey) == 1 then
  return {0, 3, math.max(1, ttlOrSet(tickKey, tickKeepMs)), nowMs}
end
local job = redis.call('HMGET', jobKey, 'token', 'finished')
if job[1] then
  local reason = 2
  if job[2] ~= '1' then reason = 1 end
  return {0, reason, math.max(1, ttlOrSet(jobKey, math.max(atMostMs, atLeastMs))), nowMs}
end
local floor = tonumber(redis.call('GET', fenceKey) or '0') or 0
local fence = string.format('%.0f', math.max(nowUs, floor + 1))
redis.call('HSET', jobKey, 'token', token, 'fence', fence, 'finished', '0',
  'notBefore', string.format('%.0f', nowMs + atLeastMs))
redis.call('PEXPIRE', jobKey, math.max(atMostMs, atLeastMs))
redis.call('SET', fenceKey, fence, 'PX', math.max(atMostMs, atLeastMs) + graceMs)
if hasTick then
  redis.call('SET', tickKey, fence, 'PX', tickKeepMs)
end
return {1, tonumber(fence), atMostMs, nowMs}
`,
);

/** Extend a running job's safety net. Returns `{1, fence, atMostMs, nowMs}` or `{0, nowMs}`. */
export const EXTEND_JOB = defineScript(
  "extend_job",
  `
local jobKey   = KEYS[1]
local fenceKey = KEYS[2]
local token    = ARGV[1]
local atMostMs = tonumber(ARGV[2]) -- milliseconds from now
local graceMs  = tonumber(ARGV[3])
${NOW}
local job = redis.call('HMGET', jobKey, 'token', 'finished', 'fence', 'notBefore')
if job[1] ~= token or job[2] ~= '0' or not tonumber(job[3]) or not tonumber(job[4]) then
  return {0, nowMs} -- not this token's run, or not a run this script wrote: not held
end
local ttl = math.max(atMostMs, tonumber(job[4]) - nowMs)
redis.call('PEXPIRE', jobKey, ttl)
redis.call('SET', fenceKey, job[3], 'PX', ttl + graceMs)
return {1, tonumber(job[3]), atMostMs, nowMs}
`,
);

/**
 * Finish a run: the lock stays until atLeastMs after the start, so a trigger on a skewed clock
 * cannot re-run the job. Returns 1 when this token's run was finished (or already was), else 0.
 */
export const FINISH_JOB = defineScript(
  "finish_job",
  `
local jobKey = KEYS[1]
local token  = ARGV[1]
${NOW}
local job = redis.call('HMGET', jobKey, 'token', 'finished', 'notBefore')
if job[1] ~= token then
  return 0
end
if job[2] == '1' then
  return 1
end
if not tonumber(job[3]) then
  return 0 -- not a run this script wrote: not held
end
local left = tonumber(job[3]) - nowMs
if left > 0 then
  redis.call('HSET', jobKey, 'finished', '1')
  redis.call('PEXPIRE', jobKey, left)
else
  redis.call('DEL', jobKey)
end
return 1
`,
);
