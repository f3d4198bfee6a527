/**
 * Stats kept by the scripts themselves, per key prefix (per tenant in the service), in the same
 * atomic call that makes each decision: no extra request, and every isolate's calls count in one
 * place. One Redis hash per prefix (per bucket in the cluster layout, see `./_keys.ts`) holds
 *
 * - `<slot>:<field>`: the counts per minute, in a ring of 60 slots (`slot` = minute mod 60,
 *   `<slot>:m` the minute it holds), for the last hour;
 * - `t:<field>`: the counts of the minutes before those the slots hold, added there when a slot
 *   turns over to a new minute (then cleared); the totals since the hash was created (Prometheus
 *   counters) are these plus every slot's. `t:wait.sum` and `t:hold.sum`, in milliseconds, are
 *   totals of their own;
 * - `v`: 2, the format (a hash of an earlier build, whose totals also counted what its slots
 *   hold, loses its slots when this build first counts there, and keeps its totals).
 *
 * Granted acquisitions are counted by the wait histogram and releases by the hold histogram, so
 * each costs one field. The hash lives {@linkcode STATS_RETENTION_MS} past the last minute that
 * counted anything; its size is bounded by the field list: at most 60 × 61 + 61 fields.
 *
 * @module
 */

/** The counters, by operation: `<operation>.<outcome>` in Redis, snake_case as in Prometheus. */
export const COUNTERS = {
  acquire: ["busy", "timeout", "queue_full", "aborted"],
  renew: ["renewed", "lost"],
  release: ["lost"],
  break: ["broken"],
  idempotency: ["first", "replay", "conflict", "mismatch"],
  dedupe: ["first", "replay", "conflict", "mismatch", "signature_failed"],
  cron: ["run", "running", "too_soon", "tick_done"],
} as const;

/** Upper bounds of the wait-time buckets, ms (a last bucket takes the rest). */
export const WAIT_BUCKETS_MS = [1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000];
/** Upper bounds of the hold-time buckets, ms (a last bucket takes the rest). */
export const HOLD_BUCKETS_MS = [
  10,
  50,
  100,
  250,
  500,
  1000,
  2500,
  5000,
  10000,
  30000,
  60000,
  300000,
];

/** How long a prefix's stats outlive its last counted minute: a week. */
export const STATS_RETENTION_MS = 7 * 86_400_000;
/** The minutes of per-minute counts kept. */
export const WINDOW_MINUTES = 60;

const FIELDS = [
  ...Object.entries(COUNTERS).flatMap(([op, outcomes]) => outcomes.map((o) => `${op}.${o}`)),
  ...[...WAIT_BUCKETS_MS, 0].map((_, i) => `wait.${i}`),
  ...[...HOLD_BUCKETS_MS, 0].map((_, i) => `hold.${i}`),
];

const luaList = (values: readonly (string | number)[]) =>
  `{${values.map((v) => typeof v === "number" ? v : `'${v}'`).join(", ")}}`;

/**
 * Lua for the scripts that count: `count(key, nowMs, field)` adds one to a counter and
 * `observe(key, nowMs, 'wait'|'hold', ms)` to a histogram, both nothing when `key` is nil (stats
 * off). `minuteDuty(key, nowMs)`, after a count on `key`, is true once a minute per stats hash (per
 * prefix, or per bucket in the cluster layout; the minute's field `p` in the hash, read with the
 * slot's): a grant then prunes the held index. One script counts on one stats hash. Every
 * command runs through `pcall`: a stats key of the wrong type (a hand edit) stops the counting,
 * never the decision. A slot that turns over adds its earlier minute's counts to the totals
 * (`t:`) before it is cleared (a total that is not a whole number, a hand edit, is replaced; one
 * that would pass 2^63 stays). A hash of an earlier build, whose totals also counted what its
 * slots hold, loses its slots when this build first counts there (its totals keep them; 1000
 * fields per HDEL, within Lua's limit of 8000 values to unpack, however many a hand edit left) and
 * is marked `v` 2; until then its totals are read as they are (`toStats`). Only whole numbers
 * count, here and in `toStats`. (Explained here, not in the Lua: every script carries its text.)
 */
