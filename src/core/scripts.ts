/**
 * Every lock decision as one Lua script, run atomically on the Redis primary. Each script reads
 * the server clock with TIME, so no decision depends on a client's clock. Written for Redis 6.2
 * semantics (Upstash) and Redis 7.x. Every key a script touches is passed in `KEYS`, and every
 * key a script writes carries a TTL.
 *
 * Keys per lock name, all in one hash slot: the lock record, one string; the wait queue (members
 * by arrival) and its tickets (members by deadline), which exist only while callers wait and live
 * as long as the latest ticket; for shared and semaphore leases (`./shared_scripts.ts`) the
 * holders' hash and the last releases. The record is
 *
 * - `H<fence>|<leaseEndMs>|<atMs>|<holdMs>|<flag>|<token>|<released>|<holdCount>|<meta>` while an
 *   exclusive lease may be held: it is held until `leaseEndMs` on the server clock;
 * - `S<fence>|<leaseEndMs>|<atMs>|<holdMs>|<flag>|<limit>|<released>` while shared or semaphore
 *   leases may be held, until the latest holder's `leaseEndMs`;
 * - `R<fence>|<holdMs>|<flag>|<sha>` once it was released (`released` is then `<fence>:<sha>`).
 *
 * `released` is `<fence>:<sha>` of the last release, `sha` the first 12 hex digits of the SHA-1 of
 * its token, so a retried release answers the same for exactly that lease.
 *
 * Either way it keeps the last fence (the floor) for `graceMs` after the lease ends, so fences keep
 * increasing across that window even if the server clock steps back within it. `holdMs` is a
 * moving average of hold times, for waiters' hints; `flag` is 1 while the lock is contended (a
 * busy reply or a queued waiter since the last grant): then acquire looks at the queue and release
 * samples the hold time. Without contention an acquire+release cycle runs six commands inside
 * its two scripts (TIME, GET, SET each), eight with the two EVALSHA calls; the stats and the held
 * index (`KEYS[4..6]`, `../core/stats.ts`) add ten when they are on, in the same scripts.
 *
 * @module
 */

import { LIMITS } from "./_validate.ts";
import { defineScript, NOW } from "./_lua.ts";
import { STATS_LUA, STATS_RETENTION_MS } from "./stats.ts";

export { FENCE_GRACE_MS } from "./_validate.ts";

/** A busy reply never asks a caller to look again sooner than this, in milliseconds. */
export const MIN_RETRY_MS = 5;

// Hold times feed busy replies' hints. A server clock that steps between grant and release gives
// a sample outside any real hold; each sample and the average stay within 1 ms and the longest TTL.
const MAX_HOLD_MS = LIMITS.ttlMs.max;

/** How many releases a name remembers, for retried releases. */
export const RELEASED_MARKS = 1000;

/** The most holds one reentrant lease (or one shared holder) counts; one more is `hold_limit`. */
export const MAX_HOLDS = 64;

/**
 * How long a name remembers a release (or a break) by its token (or break id), so that a retry
 * answers the same: ten minutes, far beyond any client's retries.
 */
export const RELEASE_MEMORY_MS = 600_000;

// A lease's holds, written `<n>` or `<n>,<id>,<id>…`: n holds without an id (a plain acquire's,
// and every hold of a record written before hold ids) and the ids of reentrant holds. A
// reentrant acquire or release names its own hold, so a retry of either takes effect once.
const HOLDS_LUA = `
local function readHolds(text)
  local holds = {anon = tonumber(string.match(text, '^%d+')), ids = {}}
  for id in string.gmatch(text, ',([%w_-]+)') do holds.ids[#holds.ids + 1] = id end
  return holds
end
local function holdsText(holds)
  if #holds.ids == 0 then return string.format('%d', holds.anon) end
  return string.format('%d', holds.anon) .. ',' .. table.concat(holds.ids, ',')
end
local function holdCount(holds) return holds.anon + #holds.ids end
local function findHold(holds, id)
  for i, held in ipairs(holds.ids) do if held == id then return i end end
  return nil
end
-- A new lease's holds: one, with the reentrant acquire's id or without.
local function newHolds(hold)
  if hold == '' then return {anon = 1, ids = {}} end
  return {anon = 0, ids = {hold}}
end
-- The holder acquires again: a plain acquire or a hold id already there adds nothing (a retry).
-- False when the lease has ${MAX_HOLDS} holds already.
local function addHold(holds, hold)
  if hold == '' or findHold(holds, hold) then return true end
  if holdCount(holds) >= ${MAX_HOLDS} then return false end
  holds.ids[#holds.ids + 1] = hold
  return true
end
-- A release drops the hold with its id, or without an id a plain hold; none when that hold is
-- gone (a retry, or a duplicate). Returns how many holds are left.
local function dropHold(holds, hold)
  if hold ~= '' then
    local i = findHold(holds, hold)
    if i then table.remove(holds.ids, i) end
  elseif holds.anon > 0 then
    holds.anon = holds.anon - 1
  end
  return holdCount(holds)
end
-- Remembers a release (member: a token, or '~' and a break id) with its fence, for retries.
local function markReleased(marksKey, member, fence)
  redis.call('ZADD', marksKey, fence, member)
  redis.call('ZREMRANGEBYRANK', marksKey, 0, -${RELEASED_MARKS + 1})
  redis.call('PEXPIRE', marksKey, ${RELEASE_MEMORY_MS})
end
`;

