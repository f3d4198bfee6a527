import { defineScript } from "./_define.ts";
import { NOW, STATS_LUA } from "./lib.ts";

/**
 * Leave the queue (a waiter gave up): counts the acquire's outcome, `timeout` or `aborted` ('' to
 * count nothing). Returns 1 when its ticket was removed, else 0. A waiter that blocked (`wakeId`
 * its wake key's id) drops its offer and its wake key too, and may find that a release handed
 * it the lock (or, a semaphore's waiter `<token>~<permits>`, its permits) first (the receipt the
 * hand-off left on that wake key names the lease; a reader's, `<token>~s`, is its grant in a ring
 * of the readers' bell): then `{2, fence, ttlMs, nowMs}`, its lease (the caller's to keep or free).
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
      "readersKey?",
      "statsKey?",
    ],
    args: { member: "string", outcome: "string", wakeId: "string" },
  },
  [NOW, STATS_LUA],
  `
if outcome == 'timeout' or outcome == 'aborted' then count(statsKey, nowMs, 'acquire.' .. outcome) end
redis.call('ZREM', ticketsKey, member)
local removed = redis.call('ZREM', queueKey, member)
if wakeId == '' then return removed end
redis.call('HDEL', offersKey, member)
-- Only a hand-off to this wake key is this waiter's: its receipt names the lease's fence (another
-- acquire with the same token, or another reentrant hold, has a wake key of its own).
local receipt = redis.call('LINDEX', wakeKey, -1)
redis.call('DEL', wakeKey)
local fence, leaseEnd, token
-- a semaphore's waiter: its holder entry
local holder = string.match(member, '^([%w_-]+)~%d+$')
local reader = string.match(member, '^([%w_-]+)~s$')
if reader then
  -- A reader's receipt is its grant in a ring of the readers' bell, under its wake id.
  leaseEnd, fence = string.match(redis.call('HGET', holdersKey, reader) or '', '^(%d+)|(%d+)|')
  receipt = nil
  for _, entry in ipairs(readersKey and fence and redis.call('XRANGE', readersKey, '-', '+') or {}) do
    for i = 1, #entry[2], 2 do
      if entry[2][i] == wakeId and string.match(entry[2][i + 1], '^(%d+):') == fence then
        receipt = 'r' .. fence
      end
    end
  end
  token = fence and member
elseif holder then
  leaseEnd, fence = string.match(redis.call('HGET', holdersKey, holder) or '', '^(%d+)|(%d+)|')
  token = fence and member
else
  fence, leaseEnd, token = string.match(redis.call('GET', lockKey) or '',
    '^H(%d+)|(%d+)|%d+|%d+|[01]|([%w_-]+)|')
end
if token == member and receipt == 'r' .. (fence or '') and tonumber(leaseEnd) > nowMs then
  return {2, tonumber(fence), tonumber(leaseEnd) - nowMs, nowMs}
end
return removed
`,
);
