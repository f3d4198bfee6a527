import { sleep } from "./_backoff.ts";
import {
  checkRedis,
  checkTimeout,
  integers,
  parseJsonText,
  type RedisLike,
  runScript,
  runScripts,
} from "./_runner.ts";
import { noteSentAt } from "./_granted.ts";
import { EdgelockError } from "./errors.ts";
import {
  checkDuration,
  checkMeta,
  checkName,
  checkPrefix,
  checkSignal,
  checkToken,
  NAME_PREFIX_PATTERN,
  newToken,
} from "./_validate.ts";
import {
  ACQUIRE,
  AUDIT_LENGTH,
  BREAK,
  FENCE_GRACE_MS,
  INSPECT,
  LEAVE_QUEUE,
  LIST,
  READ_AUDIT,
  READ_STATS,
  RELEASE,
  RENEW,
} from "./scripts.ts";
import { type Script } from "./_lua.ts";
import { type Stats, statsKeys, toStats } from "./stats.ts";
import type {
  AcquireOptions,
  AcquireResult,
  AuditEntry,
  BreakOptions,
  BreakResult,
  Lease,
  LeaseRef,
  ListOptions,
  LockClient,
  LockEvent,
  LockInfo,
  LockList,
  RenewOptions,
  RenewResult,
  WithLockOptions,
} from "./types.ts";
import { withLock } from "./with_lock.ts";

/** Options for {@linkcode Locks}. */
export interface LocksOptions {
  /** Prefix of every Redis key, e.g. per tenant or per app. @default "edgelock" */
  prefix?: string;
  /**
   * The most waiters one name queues, 1–1000; a waiter beyond them is told `queue_full`.
   * @default 128
   */
  maxWaiters?: number;
  /**
   * How long one Redis request may take, 1–60000 ms; then the call fails with
   * `backend_unavailable` (a paused or unreachable Redis never hangs a caller). @default 2000
   */
  timeoutMs?: number;
  /**
   * How long a name's record (its last fence, about 100 bytes) outlives the lease, 1000–86400000
   * ms. Within it fences keep increasing even if the server clock steps back; after it the name
   * leaves nothing in Redis, and a new fence is still above the old ones unless the clock is
   * behind them. @default 3600000 (an hour)
   */
  fenceWindowMs?: number;
  /**
   * Keep stats and the held index in Redis, in the same scripts (a few more Redis commands per
   * call, no more requests): needed by `stats()` and `list()`. @default true
   */
  stats?: boolean;
  /**
   * Told of every operation's outcome, for logs, alerts or tracing (see `@edgelock/edgelock/otel`).
   * Called synchronously; what it throws is ignored.
   */
  onEvent?: (event: LockEvent) => void;
}

/** The default bound on waiters per name. */
export const DEFAULT_MAX_WAITERS = 128;

/** The most leases one `renewMany` call takes. */
export const MAX_BATCH = 1000;
// A waiter looks again at least this often, and its ticket outlives each look by the margin.
const MAX_POLL_MS = 1000;
const TICKET_MARGIN_MS = 250;

/** The default lease length, in milliseconds. */
export const DEFAULT_TTL_MS = 10_000;

/**
 * Distributed locks on Redis over REST: each acquire, renew, release and inspect is one script
 * in one request.
 *
 * @example
 * ```ts
 * import { Redis } from "@upstash/redis";
 * import { Locks } from "@edgelock/edgelock";
 *
 * const locks = new Locks(Redis.fromEnv());
 * const result = await locks.acquire("invoice:42", { ttlMs: 5000 });
 * if (result.acquired) {
 *   try {
 *     // … write to the resource, passing result.lease.fence along
 *   } finally {
 *     await locks.release(result.lease);
 *   }
 * }
 * ```
 */
export class Locks implements LockClient {
  readonly #redis: RedisLike;
  readonly #prefix: string;
  readonly #maxWaiters: number;
  readonly #timeoutMs: number;
  readonly #fenceWindowMs: number;
  // The stats hash and the held index (names, lease ends) the scripts take; none with stats off.
  readonly #statsKeys: string[];
  readonly #onEvent: ((event: LockEvent) => void) | undefined;