// The lock record: read, and written with a TTL that keeps the fence `graceMs` past the lease.
// A value this code did not write is `foreign`: busy until its TTL (given one if it has none).
export const RECORD_LUA = `
local function clamp(value, low, high) return math.min(math.max(value, low), high) end
${HOLDS_LUA}local function readRecord(key)
  local value = redis.call('GET', key)
  if not value then return nil end
  local kind = string.sub(value, 1, 1)
  if kind == 'H' then
    local fence, leaseEnd, at, hold, flag, token, released, count, meta = string.match(value,
      '^H(%d+)|(%d+)|(%d+)|(%d+)|([01])|([%w_-]+)|([%d:%x]*)|(%d[%w_,%-]*)|(.*)$')
    if not fence then -- written by 0.1, before hold counts: one hold
      fence, leaseEnd, at, hold, flag, token, released, meta = string.match(value,
        '^H(%d+)|(%d+)|(%d+)|(%d+)|([01])|([%w_-]+)|([%d:%x]*)|(.*)$')
      count = '1'
    end
    if fence then
      return {fence = fence, leaseEnd = tonumber(leaseEnd), at = tonumber(at),
        hold = tonumber(hold), flag = flag, token = token, released = released,
        holds = readHolds(count), meta = meta}
    end
  elseif kind == 'S' then
    local fence, leaseEnd, at, hold, flag, limit, released =
      string.match(value, '^S(%d+)|(%d+)|(%d+)|(%d+)|([01])|(%d+)|([%d:%x]*)$')
    if fence then
      return {fence = fence, leaseEnd = tonumber(leaseEnd), at = tonumber(at),
        hold = tonumber(hold), flag = flag, limit = tonumber(limit), released = released,
        shared = true}
    end
  elseif kind == 'R' then
    local fence, hold, flag, sha = string.match(value, '^R(%d+)|(%d+)|([01])|(%x+)$')
    if fence then
      return {fence = fence, leaseEnd = 0, hold = tonumber(hold), flag = flag,
        released = fence .. ':' .. sha, free = true}
    end
  end
  return {foreign = true}
end
local function ms(value) return string.format('%.0f', value) end
local function writeHeld(key, r, nowMs, graceMs)
  redis.call('SET', key, 'H' .. r.fence .. '|' .. ms(r.leaseEnd) .. '|' .. ms(r.at) .. '|' ..
    string.format('%d', math.floor(r.hold)) .. '|' .. r.flag .. '|' .. r.token .. '|' ..
    r.released .. '|' .. holdsText(r.holds) .. '|' .. r.meta, 'PX', math.max(1, r.leaseEnd - nowMs + graceMs))
end
local function writeShared(key, r, nowMs, graceMs)
  redis.call('SET', key, 'S' .. r.fence .. '|' .. ms(r.leaseEnd) .. '|' .. ms(r.at) .. '|' ..
    string.format('%d', math.floor(r.hold)) .. '|' .. r.flag .. '|' .. r.limit .. '|' .. r.released,
    'PX', math.max(1, r.leaseEnd - nowMs + graceMs))
end
-- ttl: the record's new TTL, or nil to keep its TTL.
local function writeReleased(key, r, ttl)
  local value = 'R' .. r.fence .. '|' .. string.format('%d', math.floor(r.hold)) .. '|' .. r.flag ..
    '|' .. string.match(r.released, ':(%x+)$')
  if ttl then redis.call('SET', key, value, 'PX', ttl) else redis.call('SET', key, value, 'KEEPTTL') end
end
local function writeRecord(key, r, nowMs, graceMs)
  if r.free then writeReleased(key, r, nil)
  elseif r.shared then writeShared(key, r, nowMs, graceMs)
  else writeHeld(key, r, nowMs, graceMs) end
end
`;

