/**
 * Shared and counted leases, beside the exclusive lock's (`./acquire.ts`): a read-write lock's
 * `shared` holders and a counting semaphore's. They share the name's record, fence and wait
 * queue with exclusive leases, so one name is one lock whatever its mode.
 *
 * A name held this way has the record `S<fence>|<leaseEndMs>|<atMs>|<holdMs>|<flag>|<limit>|
 * <released>` (limit 0: shared; else a semaphore of `limit` permits) and a hash of its holders
 * (`HOLDERS_LUA`), each with its own lease, fence and hold count. The record's lease end is the
 * latest holder's, so an exclusive acquire needs no look at the holders.
 *
 * @module
 */

import { defineScript } from "./_define.ts";
import { ACQUIRE_ARGS, STATS_KEYS, WAIT_ARGS } from "./contracts.ts";
import {
  ACQUIRE_LUA,
  HOLDERS_LUA,
  INDEX_LUA,
  MAX_QUEUE,
  MAX_SHARED,
  NOW,
  OFFER_LUA,
  QUEUE_LUA,
  RECORD_LUA,
  STATS_LUA,
} from "./lib.ts";

export { MAX_SHARED };

/**
 * Acquire shared (`limit` 0) or `permits` of a semaphore of `limit`. Returns `{1, fence, ttlMs,
 * nowMs, holdCount}` when acquired (a new fence per holder, strictly increasing per name across
 * all modes), the exclusive script's busy reply, or `{-1, code}` on a mismatch (`./replies.ts`).
 *
 * Fair: the queue is served in order, so a waiter is granted only when it and everyone ahead of
 * it fit together; a queued exclusive waiter fits only alone, so it blocks the shared callers
 * behind it and a stream of readers cannot starve a writer. A caller that does not queue comes
 * after everyone queued.
 */
