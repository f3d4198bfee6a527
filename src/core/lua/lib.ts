/**
 * Every lock decision as one Lua script, run atomically on the Redis primary. Each script reads
 * the server clock with TIME, so no decision depends on a client's clock. Written for Redis 6.2
 * semantics (Upstash) and Redis 7.x. Every key a script touches is passed in `KEYS`, and every
 * key a script writes carries a TTL.
 *
 * Keys per lock name, all in one hash slot: the lock record, one string; the wait queue (members
 * by arrival) and its tickets (members by deadline), which exist only while callers wait and live
 * MAX_TICKET_MS past the last look, beyond every ticket; for shared and semaphore leases
 * (`./acquire_shared.ts`) the holders' hash and the last releases. The record is
 *
 * - `X<fence>|<leaseEnd>|<at>|<holdMs>|<flag>|<token>|<released>|<holds>|<meta>` while an exclusive
 *   lease may be held: it is held until `leaseEnd` on the server clock. `leaseEnd` and `at` (the
 *   grant time) count ms from the fence's own millisecond (`floor(fence / 1000)`, about the grant
 *   time), so they are short (`60000|0`): a name's first lease, with a generated token and no
 *   meta, is 57 characters, within Redis's 64-byte allocation (136 B per held lock with a
 *   12-character name, taken again by another token as well; taken again by the token that
 *   released it last, it carries that release, 29 characters more: 168 B, see `ownRelease`).
 *   Builds before this form wrote `H…`, with both in ms since the epoch: still read, and kept `H`
 *   until that lease ends (see the CHANGELOG for what a fleet of both builds meets);
 * - `S<fence>|<leaseEndMs>|<atMs>|<holdMs>|<flag>|<limit>|<released>` while shared or semaphore
 *   leases may be held, until the latest holder's `leaseEndMs`;
 * - `R<fence>|<holdMs>|<flag>|<sha>` once it was released (`released` is then `<fence>:<sha>`).
 *
 * `released` is `<fence>:<sha>` of the last release, `sha` the first 12 hex digits of the SHA-1 of
 * its token, so a retried release answers the same for exactly that lease (an exclusive lease's
 * record keeps it only when the release was its own token's: the marks have it for any other).
 *
 * Either way it keeps the last fence (the floor) for `graceMs` after the lease ends, so fences keep
 * increasing across that window even if the server clock steps back within it. `holdMs` is a
 * moving average of hold times, for waiters' hints; `flag` is 1 while the lock is contended (a
 * busy reply or a queued waiter since the last grant): then acquire looks at the queue and release
 * samples the hold time. Without contention an acquire+release cycle of a name used before runs
 * nine commands inside its two scripts (TIME, GET, SET each; the acquire's ZSCORE of the marks,
 * the release's ZADD and PEXPIRE of them, and their trim at about one release in TRIM_EVERY),
 * eleven with the two EVALSHA calls; a name's first acquire also runs EXISTS on its queue and
 * tickets. The stats and the held index (`../stats.ts`) add eight when they are on, in the same
 * scripts (twelve for a name new to the index; one fewer when the acquire waited under a
 * millisecond, which adds nothing to the wait's sum).
 *
 * This module holds the Lua pieces the scripts share, each a set of local functions spliced in
 * after a script's header (`./_define.ts`), and the constants they are written with; each script
 * is a module of its own beside it. `deno task lua <script>` prints a script as Redis runs it,
 * with line numbers, since Redis reports errors by them.
 *
 * @module
 */

import { DEFAULT_HOLD_MS, LIMITS } from "../_validate.ts";
import { STATS_LUA, STATS_RETENTION_MS } from "../stats.ts";

export { STATS_LUA, STATS_RETENTION_MS };
export { NOW } from "./now.ts";

/** A busy reply never asks a caller to look again sooner than this, in milliseconds. */
export const MIN_RETRY_MS = 5;

// Hold times feed busy replies' hints. A server clock that steps between grant and release gives
// a sample outside any real hold; each sample and the average stay within 1 ms and the longest TTL.
export const MAX_HOLD_MS = LIMITS.ttlMs.max;

/** The most waiters a queue ever holds (\`maxWaiters\` is at most this). */
export const MAX_QUEUE = 1000;

/**
 * The longest a waiter's ticket lives from its look, ms (a longer one is cut to this): its queue
 * keys live this long from each look, past every ticket. Waiters take at most 4.25 s (see
 * `../_wait.ts`); the rest is room for callers of the scripts that ask more, such as tests. The
 * keys of a queue whose waiters all lapsed go at the next look, or at this TTL.
 */
export const MAX_TICKET_MS = 60_000;