// The holders of a name held shared or as a semaphore (record kind S), one hash field each:
// token -> `<leaseEnd>|<fence>|<permits>|<holds>|<meta>` (`<holds>` as in HOLDS_LUA). The record's lease end is the latest
// holder's, and the hash lives until then: past it the name is free and the hash gone. Holders
// whose lease ran out are dropped when read.
export const HOLDERS_LUA = `
local function readHolder(raw)
  local leaseEnd, fence, permits, holds, meta =
    string.match(raw or '', '^(%d+)|(%d+)|(%d+)|(%d[%w_,%-]*)|(.*)$')
  if not leaseEnd then return nil end
  return {leaseEnd = tonumber(leaseEnd), fence = fence, permits = tonumber(permits),
    holds = readHolds(holds), meta = meta}
end
-- The live holders by token, the permits they hold, and the latest lease end; with prune, the
-- others leave the hash.
local function readHolders(holdersKey, nowMs, prune)
  local holders, used, latest = {}, 0, 0
  local raw = redis.call('HGETALL', holdersKey)
  for i = 1, #raw, 2 do
    local h = readHolder(raw[i + 1])
    if h and h.leaseEnd > nowMs then
      holders[raw[i]] = h
      used = used + h.permits
      latest = math.max(latest, h.leaseEnd)
    elseif prune then
      redis.call('HDEL', holdersKey, raw[i])
    end
  end
  return holders, used, latest
end
local function writeHolder(holdersKey, token, h)
  redis.call('HSET', holdersKey, token, ms(h.leaseEnd) .. '|' .. h.fence .. '|' .. h.permits .. '|' ..
    holdsText(h.holds) .. '|' .. h.meta)
end
`;

// The wait queue: tokens by arrival and by ticket deadline. A member is a token (an exclusive
// waiter) or `<token>~s` (shared) or `<token>~<permits>` (a semaphore), so a look at the queue
// knows what each waiter asks for.
export const QUEUE_LUA = `
-- The head of the queue, once lapsed tickets are dropped (at most maxWaiters of them).
local function queueHead(queueKey, ticketsKey, nowMs, maxWaiters)
  local head = redis.call('ZRANGE', queueKey, 0, 0)[1]
  if head then -- the queue and its tickets hold the same members: no head, no tickets
    local lapsed = redis.call('ZRANGEBYSCORE', ticketsKey, '-inf', nowMs, 'LIMIT', 0, maxWaiters)
    if #lapsed > 0 then
      redis.call('ZREM', queueKey, unpack(lapsed))
      redis.call('ZREM', ticketsKey, unpack(lapsed))
      head = redis.call('ZRANGE', queueKey, 0, 0)[1]
    end
  end
  return head
end
-- Takes a ticket for ticketMs (keeping an earlier place); returns the place, 0 the head, or -2
-- when the queue is full.
local function joinQueue(queueKey, ticketsKey, member, nowMs, ticketMs, maxWaiters)
  if not redis.call('ZSCORE', queueKey, member) then
    if redis.call('ZCARD', queueKey) >= maxWaiters then return -2 end
    -- Arrival order from the queue itself: one past the last waiter's place.
    local last = redis.call('ZRANGE', queueKey, -1, -1, 'WITHSCORES')[2]
    redis.call('ZADD', queueKey, (tonumber(last) or 0) + 1, member)
  end
  redis.call('ZADD', ticketsKey, nowMs + ticketMs, member)
  -- The queue lives as long as its latest ticket, so no ticket dies before its deadline.
  local latest = tonumber(redis.call('ZRANGE', ticketsKey, -1, -1, 'WITHSCORES')[2])
  redis.call('PEXPIRE', queueKey, math.max(latest - nowMs, 1))
  redis.call('PEXPIRE', ticketsKey, math.max(latest - nowMs, 1))
  return redis.call('ZRANK', queueKey, member)
end
local function leaveQueue(queueKey, ticketsKey, member)
  redis.call('ZREM', queueKey, member)
  redis.call('ZREM', ticketsKey, member)
  return redis.call('ZCARD', queueKey) > 0
end
-- Contention is noted in the record (its TTL kept), so release samples the hold time and the
-- next acquire looks at the queue.
local function noteContended(lockKey, r, nowMs, graceMs)
  if r and r.flag ~= '1' then
    r.flag = '1'
    writeRecord(lockKey, r, nowMs, graceMs)
  end
end
-- When a busy caller should look again: the holder's expected time left, then one hold per
-- waiter ahead. A holder past the usual hold time may hold much longer: look again after half
-- the time it has held so far (backoff). Never past the lease end (held) or, free but kept for
-- the head of the queue, the head's ticket; never under MIN_RETRY_MS. The head is told when the
-- release is expected here (the sampled holds run from grant to the release's arrival); a look
-- that arrives early costs a whole round trip, one that arrives late only the lateness.
local function retryAfter(r, held, holdMs, position, ticketsKey, head, nowMs)
  local left, cap = holdMs, nil
  if held then
    local heldFor = clamp(nowMs - r.at, 0, ${MAX_HOLD_MS})
    left = math.max(holdMs - heldFor, heldFor / 2, 1)
    cap = r.leaseEnd - nowMs
  else
    cap = (tonumber(redis.call('ZSCORE', ticketsKey, head or '')) or nowMs) - nowMs
  end
  local wait = math.min(left + holdMs * math.max(position, 0), cap)
  return math.floor(math.max(${MIN_RETRY_MS}, wait))
end
`;