export const STATS_LUA = `
-- the stats key and minute whose slot this script checked already, and whether its duty is due
local checkedMinute, dutyDue
local function count(key, nowMs, field)
  if not key then return end
  local minute = string.format('%d', math.floor(nowMs / 60000))
  local slot = string.format('%d', math.floor(nowMs / 60000) % ${WINDOW_MINUTES}) .. ':'
  if checkedMinute ~= key .. '@' .. minute then
    local got = redis.pcall('HMGET', key, slot .. 'm', 'v', 'p')
    if got.err then return end
    local held = got[1]
    dutyDue = got[3] ~= minute
    if got[2] ~= '2' then
      local old = {}
      for _, f in ipairs(redis.pcall('HKEYS', key)) do
        if string.match(f, '^%d') then old[#old + 1] = f end
      end
      for i = 1, #old, 1000 do redis.pcall('HDEL', key, unpack(old, i, math.min(i + 999, #old))) end
      redis.pcall('HSET', key, 'v', '2')
      held = false
    end
    if held ~= minute then
      local fields, old = ${luaList(FIELDS)}, {}
      for i, f in ipairs(fields) do old[i] = slot .. f end
      for i, v in ipairs(redis.pcall('HMGET', key, unpack(old))) do
        local t = 't:' .. fields[i]
        if v and string.match(v, '^%d+$') and type(redis.pcall('HINCRBY', key, t, v)) == 'table' and
          not string.match(tostring(redis.pcall('HGET', key, t)), '^%d+$') then
          redis.pcall('HSET', key, t, v)
        end
      end
      redis.pcall('HDEL', key, unpack(old))
      redis.pcall('HSET', key, slot .. 'm', minute)
      redis.pcall('PEXPIRE', key, ${STATS_RETENTION_MS})
    end
    checkedMinute = key .. '@' .. minute
  end
  redis.pcall('HINCRBY', key, slot .. field, 1)
end
local function minuteDuty(key, nowMs)
  if not (key and dutyDue) then return false end
  dutyDue = false
  redis.pcall('HSET', key, 'p', string.format('%d', math.floor(nowMs / 60000)))
  return true
end
local function observe(key, nowMs, histogram, ms)
  if not key then return end
  ms = math.max(0, math.floor(ms))
  local bounds = ${luaList(WAIT_BUCKETS_MS)}
  if histogram == 'hold' then bounds = ${luaList(HOLD_BUCKETS_MS)} end
  local i = #bounds
  for j = 1, #bounds do
    if ms <= bounds[j] then i = j - 1; break end
  end
  count(key, nowMs, histogram .. '.' .. i)
  if ms > 0 then redis.pcall('HINCRBY', key, 't:' .. histogram .. '.sum', ms) end
end
`;

/** A histogram of times: counts per bucket (not cumulative). */
export interface Histogram {
  /** How many times were observed. */
  count: number;
  /** The sum of the times observed, ms (totals only). */
  sum_ms?: number;
  /** Times up to `le_ms` (null: the rest) and how many fell there. */
  buckets: { le_ms: number | null; count: number }[];
  /** The estimated median, ms (null without observations). */
  p50_ms: number | null;
  /** The estimated 99th percentile, ms (null without observations). */
  p99_ms: number | null;
}

/** The counts of one period, by operation and outcome (the Prometheus `outcome` labels). */
export interface Counts {
  /** Acquire calls: granted, busy (no wait), timeout, queue_full, aborted. */
  acquire: {
    granted: number;
    busy: number;
    timeout: number;
    queue_full: number;
    aborted: number;
  };
  /** Renewals: renewed, or lost (the lease was gone). */
  renew: { renewed: number; lost: number };
  /** Releases: released, or lost (the lease had ended); a retried release is not counted. */
  release: { released: number; lost: number };
  /** Renewals and releases that found their lease gone (expired, broken or taken over). */
  lease_lost: number;
  /** Locks an operator broke. */
  break: { broken: number };
  /** Idempotency keys: first runs, replays, conflicts (in flight), payload mismatches. */
  idempotency: { first: number; replay: number; conflict: number; mismatch: number };
  /** Webhook deliveries and other dedupe ids, and webhook signatures that failed. */
  dedupe: {
    first: number;
    replay: number;
    conflict: number;
    mismatch: number;
    signature_failed: number;
  };
  /** Cron job starts, and skips by reason. */
  cron: { run: number; running: number; too_soon: number; tick_done: number };
  /** From each acquire call to its grant, granted acquires only (the caller's clock). */
  wait: Histogram;
  /** From each grant to its release (the Redis clock). */
  hold: Histogram;
}

/** One minute of the last hour, for rates and charts. */
export interface MinuteStats {
  /** The minute's start, ms since the epoch (server clock). */
  at: number;
  /** Acquisitions granted. */
  granted: number;
  /** Acquires without a wait that found the lock busy. */
  busy: number;
  /** Waiting acquires that gave up. */
  timeout: number;
  /** Renewals and releases that found their lease gone. */
  lease_lost: number;
  /** The minute's median wait, ms. */
  wait_p50_ms: number | null;
  /** The minute's 99th-percentile wait, ms. */
  wait_p99_ms: number | null;
}

/** What `LockOps.stats()` answers. */
export interface Stats {
  /** The server time of the reading, ms since the epoch. */
  at: number;
  /** Locks held now. */
  locks_held: number;
  /** Since the stats began (or were last dropped after a week without counts). */
  total: Counts;
  /** The last 60 minutes, this one included. */
  last_hour: Counts;
  /** The last 60 minutes one by one, oldest first; a minute without counts is all zero. */
  minutes: MinuteStats[];
}

