import { defineScript } from "./_define.ts";
import { STATS_KEYS } from "./contracts.ts";
import {
  HANDOFF_LUA,
  HOLDERS_LUA,
  INDEX_LUA,
  MAX_HOLD_MS,
  NOW,
  QUEUE_LUA,
  RECORD_LUA,
  STATS_LUA,
} from "./lib.ts";

/**
 * Release, any kind of lease. Returns `{released, head, ended}`: released is 1 when the token held it (and it is now free, or, for a
 * reentrant lease, one hold fewer: the hold named by `hold`, none when that hold is gone, as for
 * a retry), also when this release already went through (a retried or duplicated request), else
 * 0. Every release that frees a lease is
 * remembered by token for RELEASE_MEMORY_MS (the last RELEASED_MARKS of a name; a grant to the
 * token forgets it): with the lease's fence, a retry matches exactly that lease; without it, the
 * token's latest lease, if that one was released.
 *
 * A release that frees the name hands it to the head of the queue in place when the head blocks
 * on the wake key the caller declared (`wakeKey`, `wakeId`: the hint of its grant); `head` is the
 * head's wake id when it blocks on another, for `./hand_over.ts`, else ''; ended is 1 when the
 * lease ended (its last hold released), else absent.
 */
export const RELEASE = defineScript(
  "release",
  {
    keys: [
      "lockKey",
      "holdersKey",
      "marksKey",
      "queueKey",
      "ticketsKey",
      "offersKey",
      "wakeKey",
      ...STATS_KEYS,
    ],
    args: {
      token: "string",
      graceMs: "number",
      fence: "string", // the lease's fence, or '' when the caller does not know it
      name: "string",
      hold: "string", // a reentrant hold's id, or ''
      wakeId: "string", // the id of wakeKey, the hinted next holder's, or ''
    },
  },
  [NOW, RECORD_LUA, HOLDERS_LUA, QUEUE_LUA, INDEX_LUA, STATS_LUA, HANDOFF_LUA],
  `
local function lost()
  count(statsKey, nowMs, 'release.lost')
  return {0, ''}
end
-- The name is free: the head of the queue may take it now, handed over in place (which writes
-- its lease), else the record says released (\`ttl\` its TTL, nil to keep it). The reply's third
-- element says the lease ended (1), for the caller's hand-off hint.
local function freed(r, ttl)
  local handed = r.flag == '1' and handOver(r, wakeKey, wakeId)
  if handed == 1 then return {1, '', 1} end
  writeReleased(lockKey, r, ttl)
  return {1, handed or '', 1}
end
-- A moving average of hold times, for waiters' hints. A negative hold means the server clock
-- stepped back: no sample. A forward step counts as at most the longest lease.
local function sampleHold(r, at)
  if r.flag == '1' and nowMs - at >= 0 then
    r.hold = (clamp(r.hold, 1, ${MAX_HOLD_MS}) + clamp(nowMs - at, 1, ${MAX_HOLD_MS})) / 2
  end
  observe(statsKey, nowMs, 'hold', nowMs - at)
end
-- A retry of a release that went through answers 1 again, by the mark it left (the record may be
-- gone already: it lives fenceWindowMs, the marks RELEASE_MEMORY_MS). A grant to the token forgets
-- its mark, so without a fence the mark is its latest lease's.
local function retried(released, sha)
  local mark = tonumber(redis.call('ZSCORE', marksKey, token))
  if fence == '' then return mark ~= nil end
  return mark == tonumber(fence) or released == fence .. ':' .. sha
end
local r = readRecord(lockKey)
if not r then
  if retried('', '') then return {1, ''} end
  return lost()
end
if r.foreign then return lost() end
local sha = string.sub(redis.sha1hex(token), 1, 12)
if r.shared and nowMs < r.leaseEnd then
  local h = readHolder(redis.call('HGET', holdersKey, token))
  if h and nowMs < h.leaseEnd and (fence == '' or h.fence == fence) then
    if dropHold(h.holds, hold) > 0 then
      writeHolder(holdersKey, token, h)
      return {1, ''}
    end
    redis.call('HDEL', holdersKey, token)
    markReleased(marksKey, token, h.fence)
    local _, used, latest = readHolders(holdersKey, nowMs, true)
    sampleHold(r, math.floor(tonumber(h.fence) / 1000)) -- a fence is its grant time in µs, or just past
    if used == 0 then
      r.released = h.fence .. ':' .. sha
      redis.call('DEL', holdersKey)
      indexEnd(endsKey, name, nowMs)
      return freed(r, graceMs)
    else
      r.leaseEnd = latest
      writeShared(lockKey, r, nowMs, graceMs)
      redis.call('PEXPIRE', holdersKey, latest - nowMs)
      indexPut(namesKey, endsKey, name, latest, nowMs) -- the index ends with the latest holder
    end
    return {1, ''}
  end
end
if r.free or r.token ~= token or nowMs >= r.leaseEnd or (fence ~= '' and r.fence ~= fence) then
  if retried(r.released, sha) then return {1, ''} end -- not held by this lease now
  return lost()
end
if dropHold(r.holds, hold) > 0 then
  writeHeld(lockKey, r, nowMs, graceMs)
  return {1, ''}
end
sampleHold(r, r.at)
r.released = r.fence .. ':' .. sha
markReleased(marksKey, token, r.fence)
indexEnd(endsKey, name, nowMs)
return freed(r, graceMs)
`,
);