// The held index, kept only with stats on (its keys are then passed, else nil): the prefix's
// recent names in order (`names`, all scores 0, for listing by prefix and cursor) and their lease
// ends (`ends`; minus the release time once released), so a name is held while its end is in the
// future. A name stays a minute after its release (acquiring it again is then cheaper); names
// released longer ago or whose lease ran out leave both sets, up to 1000 at the first grant of each
// minute and up to 4 at each grant of a name new to the index, so the sets hold about the names
// used in the last minute. Through pcall, like the stats: a damaged index never stops a decision.
export const INDEX_LUA = `
local function indexPrune(namesKey, endsKey, nowMs, limit)
  if not namesKey then return end
  local ended = redis.pcall('ZRANGEBYSCORE', endsKey,
    '(' .. string.format('%.0f', 60000 - nowMs), nowMs, 'LIMIT', 0, limit)
  if type(ended) == 'table' and not ended.err and #ended > 0 then
    redis.pcall('ZREM', namesKey, unpack(ended))
    redis.pcall('ZREM', endsKey, unpack(ended))
  end
end
local function indexPut(namesKey, endsKey, name, leaseEnd, nowMs)
  if not namesKey then return end
  -- The two sets hold the same names: a name new to one is new to both, and may have made the
  -- keys, which then get their TTL.
  if redis.pcall('ZADD', endsKey, leaseEnd, name) == 1 then
    redis.pcall('ZADD', namesKey, 0, name)
    redis.pcall('PEXPIRE', namesKey, ${STATS_RETENTION_MS})
    redis.pcall('PEXPIRE', endsKey, ${STATS_RETENTION_MS})
    indexPrune(namesKey, endsKey, nowMs, 4)
  end
end
local function indexEnd(endsKey, name, nowMs)
  if endsKey then redis.pcall('ZADD', endsKey, 'XX', -nowMs, name) end
end
`;

