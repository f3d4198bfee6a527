/**
 * Shared and counted leases, the scripts beside the exclusive lock's (`./scripts.ts`): a
 * read-write lock's `shared` holders and a counting semaphore's. They share the name's record,
 * fence and wait queue with exclusive leases, so one name is one lock whatever its mode.
 *
 * A name held this way has the record `S<fence>|<leaseEndMs>|<atMs>|<holdMs>|<flag>|<limit>|
 * <released>` (limit 0: shared; else a semaphore of `limit` permits) and a hash of its holders
 * (`HOLDERS_LUA`), each with its own lease, fence and hold count. The record's lease end is the
 * latest holder's, so an exclusive acquire needs no look at the holders.
 *
 * @module
 */

import { LIMITS } from "./_validate.ts";
import { defineScript, NOW } from "./_lua.ts";
import { HOLDERS_LUA, INDEX_LUA, MIN_RETRY_MS, QUEUE_LUA, RECORD_LUA } from "./scripts.ts";
import { STATS_LUA } from "./stats.ts";

/** The most shared holders one name has at once; one more is busy. */
export const MAX_SHARED = 1000;

/**
 * Acquire shared (`limit` 0) or `permits` of a semaphore of `limit`. Returns `{1, fence, ttlMs,
 * nowMs, holdCount}` when acquired (a new fence per holder, strictly increasing per name across
 * all modes), the exclusive script's busy reply, or `{-1, 1}` when the name is held in another
 * mode (shared vs semaphore, or exclusively while asking for a semaphore) and `{-1, 2}` when
 * held as a semaphore of another limit.
 *
 * Fair: the queue is served in order, so a waiter is granted only when it and everyone ahead of
 * it fit together; a queued exclusive waiter fits only alone, so it blocks the shared callers
 * behind it and a stream of readers cannot starve a writer. A caller that does not queue comes
 * after everyone queued.
 */
export const ACQUIRE_SHARED = defineScript(
  "acquire_shared",
  `
local lockKey    = KEYS[1]
local queueKey   = KEYS[2]
local ticketsKey = KEYS[3]
local holdersKey = KEYS[4]           -- hash: token -> the holder's lease
local token      = ARGV[1]
local ttlMs      = tonumber(ARGV[2])
local meta       = ARGV[3]
local graceMs    = tonumber(ARGV[4])
local ticketMs   = tonumber(ARGV[5])
local maxWaiters = tonumber(ARGV[6])
local name       = ARGV[7]
local waitedMs   = tonumber(ARGV[8])
local waiting    = ARGV[9] == '1'
local limit      = tonumber(ARGV[10]) -- 0: shared; else a semaphore's permits in all
local permits    = tonumber(ARGV[11]) -- what this caller takes: 1 when shared
local hold       = ARGV[12]          -- a reentrant acquire's hold id; '' when not reentrant
local marksKey   = KEYS[5]           -- sorted set: released leases' tokens by fence
local statsKey, namesKey, endsKey = KEYS[6], KEYS[7], KEYS[8] -- nil with stats off
${NOW}${RECORD_LUA}${HOLDERS_LUA}${QUEUE_LUA}${INDEX_LUA}${STATS_LUA}
local function granted(leaseEnd)
  if observe(statsKey, nowMs, 'wait', waitedMs) then indexPrune(namesKey, endsKey, nowMs, 1000) end
  indexPut(namesKey, endsKey, name, leaseEnd, nowMs)
end
local capacity, member = limit, token .. '~' .. permits
if limit == 0 then capacity, member = ${MAX_SHARED}, token .. '~s' end
local r = readRecord(lockKey)
if r and r.foreign then
  if not waiting then count(statsKey, nowMs, 'acquire.busy') end
  return {0, ${MIN_RETRY_MS}, nowMs, -1, ttlOrSet(lockKey, ${LIMITS.ttlMs.max})}
end
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
  if mine.permits ~= permits then return {-1, 4, nowMs} end -- its permits are what it was told
  if hold == '' and #mine.holds.ids > 0 then return {-1, 5, nowMs} end
  if not addHold(mine.holds, hold) then return {-1, 3, nowMs} end
  mine.leaseEnd = math.max(mine.leaseEnd, nowMs + ttlMs) -- never before another hold's end
  if meta ~= '' then mine.meta = meta end
  writeHolder(holdersKey, token, mine)
  r.leaseEnd = math.max(r.leaseEnd, mine.leaseEnd)
  writeShared(lockKey, r, nowMs, graceMs)
  redis.call('PEXPIRE', holdersKey, r.leaseEnd - nowMs)
  granted(r.leaseEnd)
  return {1, tonumber(mine.fence), mine.leaseEnd - nowMs, nowMs, holdCount(mine.holds)}
end
-- What is free, less what the waiters ahead take in turn: a waiter that does not fit stops
-- everyone behind it. An exclusive waiter (a bare token) takes everything, and only alone.
local free = capacity - used
if exclusive then free = 0 end
local head
if not r or r.flag == '1' then head = queueHead(queueKey, ticketsKey, nowMs, maxWaiters) end
if head then
  for _, m in ipairs(redis.call('ZRANGE', queueKey, 0, maxWaiters - 1)) do
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
local holdMs = clamp((r and r.hold) or 20, 1, ${LIMITS.ttlMs.max})
if permits <= free then
  local flag = '0'
  if head and leaveQueue(queueKey, ticketsKey, member) then flag = '1' end
  if not live then redis.call('DEL', holdersKey) end -- holders of an earlier shared spell
  local floor = (r and tonumber(r.fence)) or 0
  local h = {fence = string.format('%.0f', math.max(nowUs, floor + 1)), leaseEnd = nowMs + ttlMs,
    permits = permits, holds = newHolds(hold), meta = meta}
  writeHolder(holdersKey, token, h)
  redis.call('ZREM', marksKey, token) -- a release without a fence now means this lease
  local grant = {fence = h.fence, leaseEnd = h.leaseEnd, at = nowMs, hold = holdMs, flag = flag,
    limit = limit, released = (r and r.released) or '', shared = true}
  if live then grant.leaseEnd = math.max(r.leaseEnd, h.leaseEnd) end
  writeShared(lockKey, grant, nowMs, graceMs)
  redis.call('PEXPIRE', holdersKey, grant.leaseEnd - nowMs)
  granted(grant.leaseEnd)
  return {1, tonumber(h.fence), ttlMs, nowMs, 1}
end
noteContended(lockKey, r, nowMs, graceMs)
local held = exclusive or live
local pttl = 0
if held then pttl = r.leaseEnd - nowMs end
local position = -1
if ticketMs > 0 then
  position = joinQueue(queueKey, ticketsKey, member, nowMs, ticketMs, maxWaiters)
end
if position == -2 then
  count(statsKey, nowMs, 'acquire.queue_full')
elseif not waiting then
  count(statsKey, nowMs, 'acquire.busy')
end
return {0, retryAfter(r, held, holdMs, position, ticketsKey, head, nowMs), nowMs, position, pttl}
`,
);