  /** Locks on `redis` (an `@upstash/redis` client), their keys under `prefix`. */
  constructor(
    redis: RedisLike,
    {
      prefix = "edgelock",
      maxWaiters = DEFAULT_MAX_WAITERS,
      timeoutMs,
      fenceWindowMs,
      stats = true,
      onEvent,
    }: LocksOptions = {},
  ) {
    checkRedis(redis, "Locks");
    checkPrefix(prefix);
    if (!Number.isInteger(maxWaiters) || maxWaiters < 1 || maxWaiters > 1000) {
      throw new RangeError("maxWaiters must be an integer from 1 to 1000");
    }
    this.#redis = redis;
    this.#prefix = prefix;
    this.#maxWaiters = maxWaiters;
    this.#timeoutMs = checkTimeout(timeoutMs);
    this.#fenceWindowMs = checkDuration(fenceWindowMs, "fenceWindowMs", FENCE_GRACE_MS);
    const hash = statsKeys(prefix, stats);
    this.#statsKeys = hash.length === 0 ? [] : [...hash, `${prefix}:held`, `${prefix}:held:ends`];
    if (onEvent !== undefined && typeof onEvent !== "function") {
      throw new TypeError("onEvent must be a function");
    }
    this.#onEvent = onEvent;
  }

  #run(script: Script, keys: string[], args: (string | number)[]): Promise<unknown> {
    return runScript(this.#redis, script, keys, args, this.#timeoutMs);
  }

