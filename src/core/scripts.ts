/**
 * Every lock decision as one Lua script, run atomically on the Redis primary. Each script reads
 * the server clock with TIME, so no decision depends on a client's clock. Written for Redis 6.2
 * semantics (Upstash) and Redis 7.x. Every key a script touches is passed in `KEYS`, and every
 * key a script writes carries a TTL.
 *
 * Keys per lock name, all in one hash slot: `KEYS[1]` the lock record, one string, and
 * `KEYS[2]`/`KEYS[3]` the wait queue (tokens by arrival) and its tickets (tokens by deadline),
 * which exist only while callers wait and live as long as the latest ticket. The record is
 *
 * - `H<fence>|<leaseEndMs>|<atMs>|<holdMs>|<flag>|<token>|<released>|<meta>` while a lease may be
 *   held: it is held until `leaseEndMs` on the server clock;
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

/**
 * How long the last fence outlives its lease: fences keep increasing across this window even if
 * the server clock steps back within it. One hour.
 */
export const FENCE_GRACE_MS = 3_600_000;

/** A busy reply never asks a caller to look again sooner than this, in milliseconds. */
export const MIN_RETRY_MS = 5;

// Hold times feed busy replies' hints. A server clock that steps between grant and release gives
// a sample outside any real hold; each sample and the average stay within 1 ms and the longest TTL.
const MAX_HOLD_MS = LIMITS.ttlMs.max;

// The lock record: read, and written with a TTL that keeps the fence `graceMs` past the lease.
// A value this code did not write is `foreign`: busy until its TTL (given one if it has none).
const RECORD = `
local function clamp(value, low, high) return math.min(math.max(value, low), high) end
local function readRecord(key)
  local value = redis.call('GET', key)
  if not value then return nil end
  local kind = string.sub(value, 1, 1)
  if kind == 'H' then
    local fence, leaseEnd, at, hold, flag, token, released, meta =
      string.match(value, '^H(%d+)|(%d+)|(%d+)|(%d+)|([01])|([%w_-]+)|([%d:%x]*)|(.*)$')
    if fence then
      return {fence = fence, leaseEnd = tonumber(leaseEnd), at = tonumber(at),
        hold = tonumber(hold), flag = flag, token = token, released = released, meta = meta}
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
local function writeHeld(key, r, nowMs, graceMs)
  redis.call('SET', key, 'H' .. r.fence .. '|' .. string.format('%.0f', r.leaseEnd) .. '|' ..
    string.format('%.0f', r.at) .. '|' .. string.format('%d', math.floor(r.hold)) .. '|' ..
    r.flag .. '|' .. r.token .. '|' .. r.released .. '|' .. r.meta, 'PX',
    math.max(1, r.leaseEnd - nowMs + graceMs))
end
-- ms: the record's new TTL, or nil to keep its TTL.
local function writeReleased(key, r, ms)
  local value = 'R' .. r.fence .. '|' .. string.format('%d', math.floor(r.hold)) .. '|' .. r.flag ..
    '|' .. string.match(r.released, ':(%x+)$')
  if ms then redis.call('SET', key, value, 'PX', ms) else redis.call('SET', key, value, 'KEEPTTL') end
end
`;

// The held index, kept only with stats on (its keys are then passed, else nil): the prefix's
// recent names in order (`names`, all scores 0, for listing by prefix and cursor) and their lease
// ends (`ends`; minus the release time once released), so a name is held while its end is in the
// future. A name stays a minute after its release (acquiring it again is then cheaper); names
// released longer ago or whose lease ran out leave both sets, up to 1000 at the first grant of each
// minute and up to 4 at each grant of a name new to the index, so the sets hold about the names
// used in the last minute. Through pcall, like the stats: a damaged index never stops a decision.
const INDEX = `
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
 * Acquire, with a fair, bounded queue of waiters. Returns `{1, fence, ttlMs, nowMs}` when
 * acquired (or re-acquired by the same token, keeping its fence), `{0, retryAfterMs, nowMs,
 * position, pttl}` when busy: position 0 is the head of the queue, -1 not queued, -2 the queue was
 * full; pttl is the holder's lease left, ms (0 when free but kept for the head of the queue).
 * A new fence is max(now in µs, last fence + 1): strictly increasing while the record lives, and
 * past its expiry or a data loss still above every earlier fence unless the server clock stepped
 * back.
 *
 * Waiters (`ticketMs` > 0) take a FIFO ticket; a free lock goes to the head of the queue only,
 * and everyone else (waiting or not) is busy until it takes it or its ticket lapses. A ticket
 * lives `ticketMs` from each call, so a waiter that gave up or crashed blocks nobody for longer;
 * each call that looks at the queue drops every lapsed ticket (at most `maxWaiters`, the queue's
 * bound), wherever it is. `retryAfterMs` is when to look again: the holder's expected time left
 * from recent hold times, one more hold time per place further back, never past the holder's
 * lease end (or, with no holder, the head's ticket), never under MIN_RETRY_MS.
 */
export const ACQUIRE = defineScript(
  "acquire",
  `
