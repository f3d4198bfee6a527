import { defineScript } from "./_define.ts";
import { ACQUIRE_ARGS, STATS_KEYS, WAIT_ARGS } from "./contracts.ts";
import {
  ACQUIRE_LUA,
  INDEX_LUA,
  MAX_HOLD_MS,
  NOW,
  OFFER_LUA,
  QUEUE_LUA,
  RECORD_LUA,
  SEEN_WAITERS,
  STATS_LUA,
} from "./lib.ts";
import { DEFAULT_HOLD_MS } from "../_validate.ts";

// The common case, before the other pieces' functions are made (Redis makes every function of
// a script anew at each call, so a return before them skips that cost): a name that is free
// and that no one waits for (no record, queue or place left, or released with no contention noted),
// taken by a plain acquire or a first reentrant hold. The grant is the one the body below makes
// for that case; the model test holds both to the same rules.
const FAST = `
local fast, hold0, released0
local raw = redis.call('GET', lockKey)
if not raw then
  if redis.call('EXISTS', queueKey, ticketsKey) == 0 then
    fast, hold0, released0 = 0, ${DEFAULT_HOLD_MS}, ''
  end
else
  local f, h, sha = string.match(raw, '^R(%d+)|(%d+)|0|(%x+)$')
  if f then
    fast, hold0, released0 = tonumber(f), math.min(math.max(tonumber(h), 1), ${MAX_HOLD_MS}), ''
    if sha == string.sub(redis.sha1hex(token), 1, #sha) then released0 = f .. ':' .. sha end
  end
end
if fast then
  local mark = tonumber(redis.call('ZSCORE', marksKey, token))
  -- a late copy of a call whose lease was released already (see \`spent\`)
  if mark and fresh then return {-1, 6, nowMs} end
  local fenceUs = math.max(nowUs, fast + 1)
  local fence, base = string.format('%.0f', fenceUs), math.floor(fenceUs / 1000)
  local leaseEnd = nowMs + ttlMs
  local holds = '1'
  if hold ~= '' then holds = '0,' .. hold end
  redis.call('SET', lockKey, 'X' .. fence .. '|' .. string.format('%.0f|%.0f|%d', leaseEnd - base, nowMs - base, hold0) ..
    '|0|' .. token .. '|' .. released0 .. '|' .. holds .. '|' .. meta, 'PX', ttlMs + graceMs)
  -- supersede, inline
  if mark then
    redis.call('ZADD', marksKey, mark, token .. '@' .. string.format('%.0f', mark))
    redis.call('ZREM', marksKey, token)
  end
  noteGrant(statsKey, namesKey, endsKey, nowMs, waitedMs)
  indexPut(namesKey, endsKey, name, leaseEnd, nowMs)
  return {1, tonumber(fence), ttlMs, nowMs, 1}
end
`;

/**
 * Acquire exclusively, with a fair, bounded queue of waiters. Returns `{1, fence, ttlMs, nowMs,
 * holdCount, next}` when acquired (`next` the wake id of the waiter at the head of the queue, for
 * the release's hand-off; nil for none) (or re-acquired by the same token, keeping its fence; counted when
 * `hold` names a reentrant hold), `{0, retryAfterMs, nowMs, position, pttl}` when busy: position
 * 0 is the head of the queue, -1 not queued, -2 the queue was full; pttl is the holders' lease
 * left, ms (0 when free but kept for the head of the queue); `{-1, code}` on a mismatch (see
 * `./replies.ts`).
 *
 * Waiters (`ticketMs` > 0) take a FIFO ticket; a free lock goes to the head of the queue only,
 * and everyone else (waiting or not) is busy until it takes it or its ticket lapses. A ticket
 * lives `ticketMs` (at most MAX_TICKET_MS) from each call, so a waiter that gave up or crashed
 * blocks nobody for longer; each call that looks at the queue drops every lapsed ticket (at most
 * MAX_QUEUE, the most any queue holds), wherever it is. Shared holders (kind S) hold it until the
 * latest of their lease ends.
 *
 * A waiter with a `wakeId` blocks on its `wakeKey` between looks, and leaves an offer with its
 * ticket, so a release can hand it the lock in place (`HANDOFF_LUA`). Each look clears that key:
 * a grant it has not popped is either its lease, granted here again, or no longer live.
 */
export const ACQUIRE = defineScript(
  "acquire",
  {
    keys: [
      "lockKey",
      "queueKey",
      "ticketsKey",
      "marksKey",
      "offersKey",
      "wakeKey",
      ...STATS_KEYS,
    ],
    args: {
      ...ACQUIRE_ARGS,
      name: "string",
      ...WAIT_ARGS,
      hold: "string",
      wakeId: "string", // the caller's wake key's id when it blocks between looks, else ''
    },
  },
  [NOW, STATS_LUA, INDEX_LUA, FAST, RECORD_LUA, QUEUE_LUA, ACQUIRE_LUA, OFFER_LUA],
  `
-- read by the fast path above
local r = readRecord(lockKey, raw)
if r and r.foreign then return foreignBusy(lockKey) end
local held = r and (r.token or r.shared) and nowMs < r.leaseEnd
if held and r.shared and r.limit > 0 then return {-1, 1, nowMs} end
if held and r.token == token then
  -- a plain acquire of a reentrant lease
  if hold == '' and #r.holds.ids > 0 then return {-1, 5, nowMs} end
  if not addHold(r.holds, hold) then return {-1, 3, nowMs} end
  -- No hold ends the lease before the end another hold was told.
  r.leaseEnd = math.max(r.leaseEnd, nowMs + ttlMs)
  if meta ~= '' then r.meta = meta end
  writeHeld(lockKey, r, nowMs, graceMs)
  granted(r.leaseEnd)
  -- a hand-off it learns of here
  if wakeId ~= '' then redis.call('DEL', wakeKey) end
  local first = r.flag == '1' and firstWaiters() or nil
  return {1, tonumber(r.fence), r.leaseEnd - nowMs, nowMs, holdCount(r.holds), orNone(grantHint(first))}
end
if spent(marksKey) then return {-1, 6, nowMs} end
-- No record (a first acquire, or one that was lost): look at the queue too.
local head, queue, seen
if not r or r.flag == '1' then
  head, queue, seen = queueHead(queueKey, ticketsKey, nowMs, offersKey, ${SEEN_WAITERS}, true)
end
local holdMs = holdEstimate(r)
if not held and (not head or head == token) then
  local nextHead, first
  if head then nextHead, first = leaveQueue(queueKey, ticketsKey, token, offersKey, queue)
  elseif queue then endPlaces(ticketsKey, offersKey) end
  local flag = (nextHead and '1') or '0'
  local grant = {fence = newFence(r), leaseEnd = nowMs + ttlMs, at = nowMs, hold = holdMs,
    flag = flag, token = token, meta = meta, holds = newHolds(hold),
    released = ownRelease(r, token)}
  writeHeld(lockKey, grant, nowMs, graceMs)
  -- a release without a fence now means this lease
  supersede(marksKey, token)
  granted(grant.leaseEnd)
  return {1, tonumber(grant.fence), ttlMs, nowMs, 1, orNone(grantHint(first))}
end
local offer, wake
if wakeId ~= '' then
  wake = wakeFor(r, held, head, token)
  offer = blockingOffer(0, wake)
end
local reply = busy(r, held, holdMs, token, head, offersKey, offer, seen)
if wake then reply[6], reply[7], reply[8] = 0, false, wake ~= wakeId and wake end
return reply
`,
);