/**
 * Acquire exclusively, with a fair, bounded queue of waiters. Returns `{1, fence, ttlMs, nowMs,
 * holdCount}` when acquired (or re-acquired by the same token, keeping its fence; counted when
 * `reentrant`), `{0, retryAfterMs, nowMs, position, pttl}` when busy: position 0 is the head of
 * the queue, -1 not queued, -2 the queue was full; pttl is the holders' lease left, ms (0 when
 * free but kept for the head of the queue); `{-1, 1}` when the name is held as a semaphore.
 * A new fence is max(now in µs, last fence + 1): strictly increasing while the record lives, and
 * past its expiry or a data loss still above every earlier fence unless the server clock stepped
 * back.
 *
 * Waiters (`ticketMs` > 0) take a FIFO ticket; a free lock goes to the head of the queue only,
 * and everyone else (waiting or not) is busy until it takes it or its ticket lapses. A ticket
 * lives `ticketMs` from each call, so a waiter that gave up or crashed blocks nobody for longer;
 * each call that looks at the queue drops every lapsed ticket (at most `maxWaiters`, the queue's
 * bound), wherever it is. Shared holders (kind S) hold it until the latest of their lease ends.
 */
export const ACQUIRE = defineScript(
  "acquire",
  `
local lockKey    = KEYS[1]
local queueKey   = KEYS[2]           -- sorted set: waiting members by arrival
local ticketsKey = KEYS[3]           -- sorted set: waiting members by ticket deadline, ms
local token      = ARGV[1]
local ttlMs      = tonumber(ARGV[2]) -- milliseconds
local meta       = ARGV[3]           -- JSON object text, or '' for none
local graceMs    = tonumber(ARGV[4]) -- how long the fence outlives the lease
local ticketMs   = tonumber(ARGV[5]) -- milliseconds a waiter's ticket lives; 0: do not queue
local maxWaiters = tonumber(ARGV[6]) -- the queue's bound
local name       = ARGV[7]           -- the lock's name, for the held index
local waitedMs   = tonumber(ARGV[8]) -- how long the caller has waited so far, for the stats
local waiting    = ARGV[9] == '1'    -- the caller waits: a busy reply is not its outcome yet
local hold       = ARGV[10]          -- a reentrant acquire's hold id; '' when not reentrant
local marksKey   = KEYS[4]           -- sorted set: released leases' tokens by fence
local statsKey, namesKey, endsKey = KEYS[5], KEYS[6], KEYS[7] -- nil with stats off
${NOW}${RECORD_LUA}${QUEUE_LUA}${INDEX_LUA}${STATS_LUA}
local function granted(leaseEnd)
  if observe(statsKey, nowMs, 'wait', waitedMs) then indexPrune(namesKey, endsKey, nowMs, 1000) end
  indexPut(namesKey, endsKey, name, leaseEnd, nowMs)
end
local r = readRecord(lockKey)
if r and r.foreign then
  if not waiting then count(statsKey, nowMs, 'acquire.busy') end
  return {0, ${MIN_RETRY_MS}, nowMs, -1, ttlOrSet(lockKey, ${LIMITS.ttlMs.max})}
end
local held = r and (r.token or r.shared) and nowMs < r.leaseEnd
if held and r.shared and r.limit > 0 then return {-1, 1, nowMs} end
if held and r.token == token then
  if hold == '' and #r.holds.ids > 0 then return {-1, 5, nowMs} end -- a plain acquire of a reentrant lease
  if not addHold(r.holds, hold) then return {-1, 3, nowMs} end
  -- No hold ends the lease before the end another hold was told.
  r.leaseEnd = math.max(r.leaseEnd, nowMs + ttlMs)
  if meta ~= '' then r.meta = meta end
  writeHeld(lockKey, r, nowMs, graceMs)
  granted(r.leaseEnd)
  return {1, tonumber(r.fence), r.leaseEnd - nowMs, nowMs, holdCount(r.holds)}
end
-- No record (a first acquire, or one that was lost): look at the queue too.
local head
if not r or r.flag == '1' then head = queueHead(queueKey, ticketsKey, nowMs, maxWaiters) end
local holdMs = clamp((r and r.hold) or 20, 1, ${MAX_HOLD_MS})
if not held and (not head or head == token) then
  local flag = '0'
  if head and leaveQueue(queueKey, ticketsKey, token) then flag = '1' end
  local floor = (r and tonumber(r.fence)) or 0
  local grant = {fence = string.format('%.0f', math.max(nowUs, floor + 1)), leaseEnd = nowMs + ttlMs,
    at = nowMs, hold = holdMs, flag = flag, token = token, meta = meta, holds = newHolds(hold),
    released = (r and r.released) or ''}
  writeHeld(lockKey, grant, nowMs, graceMs)
  redis.call('ZREM', marksKey, token) -- a release without a fence now means this lease
  granted(grant.leaseEnd)
  return {1, tonumber(grant.fence), ttlMs, nowMs, 1}
end
noteContended(lockKey, r, nowMs, graceMs)
local pttl = 0
if held then
  pttl = r.leaseEnd - nowMs
  ttlOrSet(lockKey, pttl + graceMs)
end
local position = -1
if ticketMs > 0 then position = joinQueue(queueKey, ticketsKey, token, nowMs, ticketMs, maxWaiters) end
if position == -2 then
  count(statsKey, nowMs, 'acquire.queue_full')
elseif not waiting then
  count(statsKey, nowMs, 'acquire.busy')
end
return {0, retryAfter(r, held, holdMs, position, ticketsKey, head, nowMs), nowMs, position, pttl}
`,
);