local lockKey    = KEYS[1]
local queueKey   = KEYS[2]           -- sorted set: waiting tokens by arrival
local ticketsKey = KEYS[3]           -- sorted set: waiting tokens by ticket deadline, ms
local token      = ARGV[1]
local ttlMs      = tonumber(ARGV[2]) -- milliseconds
local meta       = ARGV[3]           -- JSON object text, or '' for none
local graceMs    = tonumber(ARGV[4]) -- how long the fence outlives the lease
local ticketMs   = tonumber(ARGV[5]) -- milliseconds a waiter's ticket lives; 0: do not queue
local maxWaiters = tonumber(ARGV[6]) -- the queue's bound
local name       = ARGV[7]           -- the lock's name, for the held index
local waitedMs   = tonumber(ARGV[8]) -- how long the caller has waited so far, for the stats
local waiting    = ARGV[9] == '1'    -- the caller waits: a busy reply is not its outcome yet
local statsKey, namesKey, endsKey = KEYS[4], KEYS[5], KEYS[6] -- nil with stats off
${NOW}${RECORD}${INDEX}${STATS_LUA}
local function granted(leaseEnd)
  if observe(statsKey, nowMs, 'wait', waitedMs) then indexPrune(namesKey, endsKey, nowMs, 1000) end
  indexPut(namesKey, endsKey, name, leaseEnd, nowMs)
end
local r = readRecord(lockKey)
if r and r.foreign then
  if not waiting then count(statsKey, nowMs, 'acquire.busy') end
  return {0, ${MIN_RETRY_MS}, nowMs, -1, ttlOrSet(lockKey, ${LIMITS.ttlMs.max})}
end
local held = r and r.token and nowMs < r.leaseEnd
if held and r.token == token then
  r.leaseEnd = nowMs + ttlMs
  if meta ~= '' then r.meta = meta end
  writeHeld(lockKey, r, nowMs, graceMs)
  granted(r.leaseEnd)
  return {1, tonumber(r.fence), ttlMs, nowMs}
end
-- No record (a first acquire, or one that was lost): look at the queue too.
local contended = not r or r.flag == '1'
local head
if contended then
  head = redis.call('ZRANGE', queueKey, 0, 0)[1]
  if head then -- the queue and its tickets hold the same tokens: no head, no tickets
    local lapsed = redis.call('ZRANGEBYSCORE', ticketsKey, '-inf', nowMs, 'LIMIT', 0, maxWaiters)
    if #lapsed > 0 then
      redis.call('ZREM', queueKey, unpack(lapsed))
      redis.call('ZREM', ticketsKey, unpack(lapsed))
      head = redis.call('ZRANGE', queueKey, 0, 0)[1]
    end
  end
end
local holdMs = clamp((r and r.hold) or 20, 1, ${MAX_HOLD_MS})
if not held and (not head or head == token) then
  local flag = '0'
  if head then
    redis.call('ZREM', queueKey, token)
    redis.call('ZREM', ticketsKey, token)
    if redis.call('ZCARD', queueKey) > 0 then flag = '1' end
  end
  local floor = (r and tonumber(r.fence)) or 0
  local grant = {fence = string.format('%.0f', math.max(nowUs, floor + 1)), leaseEnd = nowMs + ttlMs,
    at = nowMs, hold = holdMs, flag = flag, token = token, meta = meta,
    released = (r and r.released) or ''}
  writeHeld(lockKey, grant, nowMs, graceMs)
  granted(grant.leaseEnd)
  return {1, tonumber(grant.fence), ttlMs, nowMs}