/**
 * Builds the stats from the hashes' fields (HGETALL as a flat array or an object): one hash per
 * prefix, or one per bucket of the cluster layout, summed.
 */
export function toStats(raws: readonly unknown[], nowMs: number, locksHeld: number): Stats {
  const hashes = raws.map(toHash);
  const minute = Math.floor(nowMs / 60_000);
  const minutes: MinuteStats[] = [];
  const slots: ((field: string) => number)[] = [];
  for (let m = minute - WINDOW_MINUTES + 1; m <= minute; m++) {
    const slot = `${m % WINDOW_MINUTES}:`;
    // A slot counts in a hash only while it holds minute m (it is cleared when it turns over).
    const current = hashes.filter((hash) => hash.get(`${slot}m`) === m);
    const get = (f: string) => current.reduce((sum, hash) => sum + (hash.get(slot + f) ?? 0), 0);
    slots.push(get);
    const c = counts(get);
    minutes.push({
      at: m * 60_000,
      granted: c.acquire.granted,
      busy: c.acquire.busy,
      timeout: c.acquire.timeout,
      lease_lost: c.lease_lost,
      wait_p50_ms: c.wait.p50_ms,
      wait_p99_ms: c.wait.p99_ms,
    });
  }
  // The totals: the counts folded in as slots turned over, and every slot's (a slot that has not
  // turned over since the last hour still counts there). A hash an earlier build counted in, not
  // yet marked `v` 2, counted its slots in its totals too.
  const everySlot = Array.from({ length: WINDOW_MINUTES }, (_, slot) => `${slot}:`);
  const total = (f: string) => {
    let sum = 0;
    for (const hash of hashes) {
      sum += hash.get(`t:${f}`) ?? 0;
      if (hash.get("v") !== 2) continue;
      for (const slot of everySlot) sum += hash.get(slot + f) ?? 0;
    }
    return sum;
  };
  return {
    at: nowMs,
    locks_held: locksHeld,
    total: counts(total, true),
    last_hour: counts((f) => slots.reduce((sum, get) => sum + get(f), 0)),
    minutes,
  };
}

function toHash(raw: unknown): Map<string, number> {
  const hash = new Map<string, number>();
  const entries: [unknown, unknown][] = Array.isArray(raw)
    ? raw.flatMap((v, i) => i % 2 === 0 ? [[v, raw[i + 1]] as [unknown, unknown]] : [])
    : Object.entries((raw ?? {}) as Record<string, unknown>);
  // Whole numbers only, as the scripts fold them (anything else is a hand edit); `v` is the
  // format only when it is exactly 2, as the scripts read it.
  for (const [k, v] of entries) {
    if (k === "v" && String(v) !== "2") continue;
    if (typeof k === "string" && /^\d+$/.test(String(v))) hash.set(k, Number(v));
  }
  return hash;
}

function counts(get: (field: string) => number, sums = false): Counts {
  const group = <K extends keyof typeof COUNTERS>(op: K) =>
    Object.fromEntries(COUNTERS[op].map((o) => [o, get(`${op}.${o}`)])) as {
      [O in (typeof COUNTERS)[K][number]]: number;
    };
  const wait = histogram(get, "wait", WAIT_BUCKETS_MS, sums);
  const hold = histogram(get, "hold", HOLD_BUCKETS_MS, sums);
  const renew = group("renew");
  const release = group("release");
  return {
    acquire: { granted: wait.count, ...group("acquire") },
    renew,
    release: { released: hold.count, ...release },
    lease_lost: renew.lost + release.lost,
    break: group("break"),
    idempotency: group("idempotency"),
    dedupe: group("dedupe"),
    cron: group("cron"),
    wait,
    hold,
  };
}

function histogram(
  get: (field: string) => number,
  name: string,
  bounds: number[],
  sums: boolean,
): Histogram {
  const buckets = [...bounds, null].map((le_ms, i) => ({ le_ms, count: get(`${name}.${i}`) }));
  const count = buckets.reduce((sum, b) => sum + b.count, 0);
  return {
    count,
    ...(sums && { sum_ms: get(`${name}.sum`) }),
    buckets,
    p50_ms: quantile(buckets, count, 0.5),
    p99_ms: quantile(buckets, count, 0.99),
  };
}

// As Prometheus's histogram_quantile: linear within the bucket where the rank falls; a rank in
// the last, unbounded bucket answers the highest bound.
function quantile(buckets: Histogram["buckets"], count: number, q: number): number | null {
  if (count === 0) return null;
  const rank = q * count;
  let below = 0;
  let lower = 0;
  for (const { le_ms, count: n } of buckets) {
    if (le_ms === null) return lower;
    if (below + n >= rank && n > 0) {
      return Math.round(lower + (le_ms - lower) * ((rank - below) / n));
    }
    below += n;
    lower = le_ms;
  }
  return lower;
}