/**
 * Leave the queue (a waiter gave up): counts the acquire's outcome, `timeout` or `aborted` ('' to
 * count nothing). Returns 1 when its ticket was removed.
 */
export const LEAVE_QUEUE = defineScript(
  "leave_queue",
  `
local queueKey   = KEYS[1]
local ticketsKey = KEYS[2]
local statsKey   = KEYS[3] -- nil with stats off
local token      = ARGV[1]
local outcome    = ARGV[2]
${NOW}${STATS_LUA}
if outcome == 'timeout' or outcome == 'aborted' then count(statsKey, nowMs, 'acquire.' .. outcome) end
redis.call('ZREM', ticketsKey, token)
return redis.call('ZREM', queueKey, token)
`,
);

/**
 * Renew, any kind of lease. Returns `{1, fence, ttlMs, nowMs, holdCount}`, or `{0, nowMs}` when
 * the token no longer holds it.
 */
export const RENEW = defineScript(
  "renew",
  `
local lockKey    = KEYS[1]
local holdersKey = KEYS[2]
local token      = ARGV[1]
local ttlMs      = tonumber(ARGV[2]) -- milliseconds
local graceMs    = tonumber(ARGV[3])
local name       = ARGV[4]
local statsKey, namesKey, endsKey = KEYS[3], KEYS[4], KEYS[5] -- nil with stats off
${NOW}${RECORD_LUA}${HOLDERS_LUA}${INDEX_LUA}${STATS_LUA}
local r = readRecord(lockKey)
local h = r
if r and r.shared and nowMs < r.leaseEnd then
  h = readHolder(redis.call('HGET', holdersKey, token))
  if h then h.token = token end
end
if not r or not h or h.token ~= token or nowMs >= h.leaseEnd then
  count(statsKey, nowMs, 'renew.lost')
  return {0, nowMs}
end
-- A renewal never shortens a lease: another hold of it may have been told the later end.
h.leaseEnd = math.max(h.leaseEnd, nowMs + ttlMs)
if r.shared then
  writeHolder(holdersKey, token, h)
  r.leaseEnd = math.max(r.leaseEnd, h.leaseEnd) -- the latest holder's
  writeShared(lockKey, r, nowMs, graceMs)
  redis.call('PEXPIRE', holdersKey, r.leaseEnd - nowMs)
else
  writeHeld(lockKey, r, nowMs, graceMs)
end
indexPut(namesKey, endsKey, name, r.leaseEnd, nowMs)
count(statsKey, nowMs, 'renew.renewed')
return {1, tonumber(h.fence), h.leaseEnd - nowMs, nowMs, holdCount(h.holds)}
`,
);

/**
 * Release, any kind of lease. Returns 1 when the token held it (and it is now free, or, for a
 * reentrant lease, one hold fewer: the hold named by `hold`, none when that hold is gone, as for
 * a retry), also when this release already went through (a retried or duplicated request), else
 * 0. Every release that frees a lease is
 * remembered by token for RELEASE_MEMORY_MS (the last RELEASED_MARKS of a name; a grant to the
 * token forgets it): with the lease's fence, a retry matches exactly that lease; without it, the
 * token's latest lease, if that one was released.
 */
