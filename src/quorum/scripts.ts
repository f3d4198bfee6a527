/**
 * The scripts of a quorum lock, one copy on each independent database. A database keeps, per
 * name, one string `<floor>|<token>|<leaseEndMs>`: the highest fence committed here, and the
 * token holding the name here until `leaseEndMs` on this database's clock (empty when free). The
 * string outlives the lease by `graceMs`, so the floor stays. A floor is only committed while its
 * token holds the name here, so one above a lease's fence says the token holds it for a later
 * lease: a release or renew given that fence (a late retry) then acts on nothing (`heldAt`).
 *
 * @module
 */
import { defineScript } from "../core/lua/_define.ts";
import { NOW } from "../core/lua/now.ts";

const RECORD = `
local function read(key)
  local floor, token, leaseEnd = string.match(redis.call('GET', key) or '', '^(%d+)|([%w_-]*)|(%d+)$')
  return {floor = tonumber(floor) or 0, token = token or '', leaseEnd = tonumber(leaseEnd) or 0}
end
-- Whether token holds the name here now.
local function heldBy(r, token) return r.token == token and nowMs < r.leaseEnd end
-- ...for the lease of \`fence\` (0: any): a floor above it is a later lease's commit
local function heldAt(r, token, fence)
  return heldBy(r, token) and (fence <= 0 or fence >= r.floor)
end
-- ...by an attempt's hold: ending at, the floor as its acquire saw
local function ownHold(r, token, at, seen)
  return heldBy(r, token) and r.leaseEnd == at and r.floor == seen
end
local function write(key, r, nowMs, graceMs)
  redis.call('SET', key, string.format('%.0f', r.floor) .. '|' .. r.token .. '|' ..
    string.format('%.0f', r.leaseEnd), 'PX', math.max(1, r.leaseEnd - nowMs) + graceMs)
end
`;

/**
 * Takes the name here for `ttlMs` unless another token holds it. Returns `{1, floor, nowUs,
 * leaseEnd, extended}` (this database's committed floor and clock, the hold's end, which names
 * this hold: each acquire's differs from the token's hold before it, and when it extended a live
 * hold of the token, that hold's end, else 0: an earlier lease's hold perhaps, which a failed
 * attempt then leaves alone, or one the same call made) or `{0, pttl}`.
 */
export const Q_ACQUIRE = defineScript(
  "quorum_acquire",
  { keys: ["key"], args: { token: "string", ttlMs: "number", graceMs: "number" } },
  [NOW, RECORD],
  `
local r = read(key)
if r.token ~= '' and r.token ~= token and nowMs < r.leaseEnd then return {0, r.leaseEnd - nowMs} end
-- The token's hold here never ends sooner (a late acquire of an earlier attempt after a longer
-- renew), and each acquire's end differs from the hold's before it.
local leaseEnd, extended = nowMs + ttlMs, 0
if heldBy(r, token) then leaseEnd, extended = math.max(leaseEnd, r.leaseEnd + 1), r.leaseEnd end
r.token, r.leaseEnd = token, leaseEnd
write(key, r, nowMs, graceMs)
return {1, r.floor, nowUs, leaseEnd, extended}
`,
);

/**
 * Raises the floor to `fence` while `token` holds the name here by the hold its acquire made: the
 * hold that ends `at`, under the floor `seen` it answered. A commit that arrives after another
 * attempt took the name again does nothing, even when the two holds end in the same millisecond
 * and the two attempts chose the same fence: of two commits that saw one floor, only the first
 * lands, and each moves the floor. A duplicate of a commit that landed answers 0 (that attempt
 * then fails, and its hold stays to the TTL). Returns 1, or 0 when it does not.
 */
export const Q_COMMIT = defineScript(
  "quorum_commit",
  {
    keys: ["key"],
    args: { token: "string", fence: "number", graceMs: "number", at: "number", seen: "number" },
  },
  [NOW, RECORD],
  `
local r = read(key)
if not ownHold(r, token, at, seen) then return 0 end
r.floor = math.max(r.floor, fence)
write(key, r, nowMs, graceMs)
return 1
`,
);

/**
 * Extends `token`'s hold here to `ttlMs` from now, and past its end by 1 ms at least, and raises
 * the floor to the lease's fence. A renewal may count a hold that an acquire made where its commit
 * never went: that attempt's clean-up or commit, named by the old end and floor, then leaves it
 * alone (helper-57), and so does an earlier lease's late release or renew (helper-58). Returns 1,
 * or 0 when it does not hold it or holds it for a later lease (see `heldAt`).
 */
export const Q_RENEW = defineScript(
  "quorum_renew",
  {
    keys: ["key"],
    args: { token: "string", ttlMs: "number", graceMs: "number", fence: "number" },
  },
  [NOW, RECORD],
  `
local r = read(key)
if not heldAt(r, token, fence) then return 0 end
r.leaseEnd, r.floor = math.max(r.leaseEnd + 1, nowMs + ttlMs), math.max(r.floor, fence)
write(key, r, nowMs, graceMs)
return 1
`,
);

/**
 * Frees `token`'s hold here, keeping the floor. Returns 1 when it held it for the lease of
 * `fence` (see `heldAt`) or, with `at` (a failed attempt's clean-up), by the hold that attempt's
 * acquire made (see Q_COMMIT), else 0.
 */
export const Q_RELEASE = defineScript(
  "quorum_release",
  {
    keys: ["key"],
    args: { token: "string", graceMs: "number", fence: "number", at: "number", seen: "number" },
  },
  [NOW, RECORD],
  `
local r = read(key)
if at > 0 then
  if not ownHold(r, token, at, seen) then return 0 end
elseif not heldAt(r, token, fence) then return 0 end
r.token, r.leaseEnd = '', nowMs
write(key, r, nowMs, graceMs)
return 1
`,
);

/** This database's view: `{1, floor, pttl}` while held, `{0, floor}` when free. Read-only. */
export const Q_INSPECT = defineScript(
  "quorum_inspect",
  { keys: ["key"], args: {} },
  [NOW, RECORD],
  `
local r = read(key)
if r.token ~= '' and nowMs < r.leaseEnd then return {1, r.floor, r.leaseEnd - nowMs} end
return {0, r.floor}
`,
);