/** How many waiters an exclusive look reads: it joins a shorter queue without reading it again. */
export const SEEN_WAITERS = 32;

/** How many releases a name remembers at least, for retried releases. */
export const RELEASED_MARKS = 1000;

/**
 * The marks' trim, after a release's mark: back to RELEASED_MARKS at about one release in
 * TRIM_EVERY (those run in a server µs that divides by it), so the others skip a command. No
 * caller can choose which: the lease's fence, which it knows before it releases, would let it
 * release only leases that never trim. A name keeps its last RELEASED_MARKS releases and a few
 * more: 16 on average, over 250 about once in 10^7 trims.
 */
export const TRIM_EVERY = 16;
export const TRIM_MARKS =
  `if nowUs % ${TRIM_EVERY} == 0 then redis.call('ZREMRANGEBYRANK', marksKey, 0, -${
    RELEASED_MARKS + 1
  }) end`;

/** The most holds one reentrant lease (or one shared holder) counts; one more is `hold_limit`. */
export const MAX_HOLDS = 64;

/** How long the readers' bell outlives its last ring, ms: past any reader's block on it. */
export const BELL_MS = 5000;
/** How many rings the bell keeps: a reader that listens late still finds its grant. */
export const BELL_ENTRIES = 16;
/** The most readers one ring grants (each with its stats); those after it look. */
export const READERS_PER_RING = 32;
/** The most shared holders one name has at once; one more is busy. */
export const MAX_SHARED = 1000;
/** The most wake ids a grant names as the next waiters, for its release's hand-off. */
export const WAKE_HINTS = 8;

/**
 * How long a name remembers a release (or a break) by its token (or break id), so that a retry
 * answers the same: ten minutes, far beyond any client's retries.
 */
export const RELEASE_MEMORY_MS = 600_000;

// `supersede`, at a grant to a token: a release without a fence now means the new lease, so the
// token's mark (its last release) moves to the member `<token>@<fence>`, which answers only a
// retry with that release's fence (see `retried` in ./release.ts); `@` is in no token.
// A lease's holds, written `<n>` or `<n>,<id>,<id>…`: n holds without an id (a plain acquire's,
// and every hold of a record written before hold ids) and the ids of reentrant holds. A
// reentrant acquire or release names its own hold, so a retry of either takes effect once. `<n>p`
// says a hold without an id was released while reentrant holds remain (\`plainGone\`), so a retry
// of that release is told apart from a release that forgot its hold.
const HOLDS_LUA = `
local function readHolds(text)
  local holds = {anon = tonumber(string.match(text, '^%d+')), ids = {},
    plainGone = string.match(text, '^%d+p') ~= nil}
  for id in string.gmatch(text, ',([%w_-]+)') do holds.ids[#holds.ids + 1] = id end
  return holds
end
local function holdsText(holds)
  local anon = string.format('%d', holds.anon) .. ((holds.plainGone and 'p') or '')
  if #holds.ids == 0 then return anon end
  return anon .. ',' .. table.concat(holds.ids, ',')
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
-- False when the lease has the most holds (MAX_HOLDS) already.
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
    holds.plainGone = holds.anon == 0
  end
  return holdCount(holds)
end
-- A release without a hold id, of a lease whose holds all have ids (and never had one without,
-- which a retry would be ending again): the caller forgot its hold.
local function holdForgotten(holds, hold)
  return hold == '' and holds.anon == 0 and not holds.plainGone
end
-- a grant to token: its mark kept as \`<token>@<fence>\` (see above)
local function supersede(marksKey, token)
  local mark = tonumber(redis.call('ZSCORE', marksKey, token))
  if mark then
    redis.call('ZADD', marksKey, mark, token .. '@' .. string.format('%.0f', mark))
    redis.call('ZREM', marksKey, token)
  end
end
-- Remembers a release (member: a token, or '~' and a break id) with its fence, for retries.
local function markReleased(marksKey, member, fence)
  redis.call('ZADD', marksKey, fence, member)
  ${TRIM_MARKS}
  redis.call('PEXPIRE', marksKey, ${RELEASE_MEMORY_MS})
end
`;

