/**
 * The scripts of the three uses, one atomic decision each, in the style of the lock scripts
 * (`../core/scripts.ts`): the server clock from TIME, every key in `KEYS`, a TTL on every write.
 *
 * @module
 */
import { plainScript } from "../core/lua/_define.ts";
import { NOW } from "../core/lua/now.ts";
import { LIMITS } from "../core/_validate.ts";
import { STATS_LUA } from "../core/stats.ts";

// A claim's or a run's fence: above the floor its fence key keeps (and the clock in µs), and
// kept with the record or job, the floor graceMs longer, so fences keep increasing.
const FENCE_LUA = `
local function nextFence(fenceKey)
  local floor = tonumber(redis.call('GET', fenceKey) or '0') or 0
  return string.format('%.0f', math.max(nowUs, floor + 1))
end
local function keepFor(key, fenceKey, fence, ms, graceMs)
  redis.call('PEXPIRE', key, ms)
  redis.call('SET', fenceKey, fence, 'PX', ms + graceMs)
end
`;

// ---- Records: absent → claimed (short lease, owner token, fence) → completed (retention) ----
// KEYS[1] the record hash (state, token, fence, fingerprint, retentionMs, response), whose TTL
// is the lease while claimed and the retention once completed; KEYS[2] the fence floor; KEYS[3]
// the prefix's stats hash (absent with stats off), counted under ARGV's label.

/**
 * Claim. Returns `{1, fence, leaseMs, nowMs}` when claimed (again, for the same token),
 * `{0, pttl, nowMs}` while another token's claim is in progress, `{2, nowMs, response}` when
 * completed, `{3, nowMs}` when the fingerprint differs from the first claim's.
 */
export const CLAIM = plainScript(
  "claim",
  `
local recordKey   = KEYS[1]
local fenceKey    = KEYS[2]
local token       = ARGV[1]
local leaseMs     = tonumber(ARGV[2]) -- milliseconds
local retentionMs = ARGV[3]           -- milliseconds, applied on complete
local fingerprint = ARGV[4]           -- '' for none
local graceMs     = tonumber(ARGV[5])
local label       = ARGV[6]           -- 'idempotency' or 'dedupe', for the stats
local statsKey    = KEYS[3]
${NOW}${FENCE_LUA}${STATS_LUA}
local record = redis.call('HMGET', recordKey, 'state', 'token', 'fence', 'fingerprint', 'response')
local state, holder, fence, known = record[1], record[2], record[3], record[4]
if state then
  if fingerprint ~= '' and known and known ~= '' and known ~= fingerprint then
    count(statsKey, nowMs, label .. '.mismatch')
    return {3, nowMs}
  end
  if state == 'completed' then
    ttlOrSet(recordKey, tonumber(redis.call('HGET', recordKey, 'retentionMs')) or ${LIMITS.retentionMs.max})
    count(statsKey, nowMs, label .. '.replay')
    return {2, nowMs, record[5] or ''}
  end
  -- Another token's claim, or a record this script did not write: in progress until its TTL.
  if state ~= 'claimed' or holder ~= token or not tonumber(fence) then
    count(statsKey, nowMs, label .. '.conflict')
    return {0, ttlOrSet(recordKey, leaseMs), nowMs}
  end
  keepFor(recordKey, fenceKey, fence, leaseMs, graceMs)
  return {1, tonumber(fence), leaseMs, nowMs}
end
fence = nextFence(fenceKey)
redis.call('HSET', recordKey, 'state', 'claimed', 'token', token, 'fence', fence,
  'fingerprint', fingerprint, 'retentionMs', retentionMs)
keepFor(recordKey, fenceKey, fence, leaseMs, graceMs)
count(statsKey, nowMs, label .. '.first')
return {1, tonumber(fence), leaseMs, nowMs}
`,
);

/**
 * Renew a claim. Returns `{1, fence, leaseMs, nowMs}`, or `{0, nowMs}` when the token's claim
 * is gone (expired, released, taken over or completed).
 */
