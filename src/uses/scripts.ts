/**
 * The scripts of the three uses, one atomic decision each, in the style of the lock scripts
 * (`../core/lua/`): each declares its KEYS and ARGV by name, reads the server clock from TIME,
 * passes every key in `KEYS` and puts a TTL on every write.
 *
 * @module
 */
import { defineScript } from "../core/lua/_define.ts";
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
// recordKey: the record hash (state, token, fence, fingerprint, retentionMs, response), whose TTL
// is the lease while claimed and the retention once completed; fenceKey: the fence floor;
// statsKey: the prefix's stats hash (absent with stats off), counted under the label.

/**
 * Claim. Returns `{1, fence, leaseMs, nowMs}` when claimed (again, for the same token),
 * `{0, pttl, nowMs}` while another token's claim is in progress, `{2, nowMs, response}` when
 * completed, `{3, nowMs}` when the fingerprint differs from the first claim's.
 */
export const CLAIM = defineScript(
  "claim",
  {
    keys: ["recordKey", "fenceKey", "statsKey?"],
    args: {
      token: "string",
      leaseMs: "number",
      retentionMs: "string", // applied on complete
      fingerprint: "string", // '' for none
      graceMs: "number",
      label: "string", // 'idempotency' or 'dedupe', for the stats
    },
  },
  [NOW, FENCE_LUA, STATS_LUA],
  `
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
export const RENEW_CLAIM = defineScript(
  "renew_claim",
  {
    keys: ["recordKey", "fenceKey"],
    args: { token: "string", leaseMs: "number", graceMs: "number" },
  },
  [NOW, FENCE_LUA],
  `
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
export const COMPLETE = defineScript(
  "complete",
  {
    keys: ["recordKey"],
    args: { token: "string", response: "string" /* JSON text, or '' */ },
  },
  [],
  `
local record = redis.call('HMGET', recordKey, 'state', 'token', 'retentionMs')
if record[2] ~= token then
  return 0
end
if record[1] == 'completed' then
  return 1
end
local retentionMs = tonumber(record[3])
if record[1] ~= 'claimed' or not retentionMs then
  -- not a claim this script wrote (an older layout, a hand edit): not held
  return 0
end
redis.call('HSET', recordKey, 'state', 'completed', 'response', response)
redis.call('PEXPIRE', recordKey, retentionMs)
return 1
`,
);

/** Release a claim (the work failed cleanly). Returns 1 when this token's claim was removed. */
export const RELEASE_CLAIM = defineScript(
  "release_claim",
  {
    keys: ["recordKey"],
    args: { token: "string" },
  },
  [],
  `
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
  {
    keys: ["recordKey"],
    args: {},
  },
  [NOW],
  `
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
// jobKey: the job lock (token, fence, finished, notBefore), TTL atMostMs while running and the
// rest of atLeastMs after finish; fenceKey: the fence floor; tickKey: the tick marker (used with
// a tick); statsKey: the prefix's stats hash (absent with stats off).

/**
 * Start a run. Returns `{1, fence, atMostMs, nowMs}` when this caller should run the job,
 * `{0, reason, retryAfterMs, nowMs}` when not: 1 running elsewhere, 2 too soon after the
 * last start, 3 this tick already ran. A start retried with the token of a run still unfinished
 * (with a tick, the run that took it: its marker holds the run's fence) is that run again, its
 * safety net extended as by EXTEND_JOB: the first start's reply was lost, not its run.
 */
export const START_JOB = defineScript(
  "start_job",
  {
    keys: ["jobKey", "fenceKey", "tickKey", "statsKey?"],
    args: {
      token: "string",
      atMostMs: "number", // the crash safety net
      atLeastMs: "number", // held at least this long after the start
      tickKeepMs: "number", // how long a tick marker is kept
      graceMs: "number",
      hasTick: "flag",
    },
  },
  [NOW, FENCE_LUA, STATS_LUA],
  `
local job = redis.call('HMGET', jobKey, 'token', 'finished', 'fence', 'notBefore')
if job[1] == token and job[2] == '0' and tonumber(job[3]) and tonumber(job[4]) and
  (not hasTick or redis.call('GET', tickKey) == job[3]) then
  keepFor(jobKey, fenceKey, job[3], math.max(atMostMs, tonumber(job[4]) - nowMs), graceMs)
  return {1, tonumber(job[3]), atMostMs, nowMs}
end
if hasTick and redis.call('EXISTS', tickKey) == 1 then
  count(statsKey, nowMs, 'cron.tick_done')
  ttlOrSet(tickKey, tickKeepMs)
  -- when the job may start again: with a later tick, once no run holds it
  return {0, 3, math.max(0, redis.call('PTTL', jobKey)), nowMs}
end
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
export const EXTEND_JOB = defineScript(
  "extend_job",
  {
    keys: ["jobKey", "fenceKey"],
    args: { token: "string", atMostMs: "number", graceMs: "number" },
  },
  [NOW, FENCE_LUA],
  `
local job = redis.call('HMGET', jobKey, 'token', 'finished', 'fence', 'notBefore')
if job[1] ~= token or job[2] ~= '0' or not tonumber(job[3]) or not tonumber(job[4]) then
  -- not this token's run, or not a run this script wrote: not held
  return {0, nowMs}
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
export const FINISH_JOB = defineScript(
  "finish_job",
  {
    keys: ["jobKey"],
    args: { token: "string" },
  },
  [NOW],
  `
local job = redis.call('HMGET', jobKey, 'token', 'finished', 'notBefore')
if job[1] ~= token then
  return 0
end
if job[2] == '1' then
  return 1
end
if not tonumber(job[3]) then
  -- not a run this script wrote: not held
  return 0
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
export const NOTE = defineScript(
  "note",
  {
    keys: ["statsKey"],
    args: { field: "string" },
  },
  [NOW, STATS_LUA],
  `
count(statsKey, nowMs, field)
return 1
`,
);
