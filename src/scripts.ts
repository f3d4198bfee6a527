/**
 * Every lock decision as one Lua script, run atomically on the Redis primary. Each script reads
 * the server clock with TIME, so no decision depends on a client's clock. Written for Redis 6.2
 * semantics (Upstash) and Redis 7.x.
 *
 * Keys per lock name: `KEYS[1]` the lock hash (`token`, `fence`, `meta`), whose TTL is the lease;
 * `KEYS[2]` the fence floor hash (`fence`: the last fence issued; `released`: the token that last
 * released the lock, so a retried release answers the same), which outlives the lease by `graceMs`.
 *
 * @module
 */

/**
 * How long a fence floor outlives its lease: fences keep increasing across this window even if
 * the server clock steps back within it. One hour.
 */
export const FENCE_GRACE_MS = 3_600_000;

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
 * Acquire, with a fair queue of waiters. Returns `{1, fence, ttlMs, nowMs}` when acquired (or
 * re-acquired by the same token, keeping its fence), `{0, retryAfterMs, nowMs, position}` when
 * busy. A new fence is max(now in µs, floor + 1): strictly increasing while the floor lives, and
 * past its expiry or a data loss still above every earlier fence unless the server clock stepped
 * back.
 *
 * Waiters (`ticketMs` > 0) take a FIFO ticket; a free lock goes to the head of the queue only,
 * and everyone else (waiting or not) is busy until it takes it or its ticket lapses. A ticket
 * lives `ticketMs` from each call, so a waiter that gave up or crashed blocks nobody for longer.
 * `retryAfterMs` is when to look again: the holder's expected time left from recent hold times,
 * one more hold time per place further back, never past the holder's TTL.
 */
export const ACQUIRE = defineScript(
  "acquire",
  `
local lockKey  = KEYS[1]
local fenceKey = KEYS[2]
local queueKey = KEYS[3]           -- sorted set: waiting tokens by arrival
local token    = ARGV[1]
local ttlMs    = tonumber(ARGV[2]) -- milliseconds
local meta     = ARGV[3]           -- JSON object text, or '' for none
local graceMs  = tonumber(ARGV[4]) -- how long the fence floor outlives the lease
local ticketMs = tonumber(ARGV[5]) -- milliseconds a waiter's ticket lives; 0: do not queue
${NOW}
local holder = redis.call('HGET', lockKey, 'token')
if holder == token then
  local fence = redis.call('HGET', lockKey, 'fence')
  redis.call('PEXPIRE', lockKey, ttlMs)
  redis.call('PEXPIRE', fenceKey, ttlMs + graceMs)
  return {1, tonumber(fence), ttlMs, nowMs}
end
-- Drop lapsed tickets at the head (the score's fraction is not used: deadlines live in the hash).
local head
while true do
  head = redis.call('ZRANGE', queueKey, 0, 0)[1]
  if not head then break end
  local deadline = tonumber(redis.call('HGET', queueKey .. ':deadline', head) or '0')
  if deadline > nowMs then break end
  redis.call('ZREM', queueKey, head)
  redis.call('HDEL', queueKey .. ':deadline', head)
end
if not holder and (not head or head == token) then
  if head then
    redis.call('ZREM', queueKey, token)
    redis.call('HDEL', queueKey .. ':deadline', token)
  end
  local floor = tonumber(redis.call('HGET', fenceKey, 'fence') or '0')
  local fence = string.format('%.0f', math.max(nowUs, floor + 1))
  redis.call('HSET', lockKey, 'token', token, 'fence', fence, 'at', nowMs)
  if meta ~= '' then redis.call('HSET', lockKey, 'meta', meta) end
  redis.call('PEXPIRE', lockKey, ttlMs)
  redis.call('HSET', fenceKey, 'fence', fence)
  redis.call('PEXPIRE', fenceKey, ttlMs + graceMs)
  return {1, tonumber(fence), ttlMs, nowMs}
end
local pttl = 0
if holder then pttl = redis.call('PTTL', lockKey) end
local position = -1
if ticketMs > 0 then
  if not redis.call('ZSCORE', queueKey, token) then
    redis.call('ZADD', queueKey, redis.call('HINCRBY', fenceKey, 'seq', 1), token)
  end
  redis.call('HSET', queueKey .. ':deadline', token, nowMs + ticketMs)
  redis.call('PEXPIRE', queueKey, ttlMs + ticketMs)
  redis.call('PEXPIRE', queueKey .. ':deadline', ttlMs + ticketMs)
  position = redis.call('ZRANK', queueKey, token)
end
local holdMs = tonumber(redis.call('HGET', fenceKey, 'holdMs') or '20')
-- The holder's expected time left, then one hold per waiter ahead. A holder past the usual hold
-- time may hold much longer: look again after half the time it has held so far (backoff).
local left = holdMs
if holder then
  local held = nowMs - tonumber(redis.call('HGET', lockKey, 'at') or nowMs)
  left = math.min(math.max(holdMs - held, held / 2, 1), pttl)
end
-- The head looks twice per usual hold: the hand-off waits for its next look.
if position == 0 then left = math.min(left, math.max(holdMs / 2, 1)) end
local retryAfter = left + holdMs * math.max(position, 0)
if holder then retryAfter = math.min(retryAfter, pttl) end
return {0, math.max(1, math.floor(retryAfter)), nowMs, position}
`,
);

