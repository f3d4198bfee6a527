// Argument checks shared by the library and the HTTP schemas: one definition of each limit.
import type { AcquireOptions, LeaseOptions } from "./types.ts";
import { InvalidRange, InvalidType } from "./_invalid.ts";

/**
 * Lock names and other path segments: 1–200 characters of `A-Z a-z 0-9 . _ : -`, but not `.`
 * or `..`, which URLs normalise away: every name the library takes is reachable over HTTP too.
 */
export const NAME_PATTERN = /^(?!\.\.?$)[A-Za-z0-9._:-]{1,200}$/;
/**
 * Lock names: as {@linkcode NAME_PATTERN}, and `{` `}` too, so names can share a Redis Cluster
 * hash slot: names that agree up to their first `}` (e.g. `{bank}acct:1`, `{bank}acct:2`) do.
 * Not starting with `}`: the key `<prefix>:lock:{}…}` would have an empty hash tag, so its keys
 * would fall into different slots.
 */
export const LOCK_NAME_PATTERN = /^(?!\.\.?$)(?!\})[A-Za-z0-9._:{}-]{1,200}$/;
/** What a lock name may start with, for listing by prefix: up to 200 of its characters. */
export const NAME_PREFIX_PATTERN = /^[A-Za-z0-9._:{}-]{0,200}$/;
/** A record id segment's source: a name, or `#` and a SHA-256 in hex. */
export const SEGMENT = "(?:(?!\\.\\.?(?:/|$))[A-Za-z0-9._:-]{1,200}|#[0-9a-f]{64})";
/** One segment of a record id: a name, or `#` and a SHA-256 in hex (from `safeName`). */
export const SEGMENT_PATTERN: RegExp = new RegExp(`^${SEGMENT}$`);
/** Owner tokens: 16–128 characters of `A-Z a-z 0-9 _ -`. */
export const TOKEN_PATTERN = /^[A-Za-z0-9_-]{16,128}$/;
/** Largest `meta` object, as JSON text in UTF-8 bytes. */
export const MAX_META_BYTES = 1024;

/**
 * How long the last fence outlives its lease: fences keep increasing across this window even if
 * the server clock steps back within it. One hour.
 */
export const FENCE_GRACE_MS = 3_600_000;

/** The prefix of every Redis key, by default. */
export const DEFAULT_PREFIX = "edgelock";
/** The default lease length, in milliseconds. */
export const DEFAULT_TTL_MS = 10_000;
/** The default bound on waiters per name. */
export const DEFAULT_MAX_WAITERS = 128;
/** The most leases one `renewMany` call takes, and the longest page a list returns. */
export const MAX_BATCH = 1000;
/** How many locks or audit entries a page holds, by default. */
export const LIST_PAGE_DEFAULT = 100;
/** A new name's expected hold time, ms, for busy replies' hints until holds are sampled. */
export const DEFAULT_HOLD_MS = 20;

/** How long a claim (idempotency, dedupe) lasts if never completed, by default: 30 s. */
export const DEFAULT_LEASE_MS = 30_000;
/** How long a completed record is kept, by default: a day. */
export const DEFAULT_RETENTION_MS = 86_400_000;

/** A lease's fence, when given: a positive safe integer, else a RangeError. */
export function checkFence(fence: unknown): number | undefined {
  if (fence !== undefined && !(Number.isSafeInteger(fence) && (fence as number) > 0)) {
    throw new InvalidRange("The lease's fence must be a positive integer");
  }
  return fence as number | undefined;
}

/**
 * A grant's hint of the next holders' wake ids, comma-joined, or a multi-name waiter at the head
 * as a release names it, `<wakeId>|<names>` (see `grantHint` in `./lua/lib.ts`).
 */
export const HINT =
  /^[\w-]{1,64}(?:(?:,[\w-]{1,64}){0,7}|\|[\w.:{}-]{1,200}(?:,[\w.:{}-]{1,200}){0,31})$/;

