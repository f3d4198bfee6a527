import { defineScript } from "./_define.ts";
import { NOW } from "./lib.ts";

/**
 * List held names from the index, in order: those from `prefix` after `cursor`, at most
 * `limit`, looking at no more than `limit` × 4 + 16 entries (names whose lease ran out are
 * skipped). Returns `{nowMs, nextCursor, name...}`, nextCursor '' at the end, each name behind
 * '=' (an Upstash client would parse a name such as `{}` or `1.50` as JSON). Read-only; the
 * caller inspects the names, so a release in between never shows as held.
 */
export const LIST = defineScript(
  "list",
  {
    keys: ["namesKey", "endsKey"],
    args: { prefix: "string", cursor: "string", limit: "number" },
  },
  [NOW],
  `
local low = '[' .. prefix
if cursor ~= '' and cursor >= prefix then low = '(' .. cursor end
local high = '+'
if prefix ~= '' then high = '[' .. prefix .. '\\255' end
local names = redis.pcall('ZRANGEBYLEX', namesKey, low, high, 'LIMIT', 0, limit * 4 + 16)
-- a damaged index lists nothing
if names.err then names = {} end
local found = {nowMs, ''}
for i, name in ipairs(names) do
  if #found - 2 == limit then
    found[2] = '=' .. names[i - 1]
    return found
  end
  -- nil when damaged
  local leaseEnd = tonumber(redis.pcall('ZSCORE', endsKey, name))
  if leaseEnd and leaseEnd > nowMs then found[#found + 1] = '=' .. name end
end
if #names == limit * 4 + 16 then found[2] = '=' .. names[#names] end
return found
`,
  { readOnly: true },
);
