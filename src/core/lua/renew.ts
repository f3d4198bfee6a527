import { defineScript } from "./_define.ts";
import { STATS_KEYS } from "./contracts.ts";
import { HOLDERS_LUA, INDEX_LUA, NOW, RECORD_LUA, STATS_LUA } from "./lib.ts";

/**
 * Renew, any kind of lease. Returns `{1, fence, ttlMs, nowMs, holdCount, limit, permits,
 * reentrant}` (`limit` -1 for an exclusive lease, 0 a shared one, else a semaphore's, with this
 * lease's `permits`; `reentrant` 1 when it counts holds: any with an id, or more than one), or
 * `{0, nowMs}` when the token no longer holds it, or (given the lease's fence) holds another lease
 * since, or the hold the caller names (a reentrant hold's id, or with the fence and no id its plain
 * hold) was released.
 */
export const RENEW = defineScript(
  "renew",
  {
    keys: ["lockKey", "holdersKey", ...STATS_KEYS],
    args: {
      token: "string",
      ttlMs: "number",
      graceMs: "number",
      name: "string",
      fence: "string", // the lease's fence, or '' when the caller does not know it
      hold: "string", // a reentrant lease's hold, or ''
    },
  },
  [NOW, RECORD_LUA, HOLDERS_LUA, STATS_LUA, INDEX_LUA],
  `
local r = readRecord(lockKey)
local h = r
if r and r.shared and nowMs < r.leaseEnd then
  h = readHolder(redis.call('HGET', holdersKey, token))
  if h then h.token = token end
end
-- With a hold, only while it is held; with the fence and no hold, not once the plain hold was
-- released (reentrant holds of the token left: that reference's hold is gone).
if not r or not h or h.token ~= token or nowMs >= h.leaseEnd or (fence ~= '' and h.fence ~= fence) or
  (hold ~= '' and not findHold(h.holds, hold)) or
  (hold == '' and fence ~= '' and h.holds.anon == 0 and h.holds.plainGone) then
  count(statsKey, nowMs, 'renew.lost')
  return {0, nowMs}
end
-- A renewal never shortens a lease: another hold of it may have been told the later end.
h.leaseEnd = math.max(h.leaseEnd, nowMs + ttlMs)
if r.shared then
  writeHolder(holdersKey, token, h)
  -- the latest holder's
  r.leaseEnd = math.max(r.leaseEnd, h.leaseEnd)
  writeShared(lockKey, r, nowMs, graceMs)
  redis.call('PEXPIRE', holdersKey, r.leaseEnd - nowMs)
else
  writeHeld(lockKey, r, nowMs, graceMs)
end
indexPut(namesKey, endsKey, name, r.leaseEnd, nowMs)
count(statsKey, nowMs, 'renew.renewed')
return {1, tonumber(h.fence), h.leaseEnd - nowMs, nowMs, holdCount(h.holds),
  (r.shared and r.limit) or -1, h.permits or 1, ((#h.holds.ids > 0 or h.holds.anon > 1) and 1) or 0}
`,
);