/** Leave the queue (a waiter gave up). Returns 1 when its ticket was removed. */
export const LEAVE_QUEUE = defineScript(
  "leave_queue",
  `
local queueKey = KEYS[1]
local token    = ARGV[1]
redis.call('HDEL', queueKey .. ':deadline', token)
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
${NOW}
if redis.call('HGET', lockKey, 'token') ~= token then
  return {0, nowMs}
end
local fence = redis.call('HGET', lockKey, 'fence')
redis.call('PEXPIRE', lockKey, ttlMs)
redis.call('PEXPIRE', fenceKey, ttlMs + graceMs)
return {1, tonumber(fence), ttlMs, nowMs}
`,
);

/**
 * Renew many leases in one request. KEYS are (lock, fence floor) pairs, ARGV[3..] the tokens in
 * the same order. Returns each lease's fence, or 0 where the token no longer holds it, then nowMs.
 */
export const RENEW_MANY = defineScript(
  "renew_many",
  `
local ttlMs   = tonumber(ARGV[1]) -- milliseconds
local graceMs = tonumber(ARGV[2])
${NOW}
local fences = {}
for i = 1, #KEYS / 2 do
  local lockKey, fenceKey, token = KEYS[2 * i - 1], KEYS[2 * i], ARGV[i + 2]
  if redis.call('HGET', lockKey, 'token') == token then
    redis.call('PEXPIRE', lockKey, ttlMs)
    redis.call('PEXPIRE', fenceKey, ttlMs + graceMs)
    fences[i] = tonumber(redis.call('HGET', lockKey, 'fence'))
  else
    fences[i] = 0
  end
end
fences[#fences + 1] = nowMs
return fences
`,
);

/**
 * Release. Returns 1 when the token held the lock and it is now free, also when this token's
 * release already freed it (a retried or duplicated request), else 0.
 */
export const RELEASE = defineScript(
  "release",
  `
local lockKey  = KEYS[1]
local fenceKey = KEYS[2]
local token    = ARGV[1]
if redis.call('HGET', lockKey, 'token') ~= token then
  if redis.call('HGET', fenceKey, 'released') == token then return 1 end
  return 0
end
${NOW}
local at = tonumber(redis.call('HGET', lockKey, 'at') or nowMs)
local holdMs = tonumber(redis.call('HGET', fenceKey, 'holdMs') or (nowMs - at))
redis.call('DEL', lockKey)
-- A moving average of hold times, for waiters' retryAfterMs.
redis.call('HSET', fenceKey, 'released', token, 'holdMs', string.format('%.1f', (holdMs + nowMs - at) / 2))
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
    return {2, nowMs, record[5] or ''}
  end
  if holder ~= token then
    return {0, redis.call('PTTL', recordKey), nowMs}
  end
  redis.call('PEXPIRE', recordKey, leaseMs)
  redis.call('SET', fenceKey, fence, 'PX', leaseMs + graceMs)
  return {1, tonumber(fence), leaseMs, nowMs}
end
local floor = tonumber(redis.call('GET', fenceKey) or '0')
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
redis.call('HSET', recordKey, 'state', 'completed', 'response', response)
redis.call('PEXPIRE', recordKey, tonumber(record[3]))
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
local pttl = redis.call('PTTL', recordKey)
if record[1] == 'claimed' then
  return {1, nowMs, pttl, tonumber(record[2])}
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
  return {0, 3, math.max(1, redis.call('PTTL', tickKey)), nowMs}
end
local job = redis.call('HMGET', jobKey, 'token', 'finished')
if job[1] then
  local reason = 2
  if job[2] ~= '1' then reason = 1 end
  return {0, reason, math.max(1, redis.call('PTTL', jobKey)), nowMs}
end
local floor = tonumber(redis.call('GET', fenceKey) or '0')
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
if job[1] ~= token or job[2] ~= '0' then
  return {0, nowMs}
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
