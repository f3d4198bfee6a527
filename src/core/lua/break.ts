import { defineScript } from "./_define.ts";
import { STATS_KEYS } from "./contracts.ts";
import {
  HOLDERS_LUA,
  INDEX_LUA,
  NOW,
  RECORD_LUA,
  RELEASE_MEMORY_MS,
  RELEASED_MARKS,
  STATS_LUA,
  STATS_RETENTION_MS,
} from "./lib.ts";

/** The number of audit entries a prefix keeps (its stream is trimmed to them). */
export const AUDIT_LENGTH = 1000;

/**
 * Break a held lock (an operator's act): the lease ends now (every holder's, when shared), its
 * fence stays the floor, so the holder's renew and release fail and the next grant gets a higher
 * fence; waiters keep their places. Recorded in the audit stream. Returns `{1, fence, nowMs}`, or
 * `{0, nowMs}` when it was not held (or, with `fence`, held by no lease of that fence: one granted
 * since the caller looked holds it; a shared or semaphore name is broken, every holder's lease,
 * while a holder of that fence is among them). A break with an id is remembered for
 * RELEASE_MEMORY_MS: a retry answers the same and breaks nothing more (never a lease granted
 * since). Breaks by id have
 * a hash of their own, apart from the release marks, which every release trims by fence: id ->
 * `<fence broken, 0 for none>|<seq>`, `#` the last seq; past RELEASED_MARKS ids the oldest goes
 * (by seq, not by fence or clock, which a step back would reorder), a field without one first,
 * never `#` nor the break just written. The seq is read, not HINCRBY'd (which a damaged `#`, a hand
 * edit, would fail), and a `#` lost or damaged is taken again from the highest seq kept; the break
 * is remembered before it ends the lease, so nothing fails after that. The marks also get `~<id>`
 * as before, which earlier builds' retries read (and a retry reads when the hash is gone).
 */
export const BREAK = defineScript(
  "break",
  {
    keys: ["lockKey", "holdersKey", "marksKey", "breaksKey", "auditKey", ...STATS_KEYS],
    args: {
      graceMs: "number",
      name: "string",
      by: "string",
      reason: "string",
      breakId: "string", // '' for none
      fence: "string", // the lease to break, '' for whichever holds it
    },
  },
  [NOW, RECORD_LUA, HOLDERS_LUA, STATS_LUA, INDEX_LUA],
  `
-- a retry: the same answer (a fence, or 0 for not held), nothing more
if breakId ~= '' then
  local kept = redis.call('HGET', breaksKey, breakId)
  local done = tonumber(string.match(kept or '', '^(%d+)|')) or
    tonumber(redis.call('ZSCORE', marksKey, '~' .. breakId))
  if done == 0 then return {0, nowMs} end
  if done then return {1, done, nowMs} end
end
local function remember(fence)
  if breakId == '' then return end
  markReleased(marksKey, '~' .. breakId, fence)
  local last = tonumber(string.match(redis.call('HGET', breaksKey, '#') or '', '^%d+$'))
  if not last or last >= 1e14 then
    last = 0
    local all = redis.call('HGETALL', breaksKey)
    for i = 1, #all, 2 do
      local s = tonumber(string.match(all[i + 1], '|(%d+)$'))
      if s and s < 1e14 then last = math.max(last, s) end
    end
  end
  local seq = string.format('%d', last + 1)
  redis.call('HSET', breaksKey, '#', seq, breakId, fence .. '|' .. seq)
  if redis.call('HLEN', breaksKey) > ${RELEASED_MARKS + 1} then
    local all, oldest, least = redis.call('HGETALL', breaksKey), nil, nil
    for i = 1, #all, 2 do
      if all[i] ~= '#' and all[i] ~= breakId then
        local s = tonumber(string.match(all[i + 1], '|(%d+)$')) or -1
        if not least or s < least then oldest, least = all[i], s end
      end
    end
    if oldest then redis.call('HDEL', breaksKey, oldest) end
  end
  redis.call('PEXPIRE', breaksKey, ${RELEASE_MEMORY_MS})
end
-- whether the lease of \`fence\` holds the name ('' for any)
local function heldByFence(r)
  if fence == '' then return true end
  if not r.shared then return r.fence == fence end
  for _, h in pairs(readHolders(holdersKey, nowMs, false)) do
    if h.fence == fence then return true end
  end
  return false
end
local r = readRecord(lockKey)
if not r or not (r.token or r.shared) or nowMs >= r.leaseEnd or not heldByFence(r) then
  remember(0)
  return {0, nowMs}
end
r.released = r.fence .. ':' .. string.sub(redis.sha1hex('broken:' .. (r.token or 'shared')), 1, 12)
remember(r.fence)
writeReleased(lockKey, r, graceMs)
redis.call('DEL', holdersKey)
indexEnd(endsKey, name, nowMs)
count(statsKey, nowMs, 'break.broken')
redis.call('XADD', auditKey, 'MAXLEN', ${AUDIT_LENGTH}, '*', 'action', 'break', 'name', name,
  'fence', r.fence, 'by', by, 'reason', reason, 'at', nowMs)
redis.call('PEXPIRE', auditKey, ${STATS_RETENTION_MS})
return {1, tonumber(r.fence), nowMs}
`,
);

/** The latest audit entries, newest first: XREVRANGE's reply. Read-only. */
export const READ_AUDIT = defineScript(
  "read_audit",
  { keys: ["auditKey"], args: { limit: "number" } },
  [],
  `
local entries = redis.call('XREVRANGE', auditKey, '+', '-', 'COUNT', limit)
-- each value behind '=', which no JSON text starts with: an Upstash client parses a text that
-- reads as JSON (a reason of 7 or {"a":1}) into something else
for _, entry in ipairs(entries) do
  local fields = entry[2]
  for i = 2, #fields, 2 do fields[i] = '=' .. fields[i] end
end
return entries
`,
  { readOnly: true },
);
