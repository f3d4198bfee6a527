import { defineScript } from "./_define.ts";
import { STATS_KEYS } from "./contracts.ts";
import {
  INDEX_LUA,
  MAX_HOLD_MS,
  MAX_QUEUE,
  NOW,
  OFFER_LUA,
  QUEUE_LUA,
  RECORD_LUA,
  STATS_LUA,
} from "./lib.ts";

/**
 * Hands every name of a multi-name waiter (`n` of them, in `names`, as it acquires them) to it at
 * once: the step a release takes when the head of the name it freed is such a waiter (its offer
 * names `wakeId` and these names, see `./acquire_all.ts`). It grants only when the waiter heads
 * every queue with that offer and no name is held by another, as its own look would: each name
 * gets a new fence and the lease its offer asked for (a name the waiter's token holds already
 * keeps its fence, and its lease end if later), and `<fence>,<fence>…:<leaseEndMs>:<nowMs>:<hints>`
 * (each name's grant hint, `;`-joined) then a receipt `r<first fence>` go on `wakeKey`.
 *
 * Sent after a release in one request, it names that release (`by` its token, `at` its name's
 * place in `names`; '' and 0 for none): when that lease still holds its name, the release has not
 * run yet (its source was loaded anew, so it ran second), and it answers 0 without a look.
 * Returns 1 when handed over, `-i` when the i-th name is held by another (whose release hands
 * over), else 0 (the caller's second step, or the waiter's next look, decides).
 */
export const HAND_OVER_ALL = defineScript(
  "hand_over_all",
  {
    each: ["lockKey", "queueKey", "ticketsKey", "offersKey", "marksKey"],
    keys: ["wakeKey", ...STATS_KEYS],
    args: { graceMs: "number", n: "number", wakeId: "string", by: "string", at: "number" },
    rest: "names",
  },
  [NOW, RECORD_LUA, QUEUE_LUA, STATS_LUA, INDEX_LUA, OFFER_LUA],
  `
-- Name i's grant hint (\`grantHint\`): its first waiters, \`first\`, with their offers.
local function hintOf(i, first)
  if not first or #first == 0 then return '' end
  return grantHint(first, redis.call('HMGET', offersKey(i), unpack(first)))
end
if at > 0 then
  local r = readRecord(lockKey(at))
  if r and r.token == by and nowMs < r.leaseEnd then return 0 end
end
local records, mine, token = {}, {}, nil
for i = 1, n do
  local head = queueHead(queueKey(i), ticketsKey(i), nowMs, ${MAX_QUEUE}, offersKey(i))
  if not head or head ~= (token or head) then return 0 end
  token = head
  local r = readRecord(lockKey(i))
  mine[i] = r and r.token == token and nowMs < r.leaseEnd
  if r and not mine[i] and (r.foreign or ((r.token or r.shared) and nowMs < r.leaseEnd)) then
    return -i
  end
  records[i] = r or {fence = '0', hold = 1, released = ''}
end
local offer = parseOffer(redis.call('HGET', offersKey(1), token))
if not offer or offer.wake ~= wakeId or offer.names ~= table.concat(names, ',') then return 0 end
local leaseEnd, fences, hints = nowMs + offer.ttl, {}, {}
for i = 1, n do
  local r = records[i]
  local nextHead, first = leaveQueue(queueKey(i), ticketsKey(i), token, offersKey(i))
  hints[i] = hintOf(i, first)
  if mine[i] then
    -- never before the end it was told
    r.leaseEnd = math.max(r.leaseEnd, leaseEnd)
    if offer.meta ~= '' then r.meta = offer.meta end
    if nextHead then r.flag = '1' end
  else
    r = {fence = string.format('%.0f', math.max(nowUs, tonumber(r.fence) + 1)), leaseEnd = leaseEnd,
      at = nowMs, hold = clamp(r.hold or 1, 1, ${MAX_HOLD_MS}), flag = (nextHead and '1') or '0',
      token = token, meta = offer.meta, holds = newHolds(''), released = r.released or ''}
    -- a release without a fence now means this lease
    redis.call('ZREM', marksKey(i), token)
  end
  fences[i] = r.fence
  writeHeld(lockKey(i), r, nowMs, graceMs)
  indexPut(namesKey, endsKey, names[i], r.leaseEnd, nowMs)
end
-- Through pcall, as the single name's hand-off: a wake key of another type costs the waiter its
-- wake-up (it finds its leases at its next look), never the grant.
local sent = redis.pcall('RPUSH', wakeKey, table.concat(fences, ',') .. ':' .. ms(leaseEnd) .. ':' ..
  ms(nowMs) .. ':' .. table.concat(hints, ';'), 'r' .. fences[1])
if type(sent) ~= 'table' then redis.call('PEXPIRE', wakeKey, offer.ttl) end
noteGrant(statsKey, namesKey, endsKey, nowMs, nowMs - offer.since)
return 1
`,
);