export const RELEASE = defineScript(
  "release",
  `
local lockKey     = KEYS[1]
local holdersKey  = KEYS[2]
local releasedKey = KEYS[3]          -- sorted set: released leases' tokens by fence
local token       = ARGV[1]
local graceMs     = tonumber(ARGV[2])
local fence       = ARGV[3]          -- the lease's fence, or '' when the caller does not know it
local name        = ARGV[4]
local hold        = ARGV[5]          -- a reentrant hold's id, or ''
local statsKey, namesKey, endsKey = KEYS[4], KEYS[5], KEYS[6] -- nil with stats off
${NOW}${RECORD_LUA}${HOLDERS_LUA}${INDEX_LUA}${STATS_LUA}
local function lost()
  count(statsKey, nowMs, 'release.lost')
  return 0
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
  local mark = tonumber(redis.call('ZSCORE', releasedKey, token))
  if fence == '' then return mark ~= nil end
  return mark == tonumber(fence) or released == fence .. ':' .. sha
end
local r = readRecord(lockKey)
if not r then
  if retried('', '') then return 1 end
  return lost()
end
if r.foreign then return lost() end
local sha = string.sub(redis.sha1hex(token), 1, 12)
if r.shared and nowMs < r.leaseEnd then
  local h = readHolder(redis.call('HGET', holdersKey, token))
  if h and nowMs < h.leaseEnd and (fence == '' or h.fence == fence) then
    if dropHold(h.holds, hold) > 0 then
      writeHolder(holdersKey, token, h)
      return 1
    end
    redis.call('HDEL', holdersKey, token)
    markReleased(releasedKey, token, h.fence)
    local _, used, latest = readHolders(holdersKey, nowMs, true)
    sampleHold(r, math.floor(tonumber(h.fence) / 1000)) -- a fence is its grant time in µs, or just past
    if used == 0 then
      r.released = h.fence .. ':' .. sha
      writeReleased(lockKey, r, graceMs)
      redis.call('DEL', holdersKey)
      indexEnd(endsKey, name, nowMs)
    else
      r.leaseEnd = latest
      writeShared(lockKey, r, nowMs, graceMs)
      redis.call('PEXPIRE', holdersKey, latest - nowMs)
      indexPut(namesKey, endsKey, name, latest, nowMs) -- the index ends with the latest holder
    end
    return 1
  end
end
if r.free or r.token ~= token or nowMs >= r.leaseEnd or (fence ~= '' and r.fence ~= fence) then
  if retried(r.released, sha) then return 1 end -- not held by this lease now
  return lost()
end
if dropHold(r.holds, hold) > 0 then
  writeHeld(lockKey, r, nowMs, graceMs)
  return 1
end
sampleHold(r, r.at)
r.released = r.fence .. ':' .. sha
writeReleased(lockKey, r, graceMs)
markReleased(releasedKey, token, r.fence)
indexEnd(endsKey, name, nowMs)
return 1
`,
);

/**
 * Inspect. Returns `{1, fence, pttl, nowMs, waiters, meta, mode, holders, permits, limit}` when
 * held, else `{0, nowMs}`; never a token. `fence` is the latest lease's, `pttl` the latest
 * lease end's; `mode` is exclusive, shared or semaphore; `permits` the permits held (the hold
 * count when exclusive). `waiters` counts the tickets not lapsed. Read-only.
 */
export const INSPECT = defineScript(
  "inspect",
  `
local lockKey    = KEYS[1]
local ticketsKey = KEYS[2]
local holdersKey = KEYS[3]
${NOW}${RECORD_LUA}${HOLDERS_LUA}
local r = readRecord(lockKey)
if not r or not (r.token or r.shared) or nowMs >= r.leaseEnd then
  return {0, nowMs}
end
local waiters = redis.call('ZCOUNT', ticketsKey, '(' .. nowMs, '+inf')
local reply = {1, tonumber(r.fence), r.leaseEnd - nowMs, nowMs, waiters}
if not r.shared then
  for _, v in ipairs({r.meta, 'exclusive', 1, holdCount(r.holds), 1}) do reply[#reply + 1] = v end
  return reply
end
local holders, used = readHolders(holdersKey, nowMs, false)
local n = 0
for _ in pairs(holders) do n = n + 1 end
local mode = 'shared'
if r.limit > 0 then mode = 'semaphore' end
for _, v in ipairs({'', mode, n, used, r.limit}) do reply[#reply + 1] = v end
return reply
`,
);

/**
 * List held names from the index, in order: those from `prefix` after `cursor`, at most
 * `limit`, looking at no more than `limit` × 4 + 16 entries (names whose lease ran out are
 * skipped). Returns `{nowMs, nextCursor, name...}`, nextCursor '' at the end. Read-only; the
 * caller inspects the names, so a release in between never shows as held.
 */