  /** Tells the hook; an operation's Redis failure as an `error` event, then rethrown. */
  #emit(event: LockEvent): void {
    try {
      this.#onEvent?.(event);
    } catch {
      // the application's hook never breaks a lock operation
    }
  }

  async #observe<T>(
    name: string,
    operation: (LockEvent & { type: "error" })["operation"],
    run: () => Promise<T>,
  ): Promise<T> {
    if (!this.#onEvent) return run();
    const started = performance.now();
    try {
      return await run();
    } catch (error) {
      if (error instanceof EdgelockError && error.code !== "invalid_request") {
        this.#emit({ type: "error", name, operation, error, ...this.#timing(started) });
      }
      throw error;
    }
  }

  #timing(started: number): { at: number; durationMs: number } {
    return { at: Date.now(), durationMs: performance.now() - started };
  }

  /**
   * Acquires `name`. When it is busy and `waitMs` > 0, waits in a fair FIFO queue, looking again
   * when the server expects its turn (from recent hold times), never past the holder's TTL.
   */
  async acquire(name: string, options: AcquireOptions = {}): Promise<AcquireResult> {
    checkName(name);
    const ttlMs = checkDuration(options.ttlMs, "ttlMs", DEFAULT_TTL_MS);
    const waitMs = checkDuration(options.waitMs, "waitMs", 0);
    const token = options.token === undefined ? newToken() : checkToken(options.token);
    const meta = checkMeta(options.meta);
    const signal = checkSignal(options.signal);
    return await this.#observe(
      name,
      "acquire",
      () => this.#acquire(name, token, ttlMs, waitMs, meta, signal),
    );
  }

  async #acquire(
    name: string,
    token: string,
    ttlMs: number,
    waitMs: number,
    meta: string,
    signal: AbortSignal | undefined,
  ): Promise<AcquireResult> {
    const started = performance.now();
    const deadline = started + waitMs;
    const keys = this.#keys(name);
    const acquireKeys = [...keys, ...this.#statsKeys];
    const waiting = waitMs > 0 ? "1" : "0";
    const outcome = (outcome: (LockEvent & { type: "acquire" })["outcome"], fence?: number) =>
      this.#emit({
        type: "acquire",
        name,
        outcome,
        ...(fence !== undefined && { fence }),
        waitedMs: performance.now() - started,
        ...this.#timing(started),
      });
    let queued = false;

    for (;;) {
      if (signal?.aborted) {
        if (queued) await this.#leaveQueue(keys, token, "aborted");
        outcome("aborted");
        signal.throwIfAborted();
      }
      const left = deadline - performance.now();
      // A waiter holds a FIFO ticket that outlives its next look by a margin.
      const ticketMs = left > 0 ? Math.ceil(Math.min(left, MAX_POLL_MS) + TICKET_MARGIN_MS) : 0;
      const waitedMs = Math.round(performance.now() - started);
      const args = [
        token,
        ttlMs,
        meta,
        this.#fenceWindowMs,
        ticketMs,
        this.#maxWaiters,
        name,
        waitedMs,
        waiting,
      ];
      queued ||= ticketMs > 0;
      const sentAt = performance.now();
      const reply = await this.#run(ACQUIRE, acquireKeys, args);
      if (integers(ACQUIRE, reply, 1)[0] === 1) {
        const lease = noteSentAt(toLease(name, token, ACQUIRE, reply), sentAt);
        outcome("granted", lease.fence);
        return { acquired: true, lease };
      }
      const [, hint, now, position, pttl] = integers(ACQUIRE, reply, 5);
      const retryAfterMs = Math.max(1, hint!);
      const busy = {
        acquired: false as const,
        retryAfterMs,
        ...(pttl! > 0 && { lockExpiresAt: now! + pttl! }),
      };
      if (position === QUEUE_FULL) {
        if (queued) await this.#leaveQueue(keys, token, "");
        outcome("queue_full");
        return { ...busy, reason: "queue_full" };
      }
      const remaining = deadline - performance.now();
      if (remaining <= 0) {
        if (queued) await this.#leaveQueue(keys, token, "timeout");
        outcome(queued ? "timeout" : "busy");
        return { ...busy, reason: "busy" };
      }
      if (signal?.aborted) continue;
      this.#emit({
        type: "wait",
        name,
        position: position!,
        retryAfterMs,
        ...this.#timing(sentAt),
      });
      // Look again so the request arrives when the server expects our turn: the hint counts from
      // the reply's making, and half a round trip has passed since, half is still ahead. The head
      // and the next in line aim a little late (early costs a round trip); the others spread ±10 %.
      const rtt = performance.now() - sentAt;
      const jitter = position! <= 1 ? 1 + Math.random() * 0.1 : 0.9 + Math.random() * 0.2;
      const delay = Math.min(remaining, MAX_POLL_MS, retryAfterMs * jitter - rtt);
      await sleep(Math.max(1, delay), signal).catch(() => {}); // an abort: the loop's top
    }
  }

  // Best effort: a ticket left behind lapses by itself within MAX_POLL_MS + TICKET_MARGIN_MS.
  // `outcome` ('timeout', 'aborted' or '') is counted in the stats.
  async #leaveQueue(keys: string[], token: string, outcome: string): Promise<void> {
    const leaveKeys = [keys[1]!, keys[2]!, ...this.#statsKeys.slice(0, 1)];
    await this.#run(LEAVE_QUEUE, leaveKeys, [token, outcome]).catch(() => {});
  }

  /** Extends a lease still held by its token; the fence stays the same. */
  async renew(lease: LeaseRef, options: RenewOptions = {}): Promise<RenewResult> {
    const { name, token } = checkLease(lease);
    const ttlMs = checkDuration(options.ttlMs, "ttlMs", lease.ttlMs ?? DEFAULT_TTL_MS);
    return await this.#observe(name, "renew", async () => {
      const started = performance.now();
      const reply = await this.#run(
        RENEW,
        this.#leaseKeys(name),
        this.#renewArgs(name, token, ttlMs),
      );
      return this.#renewed(name, token, reply, started);
    });
  }

  #renewArgs(name: string, token: string, ttlMs: number): (string | number)[] {
    return [token, ttlMs, this.#fenceWindowMs, name];
  }

  #renewed(name: string, token: string, reply: unknown, started: number): RenewResult {
    const result = toRenewal(name, token, reply);
    this.#emit({
      type: "renew",
      name,
      outcome: result.renewed ? "renewed" : "lost",
      ...(result.renewed && { fence: result.lease.fence }),
      ...this.#timing(started),
    });
    return result;
  }

  /**
   * Renews up to 1000 leases in one request (one script per lease in one pipeline, so the names
   * may live in different Redis Cluster slots), each with `ttlMs` from now (default 10000).
   * Results come in the same order; the fence of each renewed lease stays the same.
   */
  async renewMany(leases: readonly LeaseRef[], options: RenewOptions = {}): Promise<RenewResult[]> {
    if (!Array.isArray(leases) || leases.length === 0 || leases.length > MAX_BATCH) {
      throw new RangeError(`renewMany takes 1 to ${MAX_BATCH} leases`);
    }
    const ttlMs = checkDuration(options.ttlMs, "ttlMs", DEFAULT_TTL_MS);
    const refs = leases.map(checkLease);
    const calls = refs.map(({ name, token }) => ({
      keys: this.#leaseKeys(name),
      args: this.#renewArgs(name, token, ttlMs),
    }));
    const started = performance.now();
    const replies = await this.#observe(
      refs[0]!.name,
      "renew",
      () => runScripts(this.#redis, RENEW, calls, this.#timeoutMs),
    );
    return refs.map(({ name, token }, i) => this.#renewed(name, token, replies[i], started));
  }

  /**
   * Frees a lease. `false` when its token no longer held the lock (expired or taken over);
   * a retry of a release that went through answers `true` again.
   */
  async release(lease: LeaseRef): Promise<boolean> {
    const { name, token } = checkLease(lease);
    const args = [token, this.#fenceWindowMs, fenceArg(lease), name];
    return await this.#observe(name, "release", async () => {
      const started = performance.now();
      const reply = await this.#run(RELEASE, this.#leaseKeys(name), args);
      const released = integers(RELEASE, [reply], 1)[0] === 1;
      this.#emit({
        type: "release",
        name,
        outcome: released ? "released" : "lost",
        ...(lease.fence !== undefined && { fence: lease.fence }),
        ...this.#timing(started),
      });
      return released;
    });
  }

  /**
   * Tells whether `name` is held, with its fence, remaining TTL, waiters and meta; never the
   * token.
   */
  async inspect(name: string): Promise<LockInfo> {
    checkName(name);
    return await this.#observe(name, "inspect", async () => {
      const [lock, , tickets] = this.#keys(name);
      return toInfo(name, await this.#run(INSPECT, [lock, tickets], []));
    });
  }

  /**
   * Lists held locks by name, a page at a time (two requests: the index, then the locks), from
   * the held index the scripts keep (needs `stats`; never a keyspace scan). A lock released or
   * run out meanwhile is left out; a page may hold fewer than `limit` locks and still have a
   * `cursor`.
   */
  async list(options: ListOptions = {}): Promise<LockList> {
    this.#needStats("list");
    const prefix = options.prefix ?? "";
    const cursor = options.cursor ?? "";
    const limit = options.limit ?? 100;
    if (typeof prefix !== "string" || !NAME_PREFIX_PATTERN.test(prefix)) {
      throw new RangeError("prefix must be up to 200 characters of A-Z a-z 0-9 . _ : -");
    }
    if (cursor !== "") checkName(cursor);
    if (!Number.isInteger(limit) || limit < 1 || limit > MAX_BATCH) {
      throw new RangeError(`limit must be an integer from 1 to ${MAX_BATCH}`);
    }
    return await this.#observe(prefix, "list", async () => {
      const [, names, ends] = this.#statsKeys;
      const reply = await this.#run(LIST, [names!, ends!], [prefix, cursor, limit]);
      const [, next, ...found] = Array.isArray(reply) ? reply.map(String) : [];
      const calls = found.map((name) => {
        const [lock, , tickets] = this.#keys(name);
        return { keys: [lock, tickets], args: [] };
      });
      const infos = calls.length > 0
        ? await runScripts(this.#redis, INSPECT, calls, this.#timeoutMs)
        : [];
      const locks = infos.map((info, i) => toInfo(found[i]!, info))
        .filter((info): info is LockInfo & { held: true } => info.held);
      return { locks, ...(next && { cursor: next }) };
    });
  }

  /**
   * The stats the scripts kept under this prefix: totals, the last hour and each of its minutes,
   * and the locks held now (needs `stats`).
   */
  async stats(): Promise<Stats> {
    this.#needStats("stats");
    return await this.#observe("", "stats", async () => {
      const [stats, , ends] = this.#statsKeys;
      const reply = await this.#run(READ_STATS, [stats!, ends!], []);
      const [now, held] = integers(READ_STATS, reply, 2);
      return toStats((reply as unknown[]).slice(2), now!, held!);
    });
  }

  /**
   * Breaks a held lock, an operator's act for a stuck holder: its lease ends now, so its renew
   * and release fail (counted as lost) and the next grant gets a higher fence. Recorded in the
   * audit stream with `by` and `reason`. A resource that checks fences refuses the old holder's
   * late writes; one that does not is not protected from it.
   */
  async break(name: string, options: BreakOptions): Promise<BreakResult> {
    checkName(name);
    const by = checkText(options?.by, "by", 1, 64);
    const reason = checkText(options?.reason ?? "", "reason", 0, 200);
    return await this.#observe(name, "break", async () => {
      const keys = [...this.#leaseKeys(name), this.#auditKey()];
      const reply = await this.#run(BREAK, keys, [this.#fenceWindowMs, name, by, reason]);
      if (integers(BREAK, reply, 1)[0] !== 1) return { broken: false };
      return { broken: true, fence: integers(BREAK, reply, 2)[1]! };
    });
  }

  /** The latest breaks under this prefix, newest first (the stream keeps the last 1000). */
  async audit(options: { limit?: number } = {}): Promise<AuditEntry[]> {
    const limit = options.limit ?? 100;
    if (!Number.isInteger(limit) || limit < 1 || limit > AUDIT_LENGTH) {
      throw new RangeError(`limit must be an integer from 1 to ${AUDIT_LENGTH}`);
    }
    const reply = await this.#observe(
      "",
      "audit",
      () => this.#run(READ_AUDIT, [this.#auditKey()], [limit]),
    );
    return (Array.isArray(reply) ? reply : []).map(toAuditEntry);
  }

  /** Runs `fn` while holding `name`; see {@linkcode withLock}. */
  withLock<T>(
    name: string,
    options: WithLockOptions,
    fn: (lease: Lease, signal: AbortSignal) => Promise<T> | T,
  ): Promise<T> {
    const started = performance.now();
    return withLock(this, name, options, fn, (lease, error) =>
      this.#emit({
        type: "lost",
        name,
        fence: lease.fence,
        reason: error.message,
        ...this.#timing(started),
      }));
  }

  // The name sits in a hash tag so all keys of a lock share a cluster slot.
  #keys(name: string): [string, string, string] {
    const base = `${this.#prefix}:lock:{${name}}`;
    return [base, `${base}:queue`, `${base}:tickets`];
  }

  #auditKey(): string {
    return `${this.#prefix}:audit`;
  }

  #leaseKeys(name: string): string[] {
    return [this.#keys(name)[0], ...this.#statsKeys];
  }

  #needStats(what: string): void {
    if (this.#statsKeys.length === 0) {
      throw new TypeError(`${what}() needs stats on (new Locks(redis, { stats: true }))`);
    }
  }
}