// The lock record: read, and written with a TTL that keeps the fence `graceMs` past the lease.
// A value this code did not write is `foreign`: busy until its TTL (given one if it has none).
// `ownRelease`: the marks remember every release (a release marks its token as it frees the
// record), and a grant to a token keeps that token's mark for retries with its fence
// (`supersede`). Earlier builds forgot the mark at a grant, leaving only the record's copy: a new
// exclusive lease's record keeps the last release where such a build may have forgotten its mark
// (the new token's, or the token's whose lease the record holds or held unreleased, or any of a
// shared record, whose holders it does not name); otherwise the record stays short.
export const RECORD_LUA = `
local function clamp(value, low, high) return math.min(math.max(value, low), high) end
-- value: the key's value when the caller read it already (false: none), else nil.
${HOLDS_LUA}local function readRecord(key, value)
  if value == nil then value = redis.call('GET', key) end
  if not value then return nil end
  local kind = string.sub(value, 1, 1)
  if kind == 'X' or kind == 'H' then
    local fence, leaseEnd, at, hold, flag, token, released, count, meta = string.match(value,
      '^.(%d+)|(%-?%d+)|(%-?%d+)|(%d+)|([01])|([%w_-]+)|([%d:%x]*)|(%d[%w_,%-]*)|(.*)$')
    -- H written before hold counts: one hold
    if not fence and kind == 'H' then
      fence, leaseEnd, at, hold, flag, token, released, meta = string.match(value,
        '^H(%d+)|(%d+)|(%d+)|(%d+)|([01])|([%w_-]+)|([%d:%x]*)|(.*)$')
      count = '1'
    end
    if fence then
      -- X counts both times from the fence's millisecond, H from the epoch
      local base = (kind == 'X' and math.floor(tonumber(fence) / 1000)) or 0
      return {fence = fence, leaseEnd = base + tonumber(leaseEnd), at = base + tonumber(at),
        hold = tonumber(hold), flag = flag, token = token, released = released,
        holds = readHolds(count), meta = meta, form = kind}
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
-- What a new exclusive lease of \`token\` keeps of record r's last release (see above)
local function ownRelease(r, token)
  local sha = r and string.match(r.released or '', ':(%x+)$')
  if not sha then return '' end
  local function owns(t) return t and sha == string.sub(redis.sha1hex(t), 1, #sha) end
  if r.shared or owns(token) or (not r.free and owns(r.token)) then return r.released end
  return ''
end
-- A lease written H stays H while it lasts (a busy look, a renew, a reentrant hold), so the build
-- that wrote it still reads it; each new grant is written X.
local function writeHeld(key, r, nowMs, graceMs)
  local form, base = 'X', math.floor(tonumber(r.fence) / 1000)
  if r.form == 'H' then form, base = 'H', 0 end
  redis.call('SET', key, form .. r.fence .. '|' .. ms(r.leaseEnd - base) .. '|' .. ms(r.at - base) .. '|' ..
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
// knows what each waiter asks for. `joinQueue`'s `rank` is the member's place when the caller
// read it already in the script (false: not in the queue), else nil; its `seen` is what
// `queueHead` read of this queue in this script (the first members, their places' scores when
// it was asked for them, how many it asked for), unchanged since, else nil: a member among them,
// or a queue shorter than that, is joined without reading the queue again. No ticket lives past MAX_TICKET_MS from its
// look (the scripts cut a longer one), so the queue, its tickets and offers, given that TTL at each
// look, outlive every ticket without reading the latest.
export const QUEUE_LUA = `
-- The head of the queue, once every lapsed ticket is dropped, and the first \`count\` waiters (1
-- when nil). With offersKey, the lapsed ones' offers go too. Third, what was read, for joinQueue.
local function queueHead(queueKey, ticketsKey, nowMs, offersKey, count, withScores)
  count = count or 1
  local function read()
    if not withScores then return redis.call('ZRANGE', queueKey, 0, count - 1), nil end
    local raw, members, scores = redis.call('ZRANGE', queueKey, 0, count - 1, 'WITHSCORES'), {}, {}
    for i = 1, #raw, 2 do members[#members + 1], scores[#scores + 1] = raw[i], raw[i + 1] end
    return members, scores
  end
  local first, scores = read()
  -- the queue and its tickets hold the same members (no head, no tickets), and places left
  if first[1] then
    local lapsed = redis.call('ZRANGEBYSCORE', ticketsKey, -nowMs, nowMs, 'LIMIT', 0, ${MAX_QUEUE})
    if #lapsed > 0 then
      redis.call('ZREM', queueKey, unpack(lapsed))
      redis.call('ZREM', ticketsKey, unpack(lapsed))
      if offersKey then redis.call('HDEL', offersKey, unpack(lapsed)) end
      first, scores = read()
    end
  end
  return first[1], first, {members = first, scores = scores, count = count}
end
-- Takes a ticket for ticketMs (keeping an earlier place); returns the place, 0 the head, or -2
-- when the queue is full, and the ticket's end (ms, to the server's µs: this look's alone). With
-- \`offersKey\`, the waiter's \`offer\` (nil for none) goes beside it.
-- A place left (ticket -<end>, offer l<place>|<end>) is taken back until its end, unless \`fresh\`.
local function joinQueue(queueKey, ticketsKey, member, nowMs, ticketMs, maxWaiters, offersKey, offer, rank, seen, fresh)
  local place, size, last = rank, nil, nil
  if place == nil and seen then
    for i, m in ipairs(seen.members) do
      if m == member then place = i - 1; break end
    end
    -- the whole queue, without the member
    if place == nil and #seen.members < seen.count then
      place, size = false, #seen.members
      if seen.scores then last = tonumber(seen.scores[#seen.scores]) or 0 end
    end
  end
  if place == nil then place = redis.call('ZRANK', queueKey, member) end
  local queued = place
  if not queued then
    place = size or redis.call('ZCARD', queueKey)
    if place >= maxWaiters then return -2 end
  end
  local ticket = string.format('%.17g', nowUs / 1000 + math.min(ticketMs, ${MAX_TICKET_MS}))
  local added = redis.call('ZADD', ticketsKey, ticket, member)
  if not queued then
    local left, ends
    if added == 0 and offersKey and not fresh then
      left, ends = string.match(redis.call('HGET', offersKey, member) or '', '^l(%d+)|(%d+)$')
    end
    if left and tonumber(ends) > nowMs then
      redis.call('ZADD', queueKey, left, member)
      place = redis.call('ZRANK', queueKey, member)
    else
      -- past the last waiter's place and any place left (at most the server's µs then)
      last = last or tonumber(redis.call('ZRANGE', queueKey, -1, -1, 'WITHSCORES')[2]) or 0
      redis.call('ZADD', queueKey, string.format('%.0f', math.max(last + 1, nowUs)), member)
    end
  end
  redis.call('PEXPIRE', queueKey, ${MAX_TICKET_MS})
  redis.call('PEXPIRE', ticketsKey, ${MAX_TICKET_MS})
  if offersKey then
    if offer then redis.call('HSET', offersKey, member, offer)
    else redis.call('HDEL', offersKey, member) end
    redis.call('PEXPIRE', offersKey, ${MAX_TICKET_MS})
  end
  return place, ticket
end
-- Returns the waiter now at the head, nil when the queue is empty, and the first waiters (up to
-- WAKE_HINTS, for a grant's hint). With offersKey, the member's offer goes too. \`queue\`, when
-- given, is the first waiters (WAKE_HINTS + 1 or more) as \`queueHead\` read them in this script:
-- when the member leaving is their head, the waiters after it are not read again. The last
-- waiter's grant ends the places left with the queue (\`endPlaces\`); a leave that is no grant
-- (\`keep\`) does not.
local function endPlaces(ticketsKey, offersKey)
  if offersKey then redis.call('DEL', ticketsKey, offersKey) else redis.call('DEL', ticketsKey) end
end
local function leaveQueue(queueKey, ticketsKey, member, offersKey, queue, keep)
  redis.call('ZREM', queueKey, member)
  local first
  if queue and queue[1] == member then first = {unpack(queue, 2, ${WAKE_HINTS} + 1)}
  else first = redis.call('ZRANGE', queueKey, 0, ${WAKE_HINTS} - 1) end
  if not first[1] and not keep then
    endPlaces(ticketsKey, offersKey)
  else
    redis.call('ZREM', ticketsKey, member)
    if offersKey then redis.call('HDEL', offersKey, member) end
  end
  return first[1], first
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

// Hand-off at release. An exclusive or semaphore waiter that blocks on a wake key of its own (a list,
// `<lock>:wake:<wakeId>`, its wake id random per acquire) leaves an offer beside its ticket in
// `offersKey`: member -> `<ttlMs>|<sinceMs>|<wakeId>|<hold>|<limit>|<meta>` (`limit` 0 for an
// exclusive waiter, else a semaphore's). A release that frees the lock (or a semaphore's permits)
// grants it in place to the head of the queue when the head left an offer, fits, and the caller
// declared the head's wake key (every key a script touches is in KEYS): the head's lease is
// written as if it had acquired, and the grant, `<fence>:<leaseEndMs>:<nowMs>:<next>`, is
// pushed onto its wake key (`next` the grant's hint, `grantHint`: the wake ids of the first
// waiters now, up to WAKE_HINTS, '' for none, so the new holder's release can declare their wake
// keys in turn). A head whose wake key was not declared is
// named in the reply; the caller hands over with `./hand_over.ts`. The pushed grant is only a
// message: the record is the lease, and a waiter that missed its grant finds it at its next look.
// OFFER_LUA is the waiter's side (its offer, and the next waiters' wake ids for a grant's hint),
// HANDOFF_LUA the release's, after it. Written with the names `offersKey`, `queueKey`,
// `ticketsKey`, `marksKey`, `lockKey`, `graceMs` and `name` of the calling script, and for
// HANDOFF_LUA the declared wake keys (`n`, `hints`, `hintKey`), after RECORD_LUA, QUEUE_LUA,
// INDEX_LUA and STATS_LUA.
export const OFFER_LUA = `
-- An offer's fields from its text (false or nil for none), nil for none. A multi-name waiter's
-- (\`m…\`, see \`./acquire_all.ts\`) has \`names\`, its names comma-joined, the first its wake key's.
local function parseOffer(text)
  local ttl, since, wake, hold, limit, meta = string.match(text or '',
    '^(%d+)|(%d+)|([%w_-]+)|([%w_-]*)|(%d+)|(.*)$')
  if ttl then
    return {ttl = tonumber(ttl), since = tonumber(since), wake = wake, hold = hold,
      limit = tonumber(limit), meta = meta}
  end
  local names
  ttl, since, wake, names, meta = string.match(text or '', '^m(%d+)|(%d+)|([%w_-]+)|([^|]+)|(.*)$')
  if not ttl then return nil end
  return {ttl = tonumber(ttl), since = tonumber(since), wake = wake, names = names, meta = meta}
end
-- The offers' texts of \`members\` (false for none), in their order: one HMGET.
local function offersOf(members)
  if #members == 0 then return {} end
  return redis.call('HMGET', offersKey, unpack(members))
end
-- A blocking waiter's wake id (before \`busy\`): the first behind a lease granted with none
-- waiting takes \`f<fence>\`, which its release declares; the head keeps its offer's, same hold.
local function wakeFor(r, held, head, member)
  if held and not head and r.flag == '0' then return 'f' .. r.fence end
  local o = head == member and parseOffer(redis.call('HGET', offersKey, member))
  if o and o.hold == hold and #o.wake <= 64 then return o.wake end
  return wakeId
end
-- A busy look's offer, for a waiter that blocks on the key of \`wake\` (\`limit\` 0 when exclusive).
-- The look clears the key it declared: no grant there is a live lease (one since broken, or ended
-- by another call with the token), so the block that follows waits for a new one only.
local function blockingOffer(limit, wake)
  redis.call('DEL', wakeKey)
  return string.format('%d|%d|', ttlMs, nowMs - waitedMs) .. wake .. '|' .. hold .. '|' .. limit ..
    '|' .. meta
end
-- The first waiters in the queue, up to WAKE_HINTS: those a grant's hint may name.
local function firstWaiters() return redis.call('ZRANGE', queueKey, 0, ${WAKE_HINTS} - 1) end
-- A grant's hint of who comes next, for its release to declare the wake keys: the wake ids of
-- \`first\` (the first waiters, nil for none) that left offers, comma-joined; \`offers\` their
-- offers' texts when already read (else they are read here). The head when the lease ends is
-- mostly among them: a semaphore's other holders' releases take the waiters before it, and a
-- writer's release grants the readers behind it at once. A multi-name waiter at the head is
-- named alone, \`<wakeId>|<names>\`: the release hands it its names in the same request.
local function grantHint(first, offers)
  if not first or #first == 0 then return '' end
  offers = offers or offersOf(first)
  local head = parseOffer(offers[1])
  if head and head.names then return head.wake .. '|' .. head.names end
  local ids = {}
  for i = 1, #first do
    ids[#ids + 1] = offers[i] and string.match(offers[i], '^%d+|%d+|([%w_-]+)|') or nil
  end
  return table.concat(ids, ',')
end
-- a reply's text, false for none: an Upstash client parses '' with a throw
local function orNone(text) return text ~= '' and text or false end
`;

/**
 * For the scripts over several names (\`offersKey(i)\` each): name i's grant hint (\`grantHint\`),
 * its first waiters \`first\` with their offers. After OFFER_LUA.
 */
export const NAMES_HINT_LUA = `
local function hintOf(i, first)
  if not first or #first == 0 then return '' end
  return grantHint(first, redis.call('HMGET', offersKey(i), unpack(first)))
end
`;

/** The release's side of the hand-off (see OFFER_LUA), after it. */
export const HANDOFF_LUA = `
-- Where the caller declared the wake key with id \`wake\`: its index (\`hintKey(i)\`), else nil.
local function declared(wake)
  for i = 1, n do if hints[i] == wake then return i end end
  return nil
end
-- Grants the readers at the head of the queue that left offers (up to READERS_PER_RING, in queue
-- order, stopping at the first that did not, or at a writer or a semaphore's waiter), each as if
-- it had acquired (its own fence). A granted reader whose wake key the caller declared gets its
-- grant there (a stream of one entry, \`grant\`), woken alone; the others' grants go in one ring
-- of the readers' bell (\`readersKey\`, a stream), under their wake ids, which wakes every reader
-- listening on it: one granted there has its lease, the others listen on, or look when \`more\`
-- says a reader left at the head may fit (then the bell rings even with no grant). Returns 1 when
-- it granted any (the record is then theirs), else nil. Called when readers fit: the name free, or
-- held by readers only (\`r\`, its record).
local function grantReaders(r)
  if not readersKey then return nil end
  local live = not r.free and r.shared and r.limit == 0 and r.leaseEnd ~= nil and nowMs < r.leaseEnd
  local holders, used = {}, 0
  if live then holders, used = readHolders(holdersKey, nowMs, true) end
  local fence, leaseEnd, entry, direct = r.fence, (live and r.leaseEnd) or 0, {}, {}
  local members = redis.call('ZRANGE', queueKey, 0, ${READERS_PER_RING} - 1)
  local offers = offersOf(members)
  for i, m in ipairs(members) do
    local token = string.match(m, '^([%w_-]+)~s$')
    local offer = token and not holders[token] and used < ${MAX_SHARED} and parseOffer(offers[i])
    if not offer then break end
    -- the holders of an earlier spell go
    if #entry == 0 and #direct == 0 and not live then redis.call('DEL', holdersKey) end
    fence = string.format('%.0f', math.max(nowUs, tonumber(fence) + 1))
    local h = {leaseEnd = nowMs + offer.ttl, fence = fence, permits = 1,
      holds = newHolds(offer.hold), meta = offer.meta}
    writeHolder(holdersKey, token, h)
    holders[token], used, leaseEnd = h, used + 1, math.max(leaseEnd, h.leaseEnd)
    redis.call('ZREM', queueKey, m)
    redis.call('ZREM', ticketsKey, m)
    redis.call('HDEL', offersKey, m)
    -- a release without a fence now means this lease
    supersede(marksKey, token)
    local grant = fence .. ':' .. ms(h.leaseEnd) .. ':' .. ms(nowMs)
    local hinted = declared(offer.wake)
    if hinted then
      direct[#direct + 1] = {at = hinted, grant = grant, ttl = offer.ttl, wake = offer.wake}
    else
      entry[#entry + 1], entry[#entry + 2] = offer.wake, grant
    end
    noteGrant(statsKey, namesKey, endsKey, nowMs, nowMs - offer.since)
  end
  -- The next waiters (a writer first, mostly) are told to each reader: a release then names their
  -- wake keys. A reader at the head (one that polls, or past the most one ring grants) may fit
  -- too: \`more\` tells the readers not granted here to look; else they listen on.
  local first = firstWaiters()
  local after, more = grantHint(first), (first[1] and string.sub(first[1], -2) == '~s' and 1) or 0
  for _, d in ipairs(direct) do
    local at = d.at
    -- Through pcall: a wake key of another type (a hand edit) sends that grant in the ring instead;
    -- an error here would end the script with the leases above written and the record not.
    local sent = redis.pcall('XADD', hintKey(at), 'MAXLEN', '1', '*', 'grant', d.grant .. ':' .. after)
    if type(sent) == 'table' and sent.err then
      entry[#entry + 1], entry[#entry + 2] = d.wake, d.grant
    else
      redis.call('PEXPIRE', hintKey(at), d.ttl)
    end
  end
  if #entry > 0 or more == 1 then
    for i = 2, #entry, 2 do entry[i] = entry[i] .. ':' .. after end
    -- Through pcall: a bell key of another type (a hand edit) costs the readers their ring, which
    -- they make up for at their next look, and never the grants written above.
    redis.pcall('XADD', readersKey, 'MAXLEN', '${BELL_ENTRIES}', '*', 'at', nowMs, 'more', more,
      unpack(entry))
    redis.pcall('PEXPIRE', readersKey, ${BELL_MS})
  end
  if #entry == 0 and #direct == 0 then return nil end
  local flag = (first[1] and '1') or '0'
  if flag == '0' then endPlaces(ticketsKey, offersKey) end
  writeShared(lockKey, {fence = fence, leaseEnd = leaseEnd, at = nowMs,
    hold = clamp(r.hold, 1, ${MAX_HOLD_MS}), flag = flag, limit = 0, released = r.released,
    shared = true}, nowMs, graceMs)
  redis.call('PEXPIRE', holdersKey, leaseEnd - nowMs)
  indexPut(namesKey, endsKey, name, leaseEnd, nowMs)
  return 1
end
-- Grants the name (r, its record) to the head of the queue when it left an offer whose wake key
-- the caller declared (\`n\` of them, \`hintKey(i)\` each, their ids \`hints\`) and it fits: an
-- exclusive waiter when the name is free, a semaphore's (member \`<token>~<permits>\`) when its
-- permits fit beside the holders' of the same limit; readers, when they fit, by grantReaders.
-- Returns 1 when handed over, the head's wake id when it left an offer under another (a
-- multi-name waiter's, with the name free: \`<wakeId>|<names>\`, for \`./hand_over_all.ts\`), or nil.
-- After a semaphore's hand-off, the new head is handed its permits too when they fit and its wake
-- key was declared; \`handedNext\` is its wake id when they fit but it was not (for another step),
-- else false. Needs HOLDERS_LUA and \`holdersKey\` for a semaphore's waiter.
local handedNext = false
local function handOver(r)
  -- the head and the waiters after it (for the grant's hint), with their offers: read once
  local head, queue = queueHead(queueKey, ticketsKey, nowMs, offersKey, ${WAKE_HINTS} + 1)
  local live = not r.free and r.leaseEnd ~= nil and nowMs < r.leaseEnd
  -- readers: granted, and rung, when they fit
  if head and string.sub(head, -2) == '~s' then
    if not live or (r.shared and r.limit == 0) then return grantReaders(r) end
    return nil
  end
  if not head then return nil end
  local offers = offersOf(queue)
  local offer = parseOffer(offers[1])
  if not offer then return nil end
  local token, permits = string.match(head, '^([%w_-]+)~(%d+)$')
  if token then
    permits = tonumber(permits)
    local used = 0
    if live then
      if not r.shared or r.limit ~= offer.limit then return nil end
      local holders, inUse = readHolders(holdersKey, nowMs, true)
      -- A token that holds already is left to its own look (another hold, or a mismatch).
      if holders[token] then return nil end
      used = inUse
    end
    if used + permits > offer.limit then return nil end
  elseif live or string.find(head, '~', 1, true) then
    -- an exclusive waiter takes the name only free; a shared one is not handed it
    return nil
  elseif offer.names then
    -- a multi-name waiter: handed all its names at once, by \`./hand_over_all.ts\`
    return offer.wake .. '|' .. offer.names
  end
  -- It fits: handed over here when the caller declared its wake key, else by the caller next.
  local hinted = declared(offer.wake)
  if not hinted then return offer.wake end
  -- holders of an earlier spell
  if token and not live then redis.call('DEL', holdersKey) end
  local nextHead, first = leaveQueue(queueKey, ticketsKey, head, offersKey, queue)
  local fence = string.format('%.0f', math.max(nowUs, tonumber(r.fence) + 1))
  local leaseEnd = nowMs + offer.ttl
  local lease = {fence = fence, leaseEnd = leaseEnd, at = nowMs, hold = clamp(r.hold, 1, ${MAX_HOLD_MS}),
    flag = (nextHead and '1') or '0', released = r.released}
  if token then
    writeHolder(holdersKey, token, {leaseEnd = leaseEnd, fence = fence, permits = permits,
      holds = newHolds(offer.hold), meta = offer.meta})
    lease.limit, lease.shared = offer.limit, true
    if live then lease.leaseEnd = math.max(r.leaseEnd, leaseEnd) end
    writeShared(lockKey, lease, nowMs, graceMs)
    redis.call('PEXPIRE', holdersKey, lease.leaseEnd - nowMs)
  else
    token = head
    lease.token, lease.meta, lease.holds = head, offer.meta, newHolds(offer.hold)
    lease.released = ownRelease(r, head)
    writeHeld(lockKey, lease, nowMs, graceMs)
  end
  -- a release without a fence now means this lease
  supersede(marksKey, token)
  -- The grant, which the waiter's BLPOP pops, then a receipt that stays: the proof that this
  -- wake key (this acquire, not another with the same token) was handed the lease. A wake key
  -- is one acquire's, and each of its looks clears it: it holds at most the grants made since.
  -- Through pcall: a wake key of another type (a hand edit) costs the waiter its wake-up (it finds
  -- its lease at its next look), never the release, which went through.
  local sent = redis.pcall('RPUSH', hintKey(hinted), fence .. ':' .. ms(leaseEnd) .. ':' ..
    ms(nowMs) .. ':' .. grantHint(first, {unpack(offers, 2)}), 'r' .. fence)
  if type(sent) ~= 'table' then redis.call('PEXPIRE', hintKey(hinted), offer.ttl) end
  noteGrant(statsKey, namesKey, endsKey, nowMs, nowMs - offer.since)
  indexPut(namesKey, endsKey, name, lease.leaseEnd, nowMs)
  -- Permits may remain for the next waiter too: handed them here when its key was declared, else
  -- named for another step.
  if lease.shared and nextHead then
    local more = handOver(readRecord(lockKey))
    if more ~= 1 then handedNext = more or false end
  end
  return 1
end
`;

// The held index, kept only with stats on (its keys are then passed, else nil): the prefix's
// recent names in order (`names`, all scores 0, for listing by prefix and cursor) and their lease
// ends (`ends`; minus the release time once released), so a name is held while its end is in the
// future. A name stays a minute after its release (acquiring it again is then cheaper); names
// released longer ago or whose lease ran out leave both sets, up to 1000 at the first grant of each
// minute (by an acquire or a hand-over; `minuteDuty`) and up to 4 at each grant of a name new to
// the index, so the sets hold about the names used in the last minute (per bucket in the cluster
// layout, whose idle buckets keep theirs until a grant there). Through pcall, like the
// stats: a damaged index never stops a decision. `noteGrant` is a grant's stats and pruning.
// After STATS_LUA.
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
local function noteGrant(statsKey, namesKey, endsKey, nowMs, waitedMs)
  observe(statsKey, nowMs, 'wait', waitedMs)
  if minuteDuty(statsKey, nowMs) then indexPrune(namesKey, endsKey, nowMs, 1000) end
end
`;

// What every acquire script does alike, written with the acquire contract's names (`statsKey`,
// `namesKey`, `endsKey`, `waitedMs`, `waiting`, and `lockKey`, `queueKey`, `ticketsKey`,
// `ticketMs`, `maxWaiters`, `graceMs`, `name` where one name is acquired).
export const ACQUIRE_LUA = `
-- A new fence: max(now in µs, the last fence + 1). Strictly increasing while the record lives,
-- and past its expiry or a data loss still above every earlier fence unless the clock stepped back.
local function newFence(r)
  return string.format('%.0f', math.max(nowUs, ((r and tonumber(r.fence)) or 0) + 1))
end
-- The expected hold time, for hints: the record's moving average, or DEFAULT_HOLD_MS for a new name.
local function holdEstimate(r) return clamp((r and r.hold) or ${DEFAULT_HOLD_MS}, 1, ${MAX_HOLD_MS}) end
-- A grant's stats: the time waited (the first grant of a minute prunes the held index too).
local function noteWaited() noteGrant(statsKey, namesKey, endsKey, nowMs, waitedMs) end
local function granted(leaseEnd)
  noteWaited()
  indexPut(namesKey, endsKey, name, leaseEnd, nowMs)
end
-- A token made for this call alone (\`fresh\`) that a release marked: the call's lease was
-- released, so this is a late copy of it (a retried request's first attempt that arrived last),
-- to refuse rather than grant a lease no one holds. Its holder acquiring again is a retry, before.
local function spent(marksKey) return fresh and redis.call('ZSCORE', marksKey, token) ~= false end
-- A busy reply is the caller's outcome unless it waits; a full queue always is.
local function countBusy(position)
  if position == -2 then
    count(statsKey, nowMs, 'acquire.queue_full')
  elseif not waiting then
    count(statsKey, nowMs, 'acquire.busy')
  end
end
-- A record this code did not write: busy until its TTL (given one if it has none).
local function foreignBusy(key)
  countBusy(-1)
  return {0, ${MIN_RETRY_MS}, nowMs, -1, ttlOrSet(key, ${MAX_HOLD_MS})}
end
-- Busy: note the contention, queue \`member\` when it waits (with its offer, for an exclusive
-- waiter; \`seen\` as for joinQueue), and hint when to look again.
local function busy(r, held, holdMs, member, head, offersKey, offer, seen)
  noteContended(lockKey, r, nowMs, graceMs)
  local pttl = 0
  if held then
    pttl = r.leaseEnd - nowMs
    ttlOrSet(lockKey, pttl + graceMs)
  end
  local position, ticket = -1, nil
  if ticketMs > 0 then position, ticket = joinQueue(queueKey, ticketsKey, member, nowMs, ticketMs,
    maxWaiters, offersKey, offer, nil, seen) end
  countBusy(position)
  -- 6 to 8 are the callers'; 9 the ticket, for a leave
  return {0, retryAfter(r, held, holdMs, position, ticketsKey, head, nowMs), nowMs, position, pttl,
    0, false, false, ticket or false}
end
`;
