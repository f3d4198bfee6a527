import { defineScript } from "./_define.ts";
import { HOLDERS_LUA, NOW, RECORD_LUA } from "./lib.ts";

/**
 * Inspect. Returns `{1, fence, pttl, nowMs, waiters, meta, mode, holders, permits, limit}` when
 * held (meta nil for none), else `{0, nowMs}`; never a token. `fence` is the latest lease's, `pttl` the latest
 * lease end's; `mode` is exclusive, shared or semaphore; `permits` the permits held (the hold
 * count when exclusive). `waiters` counts the tickets not lapsed. Read-only.
 */
export const INSPECT = defineScript(
  "inspect",
  { keys: ["lockKey", "ticketsKey", "holdersKey"], args: {} },
  [NOW, RECORD_LUA, HOLDERS_LUA],
  `
local r = readRecord(lockKey)
if not r or not (r.token or r.shared) or nowMs >= r.leaseEnd then
  return {0, nowMs}
end
local waiters = redis.call('ZCOUNT', ticketsKey, '(' .. nowMs, '+inf')
local reply = {1, tonumber(r.fence), r.leaseEnd - nowMs, nowMs, waiters}
if not r.shared then
  for _, v in ipairs({r.meta ~= '' and r.meta or false, 'exclusive', 1, holdCount(r.holds), 1}) do reply[#reply + 1] = v end
  return reply
end
local holders, used = readHolders(holdersKey, nowMs, false)
local n = 0
for _ in pairs(holders) do n = n + 1 end
local mode = 'shared'
if r.limit > 0 then mode = 'semaphore' end
for _, v in ipairs({false, mode, n, used, r.limit}) do reply[#reply + 1] = v end
return reply
`,
);
