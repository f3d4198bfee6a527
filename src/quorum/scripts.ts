/**
 * The scripts of a quorum lock, one copy on each independent database. A database keeps, per
 * name, one string `<floor>|<token>|<leaseEndMs>`: the highest fence committed here, and the
 * token holding the name here until `leaseEndMs` on this database's clock (empty when free). The
 * string outlives the lease by `graceMs`, so the floor stays.
 *
 * @module
 */
import { plainScript } from "../core/lua/_define.ts";
import { NOW } from "../core/lua/now.ts";

const RECORD = `
local function read(key)
  local floor, token, leaseEnd = string.match(redis.call('GET', key) or '', '^(%d+)|([%w_-]*)|(%d+)$')
  return {floor = tonumber(floor) or 0, token = token or '', leaseEnd = tonumber(leaseEnd) or 0}
end
local function write(key, r, nowMs, graceMs)
  redis.call('SET', key, string.format('%.0f', r.floor) .. '|' .. r.token .. '|' ..
    string.format('%.0f', r.leaseEnd), 'PX', math.max(1, r.leaseEnd - nowMs) + graceMs)
end
`;

/**
 * Takes the name here for `ttlMs` unless another token holds it. Returns `{1, floor, nowUs}`
 * (this database's committed floor and clock) or `{0, pttl}`.
 */
export const Q_ACQUIRE = plainScript(
  "quorum_acquire",
  `
local token, ttlMs, graceMs = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
${NOW}${RECORD}
local r = read(KEYS[1])
if r.token ~= '' and r.token ~= token and nowMs < r.leaseEnd then return {0, r.leaseEnd - nowMs} end
r.token, r.leaseEnd = token, nowMs + ttlMs
write(KEYS[1], r, nowMs, graceMs)
return {1, r.floor, nowUs}
`,
);

/** Raises the floor to `fence` while `token` holds the name here. Returns 1, or 0 when it does not. */
export const Q_COMMIT = plainScript(
  "quorum_commit",
  `
local token, fence, graceMs = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
${NOW}${RECORD}
local r = read(KEYS[1])
if r.token ~= token or nowMs >= r.leaseEnd then return 0 end
r.floor = math.max(r.floor, fence)
write(KEYS[1], r, nowMs, graceMs)
return 1
`,
);

/** Extends `token`'s hold here to `ttlMs` from now. Returns 1, or 0 when it does not hold it. */
export const Q_RENEW = plainScript(
  "quorum_renew",
  `
local token, ttlMs, graceMs = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
${NOW}${RECORD}
local r = read(KEYS[1])
if r.token ~= token or nowMs >= r.leaseEnd then return 0 end
r.leaseEnd = nowMs + ttlMs
write(KEYS[1], r, nowMs, graceMs)
return 1
`,
);

/** Frees `token`'s hold here, keeping the floor. Returns 1 when it held it, else 0. */
export const Q_RELEASE = plainScript(
  "quorum_release",
  `
local token, graceMs = ARGV[1], tonumber(ARGV[2])
${NOW}${RECORD}
local r = read(KEYS[1])
if r.token ~= token or nowMs >= r.leaseEnd then return 0 end
r.token, r.leaseEnd = '', nowMs
write(KEYS[1], r, nowMs, graceMs)
return 1
`,
);

/** This database's view: `{1, floor, pttl}` while held, `{0, floor}` when free. Read-only. */
export const Q_INSPECT = plainScript(
  "quorum_inspect",
  `
${NOW}${RECORD}
local r = read(KEYS[1])
if r.token ~= '' and nowMs < r.leaseEnd then return {1, r.floor, r.leaseEnd - nowMs} end
return {0, r.floor}
`,
);