export const LIST = defineScript(
  "list",
  `
local namesKey = KEYS[1]
local endsKey  = KEYS[2]
local prefix   = ARGV[1]
local cursor   = ARGV[2]
local limit    = tonumber(ARGV[3])
${NOW}
local low = '[' .. prefix
if cursor ~= '' and cursor >= prefix then low = '(' .. cursor end
local high = '+'
if prefix ~= '' then high = '[' .. prefix .. '\\255' end
local names = redis.pcall('ZRANGEBYLEX', namesKey, low, high, 'LIMIT', 0, limit * 4 + 16)
if names.err then names = {} end -- a damaged index lists nothing
local found = {nowMs, ''}
for i, name in ipairs(names) do
  if #found - 2 == limit then
    found[2] = names[i - 1]
    return found
  end
  local leaseEnd = tonumber(redis.pcall('ZSCORE', endsKey, name)) -- nil when damaged
  if leaseEnd and leaseEnd > nowMs then found[#found + 1] = name end
end
if #names == limit * 4 + 16 then found[2] = names[#names] end
return found
`,
  { readOnly: true },
);

/** The held count and the stats hash: `{nowMs, held, field, value, ...}`. Read-only. */
export const READ_STATS = defineScript(
  "read_stats",
  `
local statsKey = KEYS[1]
local endsKey  = KEYS[2]
${NOW}
-- A damaged key (a hand edit, another type) reads as empty, as the scripts that count skip it.
local held = redis.pcall('ZCOUNT', endsKey, '(' .. nowMs, '+inf')
if type(held) ~= 'number' then held = 0 end
local reply = {nowMs, held}
local fields = redis.pcall('HGETALL', statsKey)
if fields.err then fields = {} end
for _, v in ipairs(fields) do reply[#reply + 1] = v end
return reply
`,
  { readOnly: true },
);

/** The number of audit entries a prefix keeps (its stream is trimmed to them). */
export const AUDIT_LENGTH = 1000;

/**
 * Break a held lock (an operator's act): the lease ends now (every holder's, when shared), its
 * fence stays the floor, so the holder's renew and release fail and the next grant gets a higher
 * fence; waiters keep their places. Recorded in the audit stream. Returns `{1, fence, nowMs}`, or
 * `{0, nowMs}` when it was not held. A break with an id is remembered for RELEASE_MEMORY_MS: a
 * retry answers the same and breaks nothing more (never a lease granted since).
 */
export const BREAK = defineScript(
  "break",
  `
local lockKey    = KEYS[1]
local holdersKey = KEYS[2]
local marksKey   = KEYS[3]
local auditKey   = KEYS[#KEYS]
local statsKey, namesKey, endsKey -- nil with stats off
if #KEYS == 7 then statsKey, namesKey, endsKey = KEYS[4], KEYS[5], KEYS[6] end
local graceMs  = tonumber(ARGV[1])
local name     = ARGV[2]
local by       = ARGV[3]
local reason   = ARGV[4]
local breakId  = ARGV[5] -- '' for none
${NOW}${RECORD_LUA}${INDEX_LUA}${STATS_LUA}
if breakId ~= '' then -- a retry: the same answer (a fence, or 0 for not held), nothing more
  local done = tonumber(redis.call('ZSCORE', marksKey, '~' .. breakId))
  if done == 0 then return {0, nowMs} end
  if done then return {1, done, nowMs} end
end
local r = readRecord(lockKey)
if not r or not (r.token or r.shared) or nowMs >= r.leaseEnd then
  if breakId ~= '' then markReleased(marksKey, '~' .. breakId, 0) end
  return {0, nowMs}
end
r.released = r.fence .. ':' .. string.sub(redis.sha1hex('broken:' .. (r.token or 'shared')), 1, 12)
writeReleased(lockKey, r, graceMs)
redis.call('DEL', holdersKey)
if breakId ~= '' then markReleased(marksKey, '~' .. breakId, r.fence) end
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
  `
return redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', tonumber(ARGV[1]))
`,
  { readOnly: true },
);

/** Health check: proves Redis runs scripts. Returns 1. */
export const PING = defineScript("ping", "return 1", { readOnly: true });