/** A lease's `next`, when given: a grant's hint as acquire returned it, else a TypeError. */
export function checkNext(next: unknown): string | undefined {
  if (next !== undefined && !(typeof next === "string" && HINT.test(next))) {
    throw new InvalidType("The lease's next must be the next that acquire returned, unchanged");
  }
  return next;
}

/** Inclusive limits of each duration, in milliseconds. */
export const LIMITS = {
  ttlMs: { min: 100, max: 300_000 },
  waitMs: { min: 0, max: 30_000 },
  leaseMs: { min: 100, max: 3_600_000 },
  retentionMs: { min: 1000, max: 2_592_000_000 },
  atMostMs: { min: 100, max: 86_400_000 },
  atLeastMs: { min: 0, max: 86_400_000 },
  fenceWindowMs: { min: 1000, max: 86_400_000 },
} as const;

/** The most names one multi-name lock takes. */
export const MAX_NAMES = 32;

/** The most permits a semaphore has (its `limit`). */
export const MAX_LIMIT = 1000;

export function checkName(name: unknown, what = "lock name"): string {
  if (typeof name !== "string") throw new InvalidType(`The ${what} must be a string`);
  if (!NAME_PATTERN.test(name)) {
    throw new InvalidRange(
      `The ${what} "${name.slice(0, 50)}" must be 1–200 characters of A-Z a-z 0-9 . _ : - ` +
        `(and not . or ..)`,
    );
  }
  return name;
}

export function checkLockName(name: unknown): string {
  if (typeof name !== "string") throw new InvalidType("The lock name must be a string");
  if (!LOCK_NAME_PATTERN.test(name)) {
    throw new InvalidRange(
      `The lock name "${name.slice(0, 50)}" must be 1–200 characters of A-Z a-z 0-9 . _ : - { } ` +
        `(not . or .., and not starting with })`,
    );
  }
  return name;
}

/**
 * The part of a lock name that picks its Redis Cluster slot: up to its first `}` (its key is
 * `<prefix>:lock:{<name>}`, and Redis hashes what lies between the first `{` and the first `}`
 * after it), else all of it.
 */
export function slotTag(name: string): string {
  const end = name.indexOf("}");
  return end > 0 ? name.slice(0, end) : name;
}

/**
 * A multi-name lock's names: 1–MAX_NAMES distinct lock names, in one Redis Cluster slot when
 * `sameSlot` (the cluster layout, where one script's keys must share a slot).
 */
export function checkLockNames(names: unknown, sameSlot: boolean): readonly string[] {
  if (!Array.isArray(names) || names.length < 1 || names.length > MAX_NAMES) {
    throw new InvalidRange(`acquireAll takes 1 to ${MAX_NAMES} lock names`);
  }
  (names as unknown[]).forEach(checkLockName);
  if (new Set(names).size !== names.length) throw new InvalidRange("The lock names must differ");
  if (!sameSlot) return names as string[];
  const tag = slotTag(names[0] as string);
  const stray = (names as string[]).find((name) => slotTag(name) !== tag);
  if (stray !== undefined) {
    throw new InvalidRange(
      `In the cluster layout, the names of one multi-name lock must share a slot: "${stray}" does not ` +
        `start like "${names[0]}". Start each with the same {group}, e.g. {bank}acct:1 and ` +
        `{bank}acct:2`,
    );
  }
  return names as string[];
}

export function checkPrefix(prefix: unknown): string {
  if (typeof prefix !== "string" || !/^[A-Za-z0-9._:-]{1,100}$/.test(prefix)) {
    throw new InvalidRange("prefix must be 1–100 characters of A-Z a-z 0-9 . _ : -");
  }
  return prefix;
}

export function checkToken(token: unknown): string {
  if (typeof token !== "string") throw new InvalidType("The token must be a string");
  if (!TOKEN_PATTERN.test(token)) {
    throw new InvalidRange("The token must be 16–128 characters of A-Z a-z 0-9 _ -");
  }
  return token;
}