function toInfo(name: string, reply: unknown): LockInfo {
  if (integers(INSPECT, reply, 1)[0] !== 1) return { name, held: false };
  const [, fence, ttlMs, now, waiters] = integers(INSPECT, reply, 5) as number[];
  const meta = parseJsonText((reply as unknown[])[5]);
  return {
    name,
    held: true,
    fence: fence!,
    ttlMs: ttlMs!,
    expiresAt: now! + ttlMs!,
    waiters: waiters!,
    ...(meta && { meta }),
  };
}

// XREVRANGE's entry: [id, [field, value, ...]].
function toAuditEntry(raw: unknown): AuditEntry {
  const [id, pairs] = Array.isArray(raw) ? raw : [];
  const fields = new Map<string, string>();
  const list = Array.isArray(pairs) ? pairs : [];
  for (let i = 0; i + 1 < list.length; i += 2) fields.set(String(list[i]), String(list[i + 1]));
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
  if (typeof value !== "string") throw new TypeError(`${what} must be a string`);
  if (value.length < min || value.length > max || !/^[\x20-\x7e]*$/.test(value)) {
    throw new RangeError(`${what} must be ${min}–${max} printable ASCII characters`);
  }
  return value;
}

// The acquire script's position when the queue was full.
const QUEUE_FULL = -2;

function toRenewal(name: string, token: string, reply: unknown): RenewResult {
  if (integers(RENEW, reply, 1)[0] !== 1) return { renewed: false };
  return { renewed: true, lease: toLease(name, token, RENEW, reply) };
}

export function toLease(name: string, token: string, script: Script, reply: unknown): Lease {
  const [, fence, ttlMs, serverTime] = integers(script, reply, 4) as [
    number,
    number,
    number,
    number,
  ];
  return { name, token, fence, ttlMs, expiresAt: serverTime + ttlMs, serverTime };
}

function checkLease(lease: LeaseRef): LeaseRef {
  if (typeof lease !== "object" || lease === null) {
    throw new TypeError("Expected a lease returned by acquire or renew");
  }
  checkName(lease.name);
  checkToken(lease.token);
  if (lease.fence !== undefined && !(Number.isSafeInteger(lease.fence) && lease.fence > 0)) {
    throw new RangeError("The lease's fence must be a positive integer");
  }
  return lease;
}

// The fence as the release script takes it: '' when the caller has only name and token.
function fenceArg(lease: LeaseRef): string {
  return lease.fence === undefined ? "" : String(lease.fence);
}