end
-- Busy. Contention is noted in the record (its TTL kept), so release samples the hold time and
-- the next acquire looks at the queue.
if r and r.flag ~= '1' then
  r.flag = '1'
  if r.free then
    writeReleased(lockKey, r, nil)
  else
    writeHeld(lockKey, r, nowMs, graceMs)
  end
end
local pttl = 0
if held then
  pttl = r.leaseEnd - nowMs
  ttlOrSet(lockKey, pttl + graceMs)
end
local position = -1
if ticketMs > 0 then
  if redis.call('ZSCORE', queueKey, token) then
    position = 0
  elseif redis.call('ZCARD', queueKey) >= maxWaiters then
    position = -2
  else
    -- Arrival order from the queue itself: one past the last waiter's place.
    local last = redis.call('ZRANGE', queueKey, -1, -1, 'WITHSCORES')[2]
    redis.call('ZADD', queueKey, (tonumber(last) or 0) + 1, token)
    position = 0
  end
  if position == 0 then
    redis.call('ZADD', ticketsKey, nowMs + ticketMs, token)
    -- The queue lives as long as its latest ticket, so no ticket dies before its deadline.
    local latest = tonumber(redis.call('ZRANGE', ticketsKey, -1, -1, 'WITHSCORES')[2])
    redis.call('PEXPIRE', queueKey, math.max(latest - nowMs, 1))
    redis.call('PEXPIRE', ticketsKey, math.max(latest - nowMs, 1))
    position = redis.call('ZRANK', queueKey, token)
  end
end
if position == -2 then
  count(statsKey, nowMs, 'acquire.queue_full')
elseif not waiting then
  count(statsKey, nowMs, 'acquire.busy')
end
-- The holder's expected time left, then one hold per waiter ahead. A holder past the usual hold
-- time may hold much longer: look again after half the time it has held so far (backoff).
local left = holdMs
local cap
local heldFor = 0
if held then
  heldFor = clamp(nowMs - r.at, 0, ${MAX_HOLD_MS})
  left = math.max(holdMs - heldFor, heldFor / 2, 1)
  cap = pttl
else
  -- Free, but kept for the head: it takes the lock or its ticket lapses by then.
  cap = (tonumber(redis.call('ZSCORE', ticketsKey, head)) or nowMs) - nowMs