/**
 * A renewal's length: `given` (checked) or, when the caller gives none, the lease's own `ttlMs` (a
 * reentrant lease's is what was left of it, so it may be under the least) kept within the limits,
 * else the default.
 */
export function renewTtl(given: unknown, ttlMs: unknown): number {
  if (given !== undefined) return checkDuration(given, "ttlMs", DEFAULT_TTL_MS);
  if (ttlMs === undefined) return DEFAULT_TTL_MS;
  if (typeof ttlMs !== "number" || !Number.isFinite(ttlMs)) {
    throw new InvalidType("The lease's ttlMs must be a number");
  }
  return Math.min(Math.max(Math.round(ttlMs), LIMITS.ttlMs.min), LIMITS.ttlMs.max);
}

/** Checks a duration against the limits of `field`; `label` names it in errors (default `field`). */
export function checkDuration(
  value: unknown,
  field: keyof typeof LIMITS,
  fallback: number,
  label: string = field,
): number {
  if (value === undefined) return fallback;
  const { min, max } = LIMITS[field];
  if (typeof value !== "number") throw new InvalidType(`${label} must be a number`);
  if (!Number.isInteger(value) || value < min || value > max) {
    throw new InvalidRange(`${label} must be an integer from ${min} to ${max} milliseconds`);
  }
  return value;
}

export function checkMeta(meta: unknown): string {
  if (meta === undefined) return "";
  if (typeof meta !== "object" || meta === null || Array.isArray(meta)) {
    throw new InvalidType("meta must be a plain JSON object");
  }
  // What is stored is the JSON: a Date or a toJSON() that is no object would not read back as one.
  const text = jsonText(meta, "meta");
  if (typeof text !== "string" || !text.startsWith("{")) {
    throw new InvalidType("meta must be a plain JSON object");
  }
  if (new TextEncoder().encode(text).length > MAX_META_BYTES) {
    throw new InvalidRange(`meta must be at most ${MAX_META_BYTES} bytes as JSON`);
  }
  return text;
}

/** A record's kind: "idempotency" or "dedupe" (another would build another key space's key). */
export function checkRecordKind(kind: unknown): void {
  if (kind === "idempotency" || kind === "dedupe") return;
  const said = typeof kind === "string" ? JSON.stringify(kind) : typeName(kind);
  throw new InvalidRange(`kind must be "idempotency" or "dedupe", not ${said}`);
}

/** `value` as JSON text; a TypeError naming `what` when it cannot be (a cycle, a BigInt). */
export function jsonText(value: unknown, what: string): string {
  try {
    return JSON.stringify(value);
  } catch (cause) {
    throw new InvalidType(
      `${what} cannot be sent as JSON (a cycle, a BigInt, or a toJSON that threw)`,
      { cause },
    );
  }
}

/** `list()`'s options, checked: a prefix of names, a cursor (a name) and a page size. */
export function checkListOptions(
  options: { prefix?: string; cursor?: string; limit?: number },
): { prefix: string; cursor: string; limit: number } {
  checkOptions(options, ["prefix", "cursor", "limit"], "list()");
  const { prefix = "", cursor = "", limit = LIST_PAGE_DEFAULT } = options ?? {};
  if (typeof prefix !== "string" || !NAME_PREFIX_PATTERN.test(prefix)) {
    throw new InvalidRange("prefix must be up to 200 characters of A-Z a-z 0-9 . _ : - { }");
  }
  if (cursor !== "") checkLockName(cursor);
  if (!Number.isInteger(limit) || limit < 1 || limit > MAX_BATCH) {
    throw new InvalidRange(`limit must be an integer from 1 to ${MAX_BATCH}`);
  }
  return { prefix, cursor, limit };
}

/**
 * What every acquire takes of a lease's options, checked, in the library and the typed client:
 * the token made here when none is given, and then `fresh` (a late copy of the call is refused).
 */