export const ACQUIRE_SHARED = defineScript(
  "acquire_shared",
  {
    keys: [
      "lockKey",
      "queueKey",
      "ticketsKey",
      "holdersKey",
      "marksKey",
      "offersKey",
      "wakeKey",
      "readersKey?",
      ...STATS_KEYS,
    ],
    args: {
      ...ACQUIRE_ARGS,
      name: "string",
      ...WAIT_ARGS,
      hold: "string",
      limit: "number", // 0: shared; else a semaphore's permits in all
      permits: "number", // what this caller takes: 1 when shared
      wakeId: "string", // a waiter that blocks between looks: its wake key's id, else ''
    },
  },
  [NOW, RECORD_LUA, HOLDERS_LUA, QUEUE_LUA, STATS_LUA, INDEX_LUA, ACQUIRE_LUA, OFFER_LUA],
  `
local capacity, member = limit, token .. '~' .. permits
if limit == 0 then capacity, member = ${MAX_SHARED}, token .. '~s' end
local r = readRecord(lockKey)
if r and r.foreign then return foreignBusy(lockKey) end
local exclusive = r and r.token and nowMs < r.leaseEnd
local live = r and r.shared and nowMs < r.leaseEnd
if (exclusive and (limit > 0 or r.token == token)) or (live and (r.limit == 0) ~= (limit == 0)) then
  return {-1, 1, nowMs}
end
if live and r.limit ~= limit then return {-1, 2, nowMs} end
local holders, used = {}, 0
if live then holders, used = readHolders(holdersKey, nowMs, true) end
local mine = holders[token]
if mine then
  -- its permits are what it was told
  if mine.permits ~= permits then return {-1, 4, nowMs} end
  if hold == '' and #mine.holds.ids > 0 then return {-1, 5, nowMs} end
  if not addHold(mine.holds, hold) then return {-1, 3, nowMs} end
  -- never before another hold's end
  mine.leaseEnd = math.max(mine.leaseEnd, nowMs + ttlMs)
  if meta ~= '' then mine.meta = meta end
  writeHolder(holdersKey, token, mine)
  r.leaseEnd = math.max(r.leaseEnd, mine.leaseEnd)
  writeShared(lockKey, r, nowMs, graceMs)
  redis.call('PEXPIRE', holdersKey, r.leaseEnd - nowMs)
  granted(r.leaseEnd)
  -- a hand-off it learns of here
  if wakeId ~= '' then redis.call('DEL', wakeKey) end
  local first = r.flag == '1' and firstWaiters() or nil
  return {1, tonumber(mine.fence), mine.leaseEnd - nowMs, nowMs, holdCount(mine.holds),
    orNone(grantHint(first))}
end
if spent(marksKey) then return {-1, 6, nowMs} end
-- What is free, less what the waiters ahead take in turn: a waiter that does not fit stops
-- everyone behind it. An exclusive waiter (a bare token) takes everything, and only alone.
local free = capacity - used
if exclusive then free = 0 end
-- the whole queue, whatever this caller's maxWaiters
local head, queue, seen
if not r or r.flag == '1' then
  head, queue, seen = queueHead(queueKey, ticketsKey, nowMs, nil, ${MAX_QUEUE})
end
if head then
  for _, m in ipairs(queue) do
    if m == member then break end
    local want = string.match(m, '~(%w+)$')
    local takes
    if not want then
      if free == capacity then takes = capacity end
    elseif (want == 's') == (limit == 0) then
      takes = tonumber(want) or 1
    end
    if not takes or takes > free then
      free = -1
      break
    end
    free = free - takes
  end
end
local holdMs = holdEstimate(r)
if permits > free then
  local offer, wake
  -- A waiter that blocks may be handed its lease: a semaphore's on its wake key, a reader's on its
  -- own or in a ring of the readers' bell (below).
  if wakeId ~= '' then
    wake = (limit > 0 and wakeFor(r, live, head, member)) or wakeId
    offer = blockingOffer(limit, wake)
  end
  local reply = busy(r, exclusive or live, holdMs, member, head, offersKey, offer, seen)
  -- When the first holder's lease ends, ms (0: none): a waiter may fit then, unannounced.
  local soonest = 0
  for _, h in pairs(holders) do
    if soonest == 0 or h.leaseEnd - nowMs < soonest then soonest = h.leaseEnd - nowMs end
  end
  reply[6] = soonest
  -- A shared waiter listens on the readers' bell (and its wake key) from the bell's last ring.
  -- With the name's last fence: a lease of its token with a higher one was granted since this look.
  if wakeId ~= '' and limit == 0 and readersKey and reply[4] >= 0 then
    local last = redis.call('XREVRANGE', readersKey, '+', '-', 'COUNT', 1)[1]
    reply[7] = (last and last[1]) or '0-0'
    reply[9], reply[10] = reply[9] or false, (r and tonumber(r.fence)) or 0
  end
  if wake then reply[7], reply[8] = reply[7] or false, wake ~= wakeId and wake end
  return reply
end
local nextHead, first
if head then nextHead, first = leaveQueue(queueKey, ticketsKey, member, offersKey, queue)
elseif queue then endPlaces(ticketsKey, offersKey) end
local flag = (nextHead and '1') or '0'
-- holders of an earlier shared spell
if not live then redis.call('DEL', holdersKey) end
local h = {fence = newFence(r), leaseEnd = nowMs + ttlMs, permits = permits,
  holds = newHolds(hold), meta = meta}
writeHolder(holdersKey, token, h)
-- a release without a fence now means this lease
supersede(marksKey, token)
local grant = {fence = h.fence, leaseEnd = h.leaseEnd, at = nowMs, hold = holdMs, flag = flag,
  limit = limit, released = (r and r.released) or '', shared = true}
if live then grant.leaseEnd = math.max(r.leaseEnd, h.leaseEnd) end
writeShared(lockKey, grant, nowMs, graceMs)
redis.call('PEXPIRE', holdersKey, grant.leaseEnd - nowMs)
granted(grant.leaseEnd)
return {1, tonumber(h.fence), ttlMs, nowMs, 1, orNone(grantHint(first))}
`,
);
