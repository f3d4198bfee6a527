import { defineScript } from "./_define.ts";
import { NOW } from "./lib.ts";

/** The held count and the stats hash: `{nowMs, held, field, value, ...}`. Read-only. */
export const READ_STATS = defineScript(
  "read_stats",
  { keys: ["statsKey", "endsKey"], args: {} },
  [NOW],
  `
-- A damaged key (a hand edit, another type) reads as empty, as the scripts that count skip it.
local held = redis.pcall('ZCOUNT', endsKey, '(' .. nowMs, '+inf')
if type(held) ~= 'number' then held = 0 end
local reply = {nowMs, held}
local fields = redis.pcall('HGETALL', statsKey)
if fields.err then fields = {} end
for _, v in ipairs(fields) do reply[#reply + 1] = v end
return reply
`,
  { readOnly: true },
);