export function checkLeaseOptions(options: LeaseOptions) {
  return {
    ttlMs: checkDuration(options.ttlMs, "ttlMs", DEFAULT_TTL_MS),
    waitMs: checkDuration(options.waitMs, "waitMs", 0),
    token: options.token === undefined ? newToken() : checkToken(options.token),
    fresh: checkFlag(options.freshToken, "freshToken") || options.token === undefined,
    meta: checkMeta(options.meta),
    signal: checkSignal(options.signal),
  };
}

export function checkSignal(signal: unknown): AbortSignal | undefined {
  if (signal === undefined || signal instanceof AbortSignal) return signal;
  throw new InvalidType("signal must be an AbortSignal");
}

/** A new owner token: 128 random bits, base64url (22 characters). */
export function newToken(): string {
  return base64url(crypto.getRandomValues(new Uint8Array(16)));
}

const BASE64URL = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/**
 * 16 bytes as base64url without padding, as `btoa` and two replaces give, in half the time: each
 * acquire makes a token and a wake id.
 */
export function base64url(bytes: Uint8Array): string {
  const digit = (n: number) => BASE64URL[n & 63]!;
  let text = "";
  for (let i = 0; i < 15; i += 3) {
    const n = (bytes[i]! << 16) | (bytes[i + 1]! << 8) | bytes[i + 2]!;
    text += digit(n >> 18) + digit(n >> 12) + digit(n >> 6) + digit(n);
  }
  return text + digit(bytes[15]! >> 2) + digit(bytes[15]! << 4);
}

// The mode and, for a semaphore, its limit and this caller's permits (limit 0: not a semaphore).
export function checkMode(
  options: Pick<AcquireOptions, "mode" | "limit" | "permits">,
): {
  mode: "exclusive" | "shared" | "semaphore";
  limit: number;
  permits: number;
} {
  const { mode, limit, permits } = options;
  if (mode !== undefined && mode !== "exclusive" && mode !== "shared") {
    throw new InvalidRange('mode must be "exclusive" or "shared"');
  }
  if (limit === undefined) {
    if (permits !== undefined) throw new InvalidType("permits needs limit (a semaphore)");
    return { mode: mode ?? "exclusive", limit: 0, permits: 1 };
  }
  if (mode !== undefined) throw new InvalidType("A semaphore (limit) takes no mode");
  if (!Number.isInteger(limit) || limit < 1 || limit > MAX_LIMIT) {
    throw new InvalidRange(`limit must be an integer from 1 to ${MAX_LIMIT}`);
  }
  const taken = permits ?? 1;
  if (!Number.isInteger(taken) || taken < 1 || taken > limit) {
    throw new InvalidRange(`permits must be an integer from 1 to limit (${limit})`);
  }
  return { mode: "semaphore", limit, permits: taken };
}

/** A reentrant hold's id (or a break's): 8–32 characters of `A-Z a-z 0-9 _ -`. */
export const HOLD_ID_PATTERN = /^[A-Za-z0-9_-]{8,32}$/;

export function checkHoldId(id: unknown, what = "The hold id"): string {
  if (typeof id !== "string") throw new InvalidType(`${what} must be a string`);
  if (!HOLD_ID_PATTERN.test(id)) {
    throw new InvalidRange(`${what} must be 8–32 characters of A-Z a-z 0-9 _ -`);
  }
  return id;
}

/** A new hold or break id: 72 random bits, base64url (12 characters). */
export function newHoldId(): string {
  return newToken().slice(0, 12);
}

/**
 * The hold id a reentrant acquire sends ('' when not reentrant): the caller's, or a new one. The
 * script counts each id once, so a retry with the same id takes effect once.
 */
export function checkHold(options: Pick<AcquireOptions, "reentrant" | "hold">): string {
  if (!checkFlag(options.reentrant, "reentrant")) {
    if (options.hold !== undefined) throw new InvalidType("hold needs reentrant: true");
    return "";
  }
  return options.hold === undefined ? newHoldId() : checkHoldId(options.hold);
}

