import { LockContext, type LockOpsOptions } from "./_context.ts";
import type { RedisLike } from "./_runner.ts";
import {
  checkFence,
  checkHoldId,
  checkListOptions,
  checkLockName,
  checkOptions,
  LIST_PAGE_DEFAULT,
  newHoldId,
} from "./_validate.ts";
import { inspectCall, toInfo } from "./locks.ts";
import type { Script, ScriptCall } from "./lua/_define.ts";
import { AUDIT_LENGTH, BREAK, READ_AUDIT } from "./lua/break.ts";
import { INSPECT } from "./lua/inspect.ts";
import { LIST } from "./lua/list.ts";
import { READ_STATS } from "./lua/read_stats.ts";
import { decodeBreak, decodeStats } from "./lua/replies.ts";
import { type Stats, toStats } from "./stats.ts";
import type {
  AuditEntry,
  BreakOptions,
  BreakResult,
  ListOptions,
  LockInfo,
  LockList,
} from "./types.ts";
import { InvalidRange, InvalidType } from "./_invalid.ts";

/**
 * An operator's view and acts on the locks under a prefix: list the held ones, read the stats,
 * break a stuck lock, read the audit of breaks. It reads what {@linkcode Locks} keeps with
 * `stats` on (the default); give it the same `stats` setting as the prefix's `Locks`.
 *
 * @example
 * ```ts
 * import { Redis } from "@upstash/redis";
 * import { LockOps } from "@edgelock/edgelock";
 *
 * const ops = new LockOps(Redis.fromEnv());
 * const { locks } = await ops.list({ prefix: "invoice:" });
 * for (const lock of locks) console.log(lock.name, lock.fence, lock.expiresAt);
 * ```
 */
export class LockOps {
  readonly #context: LockContext;

  /** Operations on `redis` (an `@upstash/redis` client), for keys under `prefix`. */
  constructor(redis: RedisLike, options: LockOpsOptions = {}) {
    this.#context = new LockContext(redis, "LockOps", options);
  }

  /**
   * Lists held locks by name, a page at a time (two requests: the index, then the locks), from
   * the held index the scripts keep (never a keyspace scan). A lock released or run out
   * meanwhile is left out; a page may hold fewer than `limit` locks and still have a `cursor`.
   */
  async list(options: ListOptions = {}): Promise<LockList> {
    const { prefix, cursor, limit } = checkListOptions(options);
    return await this.#context.observe(prefix, "list", async () => {
      const replies = await this.#perBucket(LIST, (base) =>
        LIST.call({
          keys: { namesKey: `${base}:held`, endsKey: `${base}:held:ends` },
          args: { prefix, cursor, limit },
        }));
      const { found, next } = mergePages(replies, limit);
      const calls = found.map((name) => inspectCall(this.#context, name));
      const infos = calls.length > 0 ? await this.#context.runMany(INSPECT, calls) : [];
      const locks = infos.map((info, i) => toInfo(found[i]!, info))
        .filter((info): info is LockInfo & { held: true } => info.held);
      return { locks, ...(next && { cursor: next }) };
    });
  }

  /**
   * The stats the scripts kept under this prefix: totals, the last hour and each of its minutes,
   * and the locks held now.
   */
  async stats(): Promise<Stats> {
    return await this.#context.observe("", "stats", async () => {
      const replies = await this.#perBucket(READ_STATS, (base) =>
        READ_STATS.call({
          keys: { statsKey: `${base}:stats`, endsKey: `${base}:held:ends` },
          args: {},
        }));
      const buckets = replies.map((reply) => decodeStats(READ_STATS, reply));
      const now = Math.max(...buckets.map((bucket) => bucket.now));
      const held = buckets.reduce((sum, bucket) => sum + bucket.held, 0);
      return toStats(buckets.map((bucket) => bucket.fields), now, held);
    });
  }

  /**
   * Breaks a held lock, an operator's act for a stuck holder: its lease ends now, so its renew
   * and release fail (counted as lost) and the next grant gets a higher fence. Recorded in the
   * audit stream with `by` and `reason`. A resource that checks fences refuses the old holder's
   * late writes; one that does not is not protected from it.
   */
  async break(name: string, options: BreakOptions): Promise<BreakResult> {
    checkLockName(name);
    checkOptions(options, ["by", "reason", "id", "fence"], "break()");
    const fence = checkFence(options.fence);
    const by = checkText(options?.by, "by", 1, 64);
    const reason = checkText(options?.reason ?? "", "reason", 0, 200);
    // An id of the call's own when none is given: a request the client sends again (its reply
    // lost) takes effect once, and ends no lease granted in between.
    const breakId = options.id === undefined
      ? newHoldId()
      : checkHoldId(options.id, "The break id");
    const { keys, fenceWindowMs } = this.#context;
    const { lockKey, holdersKey, marksKey, breaksKey } = keys.lock(name);
    const call = BREAK.call({
      keys: {
        lockKey,
        holdersKey,
        marksKey,
        breaksKey,
        auditKey: keys.audit(name),
        ...keys.statsKeys(name),
      },
      args: { graceMs: fenceWindowMs, name, by, reason, breakId, fence: fence?.toString() ?? "" },
    });
    return await this.#context.observe(name, "break", async () => {
      const broken = decodeBreak(BREAK, await this.#context.run(BREAK, call));
      return broken ? { broken: true, fence: broken.fence } : { broken: false };
    });
  }

  /** The latest breaks under this prefix, newest first (the stream keeps the last 1000). */
  async audit(options: { limit?: number } = {}): Promise<AuditEntry[]> {
    checkOptions(options, ["limit"], "audit()");
    const limit = options.limit ?? LIST_PAGE_DEFAULT;
    if (!Number.isInteger(limit) || limit < 1 || limit > AUDIT_LENGTH) {
      throw new InvalidRange(`limit must be an integer from 1 to ${AUDIT_LENGTH}`);
    }
    const replies = await this.#context.observe(
      "",
      "audit",
      () =>
        this.#perBucket(
          READ_AUDIT,
          (base) => READ_AUDIT.call({ keys: { auditKey: `${base}:audit` }, args: { limit } }),
        ),
    );
    return replies.flatMap((reply) => Array.isArray(reply) ? reply : []).map(toAuditEntry)
      .sort(newestFirst).slice(0, limit);
  }

  // One script per bucket (the prefix alone in the single layout), in one request.
  #perBucket(script: Script, call: (base: string) => ScriptCall): Promise<unknown[]> {
    return this.#context.runMany(script, this.#context.keys.bases().map(call));
  }
}

