import { defineScript } from "./_define.ts";
import { NOW, STATS_LUA } from "./lib.ts";

/**
 * Leave the queue (a waiter gave up): counts the acquire's outcome, `timeout` or `aborted` ('' to
 * count nothing). Returns 1 when its ticket was removed.
 */
export const LEAVE_QUEUE = defineScript(
  "leave_queue",
  {
    keys: ["queueKey", "ticketsKey", "statsKey?"],
    args: { member: "string", outcome: "string" },
  },
  [NOW, STATS_LUA],
  `
if outcome == 'timeout' or outcome == 'aborted' then count(statsKey, nowMs, 'acquire.' .. outcome) end
redis.call('ZREM', ticketsKey, member)
return redis.call('ZREM', queueKey, member)
`,
);
