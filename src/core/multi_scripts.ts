/**
 * Several names exclusively, all or nothing, in one script: the script beside the exclusive
 * lock's (`./scripts.ts`), on the same records and queues, so a name taken this way is the same
 * lock as when taken alone.
 *
 * No deadlock between overlapping sets, by construction: a caller never holds some names while
 * waiting for others (it gets all in one atomic step or none), and a waiting caller joins every
 * name's queue in that same step, at the back. A caller missing from any of its queues (a lapsed
 * ticket) leaves all and joins all again. So every caller's places in all its queues date from
 * one instant, the order of those instants is one order across all queues, and the earliest
 * waiter is first in each of its queues: once their holders' leases end (they always do), it
 * gets all its names.
 *
 * @module
 */

import { LIMITS } from "./_validate.ts";
import { defineScript, NOW } from "./_lua.ts";
import { INDEX_LUA, MIN_RETRY_MS, QUEUE_LUA, RECORD_LUA } from "./scripts.ts";
import { STATS_LUA } from "./stats.ts";

/**
 * Acquire every name, exclusively. KEYS: each name's record, queue, tickets and released marks, then the stats
 * keys; ARGV: the exclusive acquire's first nine (the name replaced by the count of names),
 * then the names. Returns `{1, nowMs, ttlMs, fence...}` (one fence per name, in order) when
 * acquired (or re-acquired by the same token, keeping each fence), the exclusive script's busy
 * reply (the latest hint and lease end over the names it waits for, its furthest place), or
 * `{-1, 1}` when a name is held as a semaphore.
 */
export const ACQUIRE_ALL = defineScript(
  "acquire_all",
  `
local token      = ARGV[1]
local ttlMs      = tonumber(ARGV[2])
local meta       = ARGV[3]
local graceMs    = tonumber(ARGV[4])
local ticketMs   = tonumber(ARGV[5])
local maxWaiters = tonumber(ARGV[6])
local n          = tonumber(ARGV[7]) -- how many names
local waitedMs   = tonumber(ARGV[8])
local waiting    = ARGV[9] == '1'
local statsKey, namesKey, endsKey = KEYS[4 * n + 1], KEYS[4 * n + 2], KEYS[4 * n + 3]
${NOW}${RECORD_LUA}${QUEUE_LUA}${INDEX_LUA}${STATS_LUA}
local function lockKey(i) return KEYS[4 * i - 3] end
local function queueKey(i) return KEYS[4 * i - 2] end
local function ticketsKey(i) return KEYS[4 * i - 1] end
local function marksKey(i) return KEYS[4 * i] end
local records, held, heads, blocked = {}, {}, {}, {}
local ready = true
for i = 1, n do
  local r = readRecord(lockKey(i))
  if r and r.foreign then
    if not waiting then count(statsKey, nowMs, 'acquire.busy') end
    return {0, ${MIN_RETRY_MS}, nowMs, -1, ttlOrSet(lockKey(i), ${LIMITS.ttlMs.max})}
  end
  records[i] = r
  held[i] = r and (r.token or r.shared) and nowMs < r.leaseEnd
  if held[i] and r.shared and r.limit > 0 then return {-1, 1, nowMs} end
  if not (held[i] and r.token == token) then -- a name this token holds already stays granted
    if not r or r.flag == '1' then heads[i] = queueHead(queueKey(i), ticketsKey(i), nowMs, maxWaiters) end
    blocked[i] = held[i] or (heads[i] and heads[i] ~= token)
    if blocked[i] then ready = false end
  end
end
if ready then
  local reply = {1, nowMs, ttlMs}
  if observe(statsKey, nowMs, 'wait', waitedMs) then indexPrune(namesKey, endsKey, nowMs, 1000) end
  for i = 1, n do
    local r = records[i]
    if held[i] then
      r.leaseEnd = math.max(r.leaseEnd, nowMs + ttlMs) -- never before the end it was told
      if meta ~= '' then r.meta = meta end
    else
      local flag = '0'
      if heads[i] and leaveQueue(queueKey(i), ticketsKey(i), token) then flag = '1' end
      local floor = (r and tonumber(r.fence)) or 0
      r = {fence = string.format('%.0f', math.max(nowUs, floor + 1)), leaseEnd = nowMs + ttlMs,
        at = nowMs, hold = clamp((r and r.hold) or 20, 1, ${LIMITS.ttlMs.max}), flag = flag,
        token = token, meta = meta, holds = newHolds(''), released = (r and r.released) or ''}
      redis.call('ZREM', marksKey(i), token)
    end
    writeHeld(lockKey(i), r, nowMs, graceMs)
    indexPut(namesKey, endsKey, ARGV[9 + i], r.leaseEnd, nowMs)
    reply[#reply + 1] = tonumber(r.fence)
  end
  return reply
end
local places, position = {}, -1
if ticketMs > 0 then
  local everywhere = true
  for i = 1, n do
    if not redis.call('ZSCORE', queueKey(i), token) then everywhere = false end
  end
  for i = 1, n do
    if not everywhere then leaveQueue(queueKey(i), ticketsKey(i), token) end
    places[i] = joinQueue(queueKey(i), ticketsKey(i), token, nowMs, ticketMs, maxWaiters)
    if places[i] == -2 then -- full: in no queue at all
      for j = 1, i do leaveQueue(queueKey(j), ticketsKey(j), token) end
      places, position = {}, -2
      break
    end
    position = math.max(position, places[i])
  end
end
if position == -2 then
  count(statsKey, nowMs, 'acquire.queue_full')
elseif not waiting then
  count(statsKey, nowMs, 'acquire.busy')
end
local retry, pttl = ${MIN_RETRY_MS}, 0
for i = 1, n do
  local r = records[i]
  noteContended(lockKey(i), r, nowMs, graceMs)
  if blocked[i] then
    if held[i] then
      pttl = math.max(pttl, r.leaseEnd - nowMs)
      ttlOrSet(lockKey(i), r.leaseEnd - nowMs + graceMs)
    end
    local holdMs = clamp((r and r.hold) or 20, 1, ${LIMITS.ttlMs.max})
    retry = math.max(retry, retryAfter(r, held[i], holdMs, places[i] or -1, ticketsKey(i), heads[i], nowMs))
  end
end
return {0, retry, nowMs, position, pttl}
`,
);
