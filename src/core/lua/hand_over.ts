import { defineScript } from "./_define.ts";
import { STATS_KEYS } from "./contracts.ts";
import { HANDOFF_LUA, INDEX_LUA, NOW, QUEUE_LUA, RECORD_LUA, STATS_LUA } from "./lib.ts";

/**
 * Hands a free name to the head of its queue, blocked on `wakeKey` (`wakeId` its id): the second
 * step of a release whose caller did not know the head's wake key (`./release.ts` names it). Does
 * nothing when the name is held again, or the head is another. Returns 1 when handed over.
 */
export const HAND_OVER = defineScript(
  "hand_over",
  {
    keys: ["lockKey", "queueKey", "ticketsKey", "offersKey", "marksKey", "wakeKey", ...STATS_KEYS],
    args: { graceMs: "number", name: "string", wakeId: "string" },
  },
  [NOW, RECORD_LUA, QUEUE_LUA, INDEX_LUA, STATS_LUA, HANDOFF_LUA],
  `
local r = readRecord(lockKey) or {fence = '0', hold = 1, released = ''}
if r.foreign or (not r.free and nowMs < (r.leaseEnd or 0)) then return 0 end
if handOver(r, wakeKey, wakeId) == 1 then return 1 end
return 0
`,
);
