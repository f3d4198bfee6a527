import { defineScript } from "./_define.ts";
import { STATS_KEYS } from "./contracts.ts";
import {
  HANDOFF_LUA,
  HOLDERS_LUA,
  INDEX_LUA,
  MAX_HOLD_MS,
  NOW,
  OFFER_LUA,
  QUEUE_LUA,
  RECORD_LUA,
  RELEASE_MEMORY_MS,
  STATS_LUA,
  TRIM_MARKS,
} from "./lib.ts";

// The common case, before the other pieces' functions are made (see `./acquire.ts`): the
// holder of an uncontended exclusive lease with one plain hold releases it. What the body below
// does for that case: the released record, the mark for retries, the hold time.
const FAST = `
local raw = redis.call('GET', lockKey)
local f, leaseEnd0, at0, hold0, owner = string.match(raw or '',
  '^X(%d+)|(%-?%d+)|(%-?%d+)|(%d+)|0|([%w_-]+)|[%d:%x]*|1|.*$')
local base = f and math.floor(tonumber(f) / 1000)
if f and owner == token and hold == '' and base + tonumber(leaseEnd0) > nowMs and (fence == '' or fence == f) then
  redis.call('SET', lockKey, 'R' .. f .. '|' .. hold0 .. '|0|' .. string.sub(redis.sha1hex(token), 1, 12),
    'PX', graceMs)
  redis.call('ZADD', marksKey, f, token)
  ${TRIM_MARKS}
  redis.call('PEXPIRE', marksKey, ${RELEASE_MEMORY_MS})
  observe(statsKey, nowMs, 'hold', nowMs - base - tonumber(at0))
  indexEnd(endsKey, name, nowMs)
  return {1, false, 1}
end
`;

/**
 * Release, any kind of lease. Returns `{released, head, ended}`: released is 1 when the token held it (and it is now free, or, for a
 * reentrant lease, one hold fewer: the hold named by `hold`, none when that hold is gone, as for
 * a retry), also when this release already went through (a retried or duplicated request), else
 * 0. Every release that frees a lease is
 * remembered by token for RELEASE_MEMORY_MS (the last RELEASED_MARKS of a name; a grant to the
 * token keeps its mark under `<token>@<fence>`): with the lease's fence, a retry matches exactly
 * that lease; without it, the token's latest lease, if that one was released.
 *
 * A release that frees the name hands it to the head of the queue in place when the head blocks
 * on a wake key the caller declared (`n` of them, `hintKey` each, their ids `hints`: the hint of
 * its grant); `head` is the head's wake id when it blocks on another (or, after a semaphore's
 * hand-off, when the next head's permits fit too), for `./hand_over.ts`, else nil; ended is 1 when
 * the lease ended (its last hold released), else absent. `{-1, 5}` when the token holds the lease reentrant (every hold with an
 * id) and the release names no hold: it ends none, and says so rather than answering 1.
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
      "readersKey?",
      ...STATS_KEYS,
    ],
    each: ["hintKey"],
    args: {
      token: "string",
      graceMs: "number",
      fence: "string", // the lease's fence, or '' when the caller does not know it
      name: "string",
      hold: "string", // a reentrant hold's id, or ''
      n: "number", // how many hinted wake keys (hintKey) there are
    },
    // the hinted next holders' wake ids, one per hintKey
    rest: "hints",
  },
  [NOW, STATS_LUA, INDEX_LUA, FAST, RECORD_LUA, HOLDERS_LUA, QUEUE_LUA, OFFER_LUA, HANDOFF_LUA],
  `
local function lost()
  count(statsKey, nowMs, 'release.lost')
  return {0}
end
-- The name is free: the head of the queue may take it now, handed over in place (which writes
-- its lease, and its end in the held index), else the record says released (\`ttl\` its TTL,
-- nil to keep it). The reply's third element says the lease ended (1), for the hint.
local function freed(r, ttl)
  -- for the hand-off; the record written is r's, released
  r.free = true
  local handed = r.flag == '1' and handOver(r)
  if handed == 1 then return {1, handedNext, 1} end
  indexEnd(endsKey, name, nowMs)
  writeReleased(lockKey, r, ttl)
  return {1, handed or false, 1}
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
-- gone already: it lives fenceWindowMs, the marks RELEASE_MEMORY_MS). A grant to the token moves
-- its mark to \`<token>@<fence>\` (\`supersede\`): without a fence the mark is its latest lease's.
local function retried(released, sha)
  local mark = tonumber(redis.call('ZSCORE', marksKey, token))
  if fence == '' then return mark ~= nil end
  if mark == tonumber(fence) or released == fence .. ':' .. sha then return true end
  local f = tonumber(fence)
  return f ~= nil and redis.call('ZSCORE', marksKey, token .. '@' .. ms(f)) ~= false
end
-- read by the fast path above
local r = readRecord(lockKey, raw)
if not r then
  if retried('', '') then return {1} end
  return lost()
end
if r.foreign then return lost() end
local sha = string.sub(redis.sha1hex(token), 1, 12)
if r.shared and nowMs < r.leaseEnd then
  local h = readHolder(redis.call('HGET', holdersKey, token))
  if h and nowMs < h.leaseEnd and (fence == '' or h.fence == fence) then
    if holdForgotten(h.holds, hold) then return {-1, 5} end
    if dropHold(h.holds, hold) > 0 then
      writeHolder(holdersKey, token, h)
      return {1}
    end
    redis.call('HDEL', holdersKey, token)
    markReleased(marksKey, token, h.fence)
    local _, used, latest = readHolders(holdersKey, nowMs, true)
    -- a fence is its grant time in µs, or just past
    sampleHold(r, math.floor(tonumber(h.fence) / 1000))
    if used == 0 then
      r.released = h.fence .. ':' .. sha
      redis.call('DEL', holdersKey)
      return freed(r, graceMs)
    else
      r.leaseEnd = latest
      writeShared(lockKey, r, nowMs, graceMs)
      redis.call('PEXPIRE', holdersKey, latest - nowMs)
      -- the index ends with the latest holder
      indexPut(namesKey, endsKey, name, latest, nowMs)
      -- Permits are free: a semaphore's waiter at the head may fit now.
      local handed = r.flag == '1' and handOver(r)
      if handed == 1 then return {1, handedNext, 1} end
      if handed then return {1, handed, 1} end
    end
    return {1, false, 1}
  end
end
if r.free or r.token ~= token or nowMs >= r.leaseEnd or (fence ~= '' and r.fence ~= fence) then
  -- not held by this lease now
  if retried(r.released, sha) then return {1} end
  return lost()
end
-- a reentrant lease's holds each have an id: a release without one ends none of them
if holdForgotten(r.holds, hold) then return {-1, 5} end
if dropHold(r.holds, hold) > 0 then
  writeHeld(lockKey, r, nowMs, graceMs)
  return {1}
end
sampleHold(r, r.at)
r.released = r.fence .. ':' .. sha
markReleased(marksKey, token, r.fence)
return freed(r, graceMs)
`,
);