export const RENEW_CLAIM = plainScript(
  "renew_claim",
  `
local recordKey = KEYS[1]
local fenceKey  = KEYS[2]
local token     = ARGV[1]
local leaseMs   = tonumber(ARGV[2]) -- milliseconds
local graceMs   = tonumber(ARGV[3])
${NOW}${FENCE_LUA}
local record = redis.call('HMGET', recordKey, 'state', 'token', 'fence')
if record[1] ~= 'claimed' or record[2] ~= token then
  return {0, nowMs}
end
keepFor(recordKey, fenceKey, record[3], leaseMs, graceMs)
return {1, tonumber(record[3]), leaseMs, nowMs}
`,
);

/**
 * Complete a claim: keeps the response for the claim's retention. Returns 1, also when this
 * token already completed it (a retry), else 0: a late worker never overwrites a newer result.
 */
export const COMPLETE = plainScript(
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
export const RELEASE_CLAIM = plainScript(
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
export const GET_RECORD = plainScript(
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
// of atLeastMs after finish; KEYS[2] the fence floor; KEYS[3] the tick marker (used with a tick);
// KEYS[4] the prefix's stats hash (absent with stats off).

/**
 * Start a run. Returns `{1, fence, atMostMs, nowMs}` when this caller should run the job,
 * `{0, reason, retryAfterMs, nowMs}` when not: 1 running elsewhere, 2 too soon after the
 * last start, 3 this tick already ran.
 */
export const START_JOB = plainScript(
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
local statsKey     = KEYS[4]
${NOW}${FENCE_LUA}${STATS_LUA}
if hasTick and redis.call('EXISTS', tickKey) == 1 then
  count(statsKey, nowMs, 'cron.tick_done')
  return {0, 3, math.max(1, ttlOrSet(tickKey, tickKeepMs)), nowMs}
end
local job = redis.call('HMGET', jobKey, 'token', 'finished')
if job[1] then
  local reason = 2
  if job[2] ~= '1' then reason = 1 end
  count(statsKey, nowMs, reason == 1 and 'cron.running' or 'cron.too_soon')
  return {0, reason, math.max(1, ttlOrSet(jobKey, math.max(atMostMs, atLeastMs))), nowMs}
end
local fence = nextFence(fenceKey)
redis.call('HSET', jobKey, 'token', token, 'fence', fence, 'finished', '0',
  'notBefore', string.format('%.0f', nowMs + atLeastMs))
keepFor(jobKey, fenceKey, fence, math.max(atMostMs, atLeastMs), graceMs)
if hasTick then
  redis.call('SET', tickKey, fence, 'PX', tickKeepMs)
end
count(statsKey, nowMs, 'cron.run')
return {1, tonumber(fence), atMostMs, nowMs}
`,
);

/** Extend a running job's safety net. Returns `{1, fence, atMostMs, nowMs}` or `{0, nowMs}`. */
export const EXTEND_JOB = plainScript(
  "extend_job",
  `
local jobKey   = KEYS[1]
local fenceKey = KEYS[2]
local token    = ARGV[1]
local atMostMs = tonumber(ARGV[2]) -- milliseconds from now
local graceMs  = tonumber(ARGV[3])
${NOW}${FENCE_LUA}
local job = redis.call('HMGET', jobKey, 'token', 'finished', 'fence', 'notBefore')
if job[1] ~= token or job[2] ~= '0' or not tonumber(job[3]) or not tonumber(job[4]) then
  return {0, nowMs} -- not this token's run, or not a run this script wrote: not held
end
local ttl = math.max(atMostMs, tonumber(job[4]) - nowMs)
keepFor(jobKey, fenceKey, job[3], ttl, graceMs)
return {1, tonumber(job[3]), atMostMs, nowMs}
`,
);

/**
 * Finish a run: the lock stays until atLeastMs after the start, so a trigger on a skewed clock
 * cannot re-run the job. Returns 1 when this token's run was finished (or already was), else 0.
 */
export const FINISH_JOB = plainScript(
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

/** Count one event that no decision script sees, e.g. a webhook's bad signature. Returns 1. */
export const NOTE = plainScript(
  "note",
  `
local statsKey = KEYS[1]
${NOW}${STATS_LUA}
count(statsKey, nowMs, ARGV[1])
return 1
`,
);
