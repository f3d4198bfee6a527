import { defineScript } from "./_define.ts";
import { STATS_KEYS } from "./contracts.ts";
import {
  HANDOFF_LUA,
  HOLDERS_LUA,
  INDEX_LUA,
  NOW,
  OFFER_LUA,
  QUEUE_LUA,
  RECORD_LUA,
  STATS_LUA,
} from "./lib.ts";

/**
 * Hands a name to the head of its queue, blocked on the wake key `hintKey` (`hints` its id), when
 * it fits (see `HANDOFF_LUA`): the second step of a release whose caller did not know the head's
 * wake key (`./release.ts` names it). Does nothing when the name is held exclusively again, the
 * head does not fit, or the head is another. Returns `{handed, next}`: handed 1 when handed over,
 * else 0; next the wake id of a head to try in another step (nil for none): the head, when it
 * blocks on another key, or after a semaphore's hand-off the next head whose permits fit too.
 */
export const HAND_OVER = defineScript(
  "hand_over",
  {
    keys: [
      "lockKey",
      "queueKey",
      "ticketsKey",
      "offersKey",
      "marksKey",
      "holdersKey",
      "readersKey?",
      ...STATS_KEYS,
    ],
    // the head's wake key, when known (n 1, hints its id), else none (n 0)
    each: ["hintKey"],
    args: { graceMs: "number", name: "string", n: "number" },
    rest: "hints",
  },
  [NOW, RECORD_LUA, HOLDERS_LUA, QUEUE_LUA, STATS_LUA, INDEX_LUA, OFFER_LUA, HANDOFF_LUA],
  `
local r = readRecord(lockKey) or {fence = '0', hold = 1, released = ''}
-- held exclusively
if r.foreign or (r.token and nowMs < r.leaseEnd) then return {0} end
local handed = handOver(r)
if handed == 1 then return {1, handedNext} end
return {0, handed or false}
`,
);
