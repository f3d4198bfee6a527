import { defineScript } from "./_define.ts";
import { NOW, STATS_LUA } from "./lib.ts";

/**
 * Leave the queue (a waiter gave up): counts the acquire's outcome, `timeout` or `aborted` ('' to
 * count nothing). Returns 1 when its place was left, else 0. Two calls with one token (a request
 * and its retry) share a place: a call leaves it only when the ticket is the one its last look
 * took (`ticketEnd`, as its reply told it; '' when unknown), else another call looked since and
 * keeps it, with its offer. A place left is kept for its token until its ticket ends, for another
 * call to take back (see `joinQueue`); no one waits behind it, and no leave (a copy of this one)
 * ends it. A waiter that blocked (`wakeId` its wake key's id) drops its offer and its wake key too,
 * and may find that a release handed it the lock (or, a semaphore's waiter `<token>~<permits>`,
 * its permits) first (the receipt the hand-off left on that wake key names the lease; a reader's,
 * `<token>~s`, is a lease of its token granted since its last look that counts the call's hold):
 * then `{2, fence, ttlMs, nowMs}`, its lease (the caller's to keep or free).
 */
export const LEAVE_QUEUE = defineScript(
  "leave_queue",
  {
    keys: [
      "queueKey",
      "ticketsKey",
      "offersKey",
      "lockKey",
      "wakeKey",
      "holdersKey",
      "statsKey?",
    ],
    args: {
      member: "string",
      outcome: "string",
      wakeId: "string",
      ticketEnd: "string", // the end of the ticket the waiter's last look took ('': none)
      seenFence: "number", // a reader's: the name's last fence at its last look (0: none)
      hold: "string", // a reader's reentrant hold id, or ''
    },
  },
  [NOW, STATS_LUA],
  `
if outcome == 'timeout' or outcome == 'aborted' then count(statsKey, nowMs, 'acquire.' .. outcome) end
local ticket = tonumber(redis.call('ZSCORE', ticketsKey, member)) or 0
local mine = tonumber(ticketEnd) or 0
local removed, offer = 0, nil
if ticket < -nowMs then
  -- a place left: kept to its end, whoever leaves again
elseif ticket > nowMs and mine > 0 and ticket ~= mine then
  offer = redis.call('HGET', offersKey, member)
else
  local place = redis.call('ZSCORE', queueKey, member)
  removed = redis.call('ZREM', queueKey, member)
  if place and ticket > nowMs then
    redis.call('ZADD', ticketsKey, string.format('%.0f', -ticket), member)
    redis.call('HSET', offersKey, member, 'l' .. place .. string.format('|%.0f', ticket))
    ttlOrSet(offersKey, math.ceil(ticket - nowMs))
  else
    redis.call('ZREM', ticketsKey, member)
    -- a multi-name waiter's offer is in every queue, its wake key beside its first name's only
    redis.call('HDEL', offersKey, member)
  end
end
if wakeId == '' then return removed end
local fence, leaseEnd, token, receipt
-- a semaphore's waiter: its holder entry
local holder = string.match(member, '^([%w_-]+)~%d+$')
local reader = string.match(member, '^([%w_-]+)~s$')
-- Only a hand-off to this wake key is this waiter's: its receipt names the lease's fence (another
-- acquire with the same token, or another reentrant hold, has a wake key of its own). A reader's
-- wake key is a stream: the grant a release put there. Through pcall: a hand edit's key of another
-- type holds no receipt.
local sent
if reader then sent = redis.pcall('XREVRANGE', wakeKey, '+', '-', 'COUNT', 1)
else receipt = redis.pcall('LINDEX', wakeKey, -1) end
-- the other call's, when its look kept this one's
if not (offer and string.match(offer, '^m?%d+|%d+|([%w_-]+)|') == wakeId) then
  redis.call('DEL', wakeKey)
end
if reader then
  -- A reader is granted on its wake key, or in a ring of the bell, which keeps only its last
  -- rings: its receipt is a live lease of its token granted there, or since its last look (a fence
  -- above \`seenFence\`: fences only grow, whatever the clock does), that counts this call's hold
  -- (another reentrant hold's look may have left the offer the ring granted). Another call with
  -- the token and no hold id shares a plain hold anyway (a reader's acquire again is a retry).
  local holds
  leaseEnd, fence, holds = string.match(redis.call('HGET', holdersKey, reader) or '',
    '^(%d+)|(%d+)|%d+|(%d[%w_,%-]*)|')
  local grant = type(sent) == 'table' and not sent.err and sent[1] and sent[1][2]
  local granted = grant and grant[1] == 'grant' and string.match(grant[2] or '', '^(%d+):')
  local counted = holds and ((hold == '' and tonumber(string.match(holds, '^%d+')) > 0) or
    (hold ~= '' and string.find(holds .. ',', ',' .. hold .. ',', 1, true) ~= nil))
  if counted and (tonumber(fence) > seenFence or granted == fence) then
    receipt = 'r' .. fence
  end
  token = fence and member
elseif holder then
  leaseEnd, fence = string.match(redis.call('HGET', holdersKey, holder) or '', '^(%d+)|(%d+)|')
  token = fence and member
else
  -- an exclusive lease: its end counts from the fence's millisecond (\`X\`), or the epoch (\`H\`)
  local kind, ends
  kind, fence, ends, token = string.match(redis.call('GET', lockKey) or '',
    '^([XH])(%d+)|(%-?%d+)|%-?%d+|%d+|[01]|([%w_-]+)|')
  leaseEnd = fence and ((kind == 'X' and math.floor(tonumber(fence) / 1000)) or 0) + tonumber(ends)
end
if token == member and receipt == 'r' .. (fence or '') and tonumber(leaseEnd) > nowMs then
  return {2, tonumber(fence), tonumber(leaseEnd) - nowMs, nowMs}
end
return removed
`,
);