end
-- The head is told when the release is expected here (the sampled holds run from grant to the
-- release's arrival); a look that arrives early costs a whole round trip, one that arrives late
-- only the lateness. Past the usual hold it backs off like everyone else.
local retryAfter = math.min(left + holdMs * math.max(position, 0), cap)
return {0, math.floor(math.max(${MIN_RETRY_MS}, retryAfter)), nowMs, position, pttl}
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

/** Renew. Returns `{1, fence, ttlMs, nowMs}`, or `{0, nowMs}` when the token no longer holds it. */
export const RENEW = defineScript(
  "renew",
  `
local lockKey  = KEYS[1]
local token    = ARGV[1]
local ttlMs    = tonumber(ARGV[2]) -- milliseconds
local graceMs  = tonumber(ARGV[3])
local name     = ARGV[4]
local statsKey, namesKey, endsKey = KEYS[2], KEYS[3], KEYS[4] -- nil with stats off
${NOW}${RECORD}${INDEX}${STATS_LUA}
local r = readRecord(lockKey)
if not r or r.token ~= token or nowMs >= r.leaseEnd then
  count(statsKey, nowMs, 'renew.lost')
  return {0, nowMs}
end
r.leaseEnd = nowMs + ttlMs
writeHeld(lockKey, r, nowMs, graceMs)
indexPut(namesKey, endsKey, name, r.leaseEnd, nowMs)
count(statsKey, nowMs, 'renew.renewed')
return {1, tonumber(r.fence), ttlMs, nowMs}
`,
);

/**
 * Release. Returns 1 when the token held the lock and it is now free, also when this lease's
 * release already freed it (a retried or duplicated request), else 0. The record keeps the last
 * release's token: with the lease's fence, a retry matches exactly that lease; without it, only
 * while no lease was granted since. So a token whose later lease was lost learns so, even though
 * an earlier lease of the same token was released.
 */
export const RELEASE = defineScript(
  "release",
  `
local lockKey  = KEYS[1]
local token    = ARGV[1]
local graceMs  = tonumber(ARGV[2])
local fence    = ARGV[3]           -- the lease's fence, or '' when the caller does not know it
local name     = ARGV[4]
local statsKey, namesKey, endsKey = KEYS[2], KEYS[3], KEYS[4] -- nil with stats off
${NOW}${RECORD}${INDEX}${STATS_LUA}
local r = readRecord(lockKey)
if not r or r.foreign then
  count(statsKey, nowMs, 'release.lost')
  return 0
end
local sha = string.sub(redis.sha1hex(token), 1, 12)
if r.free or r.token ~= token or nowMs >= r.leaseEnd or (fence ~= '' and r.fence ~= fence) then
  -- A retry of a release that went through: the record remembers the last one. Without the
  -- lease's fence, only while no lease was granted since.
  local which = fence
  if which == '' then
    if not r.free then
      count(statsKey, nowMs, 'release.lost')
      return 0
    end
    which = r.fence
  end
  if r.released == which .. ':' .. sha then return 1 end
  count(statsKey, nowMs, 'release.lost')
  return 0
end
local holdMs = r.hold
if r.flag == '1' then
  -- A moving average of hold times, for waiters' hints. A negative hold means the server clock
  -- stepped back: no sample. A forward step counts as at most the longest lease.
  local sample = nowMs - r.at
  if sample >= 0 then
    holdMs = (clamp(holdMs, 1, ${MAX_HOLD_MS}) + clamp(sample, 1, ${MAX_HOLD_MS})) / 2
  end
end
r.hold = holdMs
r.released = r.fence .. ':' .. sha
writeReleased(lockKey, r, graceMs)
indexEnd(endsKey, name, nowMs)
observe(statsKey, nowMs, 'hold', nowMs - r.at)
return 1
`,
);

/**
 * Inspect. Returns `{1, fence, pttl, nowMs, waiters, meta}` when held, else `{0, nowMs}`; never
 * the token. `waiters` counts the tickets not lapsed. Read-only.
 */
export const INSPECT = defineScript(
  "inspect",
  `
local lockKey    = KEYS[1]
local ticketsKey = KEYS[2]
${NOW}${RECORD}
local r = readRecord(lockKey)
if not r or not r.token or nowMs >= r.leaseEnd then
  return {0, nowMs}
end
local waiters = redis.call('ZCOUNT', ticketsKey, '(' .. nowMs, '+inf')
return {1, tonumber(r.fence), r.leaseEnd - nowMs, nowMs, waiters, r.meta}
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
);

/** The number of audit entries a prefix keeps (its stream is trimmed to them). */
export const AUDIT_LENGTH = 1000;

/**
 * Break a held lock (an operator's act): the lease ends now, its fence stays the floor, so the
 * holder's renew and release fail and the next grant gets a higher fence; waiters keep their
 * places. Recorded in the audit stream. Returns `{1, fence, nowMs}`, or `{0, nowMs}` when it was
 * not held.
 */
export const BREAK = defineScript(
  "break",
  `
local lockKey  = KEYS[1]
local auditKey = KEYS[#KEYS]
local statsKey, namesKey, endsKey -- nil with stats off
if #KEYS == 5 then statsKey, namesKey, endsKey = KEYS[2], KEYS[3], KEYS[4] end
local graceMs  = tonumber(ARGV[1])
local name     = ARGV[2]
local by       = ARGV[3]
local reason   = ARGV[4]
${NOW}${RECORD}${INDEX}${STATS_LUA}
local r = readRecord(lockKey)
if not r or not r.token or nowMs >= r.leaseEnd then
  return {0, nowMs}
end
r.released = r.fence .. ':' .. string.sub(redis.sha1hex('broken:' .. r.token), 1, 12)
writeReleased(lockKey, r, graceMs)
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
);

/** Health check: proves Redis runs scripts. Returns 1. */
export const PING = defineScript("ping", "return 1");