/**
 * One page of held names from every bucket's LIST reply (`{nowMs, next, name…}`). Each bucket
 * lists its first live names after the cursor and, when it has more, where it stopped looking:
 * the page is the names up to the earliest stop, at most `limit` of them, sorted.
 */
function mergePages(replies: unknown[], limit: number): { found: string[]; next?: string } {
  const pages = replies.map((reply) => Array.isArray(reply) ? reply.map(unmarked) : []);
  const stop = pages.map(([, next]) => next ?? "").filter((next) => next !== "").sort()[0];
  const found = pages.flatMap(([, , ...names]) => names).sort()
    .filter((name) => stop === undefined || name <= stop);
  if (found.length > limit) return { found: found.slice(0, limit), next: found[limit - 1]! };
  return { found, ...(stop !== undefined && { next: stop }) };
}

// A text the script sent behind '=' (so that no client parses it as JSON), without it.
function unmarked(value: unknown): string {
  const text = String(value);
  return text.startsWith("=") ? text.slice(1) : text;
}

// Stream ids are `<ms>-<seq>`; across buckets (cluster nodes) the clocks may differ a little.
function newestFirst(a: AuditEntry, b: AuditEntry): number {
  const [am, as] = a.id.split("-").map(Number) as [number, number];
  const [bm, bs] = b.id.split("-").map(Number) as [number, number];
  return bm - am || bs - as;
}

// XREVRANGE's entry: [id, [field, value, ...]].
function toAuditEntry(raw: unknown): AuditEntry {
  const [id, pairs] = Array.isArray(raw) ? raw : [];
  const fields = new Map<string, string>();
  const list = Array.isArray(pairs) ? pairs : [];
  for (let i = 0; i + 1 < list.length; i += 2) fields.set(String(list[i]), unmarked(list[i + 1]));
  return {
    id: String(id),
    action: "break",
    name: fields.get("name") ?? "",
    fence: Number(fields.get("fence") ?? 0),
    by: fields.get("by") ?? "",
    reason: fields.get("reason") ?? "",
    at: Number(fields.get("at") ?? 0),
  };
}

function checkText(value: unknown, what: string, min: number, max: number): string {
  if (typeof value !== "string") throw new InvalidType(`${what} must be a string`);
  if (value.length < min || value.length > max || !/^[\x20-\x7e]*$/.test(value)) {
    throw new InvalidRange(`${what} must be ${min}–${max} printable ASCII characters`);
  }
  return value;
}
