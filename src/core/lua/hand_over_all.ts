import { defineScript } from "./_define.ts";
import { STATS_KEYS } from "./contracts.ts";
import {
  INDEX_LUA,
  MAX_HOLD_MS,
  NAMES_HINT_LUA,
  NOW,
  OFFER_LUA,
  QUEUE_LUA,
  RECORD_LUA,
  STATS_LUA,
} from "./lib.ts";

/**
 * Hands every name of a multi-name waiter (`n` of them, in `names`, as it acquires them) to it at
 * once: the step a release takes when the head of the name it freed is such a waiter (its offer
 * names `wakeId` and these names, see `./acquire_all.ts`). It grants only when its own look would:
 * no name held by another lease, and the waiter at the head of every queue but those of names its
 * token holds already (each of those keeps its fence, and its lease end if later; one held
 * reentrant is its look's mismatch). Each other name gets a new fence and the lease the offer asked
 * for, and `<fence>,<fence>…:<leaseEndMs>:<nowMs>:<hints>` (each name's grant hint, `;`-joined)
 * then a receipt `r<first fence>` go on `wakeKey`.
 *
 * Sent after a release in one request, it names that release (`by` its token, `at` its name's
 * place in `names`; '' and 0 for none): when that lease (or, shared, any) still holds its name,
 * the release has not run yet (its source was loaded anew, so it ran second) or did not free the
 * name, and it answers 0 without a look.
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
  [NOW, RECORD_LUA, QUEUE_LUA, STATS_LUA, INDEX_LUA, OFFER_LUA, NAMES_HINT_LUA],
  `
if at > 0 then
  local r = readRecord(lockKey(at))
  if r and (r.token == by or r.shared) and nowMs < r.leaseEnd then return 0 end
end
-- The waiter: a head whose offer names this wake key and these names (the same in every queue).
local heads, token, offer = {}, nil, nil
for i = 1, n do
  heads[i] = queueHead(queueKey(i), ticketsKey(i), nowMs, offersKey(i))
  if heads[i] and not token then
    local o = parseOffer(redis.call('HGET', offersKey(i), heads[i]))
    if o and o.wake == wakeId and o.names == table.concat(names, ',') then token, offer = heads[i], o end
  end
end
if not token then return 0 end
local records, mine = {}, {}
for i = 1, n do
  local r = readRecord(lockKey(i))
  local live = r and (r.token or r.shared) and nowMs < r.leaseEnd
  mine[i] = live and r.token == token
  -- a reentrant lease of its token: its look answers the mismatch
  if mine[i] and #r.holds.ids > 0 then return 0 end
  -- it heads every queue but those of names its token holds, which it keeps
  if not mine[i] and heads[i] ~= token then return 0 end
  if r and (r.foreign or (live and not mine[i])) then return -i end
  records[i] = r or {fence = '0', hold = 1, released = ''}
end
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
      token = token, meta = offer.meta, holds = newHolds(''),
      released = ownRelease(r, token)}
    -- a release without a fence now means this lease
    supersede(marksKey(i), token)
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
