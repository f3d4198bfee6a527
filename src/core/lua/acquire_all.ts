/**
 * Several names exclusively, all or nothing, in one script: beside the exclusive lock's
 * (`./acquire.ts`), on the same records and queues, so a name taken this way is the same lock as
 * when taken alone.
 *
 * No deadlock between overlapping sets, by construction: a caller never holds some names while
 * waiting for others (it gets all in one atomic step or none), and a waiting caller joins every
 * name's queue in that same step, at the back. A caller missing from any of its queues (a lapsed
 * ticket) leaves all and joins all again. So every caller's places in all its queues date from
 * one instant, the order of those instants is one order across all queues, and the earliest
 * waiter is first in each of its queues: once their holders' leases end (they always do), it
 * gets all its names. (A name the caller's token holds already, through another acquire, stays
 * granted: it holds that one while it waits, so two such callers can wait for each other until
 * one's wait or lease ends.)
 *
 * A waiter that blocks (`wakeId`) leaves in each queue the offer `m<ttlMs>|<sinceMs>|<wakeId>|
 * <names>|<meta>` (its names comma-joined; builds before this one read no offer there, and leave
 * the waiter to its next look). A release that frees a name whose head it is names the waiter to
 * its caller, which hands it every name at once when all are free and it heads every queue
 * (`./hand_over_all.ts`), on the wake key beside its first name's keys.
 *
 * @module
 */

import { defineScript } from "./_define.ts";
import { ACQUIRE_ARGS, STATS_KEYS, WAIT_ARGS } from "./contracts.ts";
import {
  ACQUIRE_LUA,
  INDEX_LUA,
  NAMES_HINT_LUA,
  NOW,
  OFFER_LUA,
  QUEUE_LUA,
  RECORD_LUA,
  STATS_LUA,
} from "./lib.ts";

/**
 * Acquire every name (`n` of them, in `names`), exclusively. Returns `{1, nowMs, ttlMs,
 * fence..., hint...}` (one fence and one grant hint per name, in order) when acquired (or
 * re-acquired by the same token, keeping each fence), the exclusive script's busy reply (the
 * latest hint and lease end over the names it waits for, its furthest place), `{-1, 1}` when a
 * name is held as a semaphore, or `{-1, 5}` when this token holds one reentrant (a plain acquire
 * would count no hold).
 */
export const ACQUIRE_ALL = defineScript(
  "acquire_all",
  {
    each: ["lockKey", "queueKey", "ticketsKey", "marksKey", "offersKey"],
    // the caller's wake key, beside the first name's keys
    keys: ["wakeKey", ...STATS_KEYS],
    // wakeId: the caller's wake key's id when it blocks between looks, else ''
    args: { ...ACQUIRE_ARGS, n: "number", ...WAIT_ARGS, wakeId: "string" },
    rest: "names",
  },
  [NOW, RECORD_LUA, QUEUE_LUA, STATS_LUA, INDEX_LUA, OFFER_LUA, NAMES_HINT_LUA, ACQUIRE_LUA],
  `
local records, held, heads, blocked = {}, {}, {}, {}
local ready = true
for i = 1, n do
  local r = readRecord(lockKey(i))
  if r and r.foreign then return foreignBusy(lockKey(i)) end
  records[i] = r
  held[i] = r and (r.token or r.shared) and nowMs < r.leaseEnd
  if held[i] and r.shared and r.limit > 0 then return {-1, 1, nowMs} end
  -- a plain acquire of a reentrant lease of this token
  if held[i] and r.token == token and #r.holds.ids > 0 then return {-1, 5, nowMs} end
  -- a name this token holds already stays granted
  if not (held[i] and r.token == token) then
    if not r or r.flag == '1' then heads[i] = queueHead(queueKey(i), ticketsKey(i), nowMs, offersKey(i)) end
    blocked[i] = held[i] or (heads[i] and heads[i] ~= token)
    if blocked[i] then ready = false end
  end
end
for i = 1, n do
  if not (held[i] and records[i].token == token) and spent(marksKey(i)) then return {-1, 6, nowMs} end
end
if ready then
  local reply, hints = {1, nowMs, ttlMs}, {}
  noteWaited()
  for i = 1, n do
    local r = records[i]
    if held[i] then
      -- never before the end it was told
      r.leaseEnd = math.max(r.leaseEnd, nowMs + ttlMs)
      if meta ~= '' then r.meta = meta end
      -- contended: out of its queue, if in it, and the next waiters named for its release
      if r.flag == '1' then
        local _, first = leaveQueue(queueKey(i), ticketsKey(i), token, offersKey(i))
        hints[i] = hintOf(i, first)
      end
    else
      local flag, nextHead, first = '0', nil, nil
      if heads[i] then nextHead, first = leaveQueue(queueKey(i), ticketsKey(i), token, offersKey(i))
      elseif not r or r.flag == '1' then endPlaces(ticketsKey(i), offersKey(i)) end
      if nextHead then flag = '1' end
      hints[i] = hintOf(i, first)
      r = {fence = newFence(r), leaseEnd = nowMs + ttlMs, at = nowMs, hold = holdEstimate(r),
        flag = flag, token = token, meta = meta, holds = newHolds(''),
        released = ownRelease(r, token)}
      supersede(marksKey(i), token)
    end
    writeHeld(lockKey(i), r, nowMs, graceMs)
    indexPut(namesKey, endsKey, names[i], r.leaseEnd, nowMs)
    reply[#reply + 1] = tonumber(r.fence)
  end
  for i = 1, n do reply[#reply + 1] = orNone(hints[i]) end
  return reply
end
local places, position, ticket = {}, -1, ''
if ticketMs > 0 then
  -- A waiter that blocks leaves the same offer in each queue; a look clears its wake key, as the
  -- exclusive acquire's does, so the block that follows waits for a new grant only.
  local offer
  if wakeId ~= '' then
    redis.call('DEL', wakeKey)
    offer = string.format('m%d|%d|', ttlMs, nowMs - waitedMs) .. wakeId .. '|' ..
      table.concat(names, ',') .. '|' .. meta
  end
  local ranks, everywhere = {}, true
  for i = 1, n do
    ranks[i] = redis.call('ZRANK', queueKey(i), token)
    if not ranks[i] then everywhere = false end
  end
  for i = 1, n do
    if not everywhere then
      if ranks[i] then leaveQueue(queueKey(i), ticketsKey(i), token, offersKey(i), nil, true) end
      ranks[i] = false
    end
    -- never a place left: the places in every queue date from one look
    places[i], ticket = joinQueue(queueKey(i), ticketsKey(i), token, nowMs, ticketMs, maxWaiters,
      offersKey(i), offer, ranks[i], nil, true)
    -- full: in no queue at all
    if places[i] == -2 then
      for j = 1, i do leaveQueue(queueKey(j), ticketsKey(j), token, offersKey(j), nil, true) end
      places, position = {}, -2
      break
    end
    position = math.max(position, places[i])
  end
end
countBusy(position)
local retry, pttl = 0, 0
for i = 1, n do
  local r = records[i]
  noteContended(lockKey(i), r, nowMs, graceMs)
  if blocked[i] then
    if held[i] then
      pttl = math.max(pttl, r.leaseEnd - nowMs)
      ttlOrSet(lockKey(i), r.leaseEnd - nowMs + graceMs)
    end
    retry = math.max(retry, retryAfter(r, held[i], holdEstimate(r), places[i] or -1, ticketsKey(i), heads[i], nowMs))
  end
end
return {0, retry, nowMs, position, pttl, 0, false, false, (position >= 0 and ticket) or false}
`,
);