export function checkFlag(value: unknown, what: string): boolean {
  if (value === undefined) return false;
  if (typeof value !== "boolean") throw new InvalidType(`${what} must be a boolean`);
  return value;
}

/**
 * Refuses an options object that names an option `where` does not take (a typo such as `ttl` or
 * `prefx` would otherwise be a default, silently): a TypeError naming it and the likeliest meant.
 */
export function checkOptions(options: unknown, known: readonly string[], where: string): void {
  if (options === undefined) return;
  if (typeof options !== "object" || options === null || Array.isArray(options)) {
    throw new InvalidType(`${where} takes an options object`);
  }
  for (const key of Object.keys(options)) {
    if (known.includes(key)) continue;
    const near = nearest(key, known);
    throw new InvalidType(
      `${where} has no option "${key}"${near ? `; did you mean "${near}"?` : ""}`,
    );
  }
}

/**
 * The name in `known` that `key` is likely a slip for: a prefix either way, the same first four
 * letters, or 2 edits off.
 */
export function nearest(key: string, known: readonly string[]): string | undefined {
  const lower = key.toLowerCase();
  return known.find((option) => {
    const other = option.toLowerCase();
    return other.startsWith(lower) || lower.startsWith(other) ||
      (lower.length >= 4 && other.startsWith(lower.slice(0, 4))) || distance(other, lower) <= 2;
  });
}

// Edit distance (insertions, deletions, substitutions) between two short strings.
function distance(a: string, b: string): number {
  let row = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const next = [i];
    for (let j = 1; j <= b.length; j++) {
      next[j] = Math.min(
        row[j]! + 1,
        next[j - 1]! + 1,
        row[j - 1]! + (a[i - 1] === b[j - 1] ? 0 : 1),
      );
    }
    row = next;
  }
  return row[b.length]!;
}

/** What every store's constructor takes (`Locks`, `LockOps`, `Records`, `Jobs`). */
export const STORE_OPTIONS = [
  "prefix",
  "timeoutMs",
  "fenceWindowMs",
  "stats",
  "cluster",
  "keyLocking",
  "blocking",
  "onEvent",
] as const;
/** What a lease's acquire takes (`acquireAll` too). */
export const LEASE_OPTIONS = ["ttlMs", "waitMs", "token", "freshToken", "meta", "signal"] as const;
/** What one name's acquire takes. */
export const ACQUIRE_OPTIONS = [
  ...LEASE_OPTIONS,
  "mode",
  "limit",
  "permits",
  "reentrant",
  "hold",
] as const;

/** What a record's claim takes (`Records`, the client's records). */
export const CLAIM_OPTIONS = ["token", "leaseMs", "retentionMs", "fingerprint"] as const;

/** What a job's start takes (`Jobs`, the client's jobs, `cronGuard`). */
export const JOB_OPTIONS = ["atMostMs", "atLeastMs", "tick", "tickRetentionMs", "token"] as const;

/** A cron tick's text: a string or a whole number ≥ 0 as is, a Date as its epoch ms. */
export function checkTick(tick: unknown): string {
  if (tick instanceof Date) {
    if (Number.isNaN(tick.getTime())) throw new InvalidRange("tick is an invalid Date");
    return String(tick.getTime());
  }
  if (typeof tick === "number" && !(Number.isSafeInteger(tick) && tick >= 0)) {
    throw new InvalidRange(
      `tick must be a whole number ≥ 0 (as the HTTP API takes it), not ${tick}`,
    );
  }
  if (typeof tick !== "string" && typeof tick !== "number") {
    throw new InvalidType(`tick must be a string, a number or a Date, not ${typeName(tick)}`);
  }
  return checkName(String(tick), "tick");
}

/** What a value is, for an error: null, an array, an object, a bigint, … */
function typeName(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "an array";
  const type = typeof value;
  return type === "object" ? "an object" : `a ${type}`;
}
