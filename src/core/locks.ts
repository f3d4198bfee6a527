import { sleep } from "./_backoff.ts";
import {
  checkRedis,
  checkTimeout,
  integers,
  keyLockingFor,
  parseJsonText,
  type RedisLike,
  type RunOptions,
  runScript,
  runScripts,
} from "./_runner.ts";
import { noteSentAt } from "./_granted.ts";
import { leaseKind } from "./_lease.ts";
import { EdgelockError } from "./errors.ts";
import {
  checkDuration,
  checkHold,
  checkHoldId,
  checkLockName,
  checkLockNames,
  checkMeta,
  checkMode,
  checkPrefix,
  checkSignal,
  checkToken,
  NAME_PREFIX_PATTERN,
  newToken,
} from "./_validate.ts";
import { ACQUIRE_SHARED } from "./shared_scripts.ts";
import { ACQUIRE_ALL } from "./multi_scripts.ts";
import {
  ACQUIRE,
  AUDIT_LENGTH,
  BREAK,
  FENCE_GRACE_MS,
  INSPECT,
  LEAVE_QUEUE,
  LIST,
  MAX_HOLDS,
  READ_AUDIT,
  READ_STATS,
  RELEASE,
  RENEW,
} from "./scripts.ts";
import { type Script } from "./_lua.ts";
import { type Stats, toStats } from "./stats.ts";
import { KeySpace } from "./_keys.ts";
import type {
  AcquireAllResult,
  AcquireOptions,
  AcquireResult,
  AuditEntry,
  BreakOptions,
  BreakResult,
  Lease,
  LeaseOptions,
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
import { withLock, withLocks } from "./with_lock.ts";

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
   * Lay the keys out for a Redis Cluster: every script's keys, stats included, in one slot, the
   * names spread over 64 slots (see the README). Choose it once per prefix: the two layouts do not
   * see each other's locks. @default false
   */
  cluster?: boolean;
  /**
   * Send the scripts with Upstash's `allow-key-locking` flag, so Upstash locks only each script's
   * keys and scripts on different names run in parallel. @default on for an Upstash database
   * (`*.upstash.io`), off otherwise (plain Redis refuses the flag)
   */
  keyLocking?: boolean;
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
  readonly #keySpace: KeySpace;
  readonly #maxWaiters: number;
  readonly #options: RunOptions;
  readonly #fenceWindowMs: number;
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
      cluster = false,
      keyLocking,
      onEvent,
    }: LocksOptions = {},
  ) {
    checkRedis(redis, "Locks");
    checkPrefix(prefix);
    if (!Number.isInteger(maxWaiters) || maxWaiters < 1 || maxWaiters > 1000) {
      throw new RangeError("maxWaiters must be an integer from 1 to 1000");
    }
    this.#redis = redis;
    this.#keySpace = new KeySpace(prefix, stats, cluster);
    this.#maxWaiters = maxWaiters;
    this.#options = {
      timeoutMs: checkTimeout(timeoutMs),
      keyLocking: keyLockingFor(redis, keyLocking),
    };
    this.#fenceWindowMs = checkDuration(fenceWindowMs, "fenceWindowMs", FENCE_GRACE_MS);
    if (onEvent !== undefined && typeof onEvent !== "function") {
      throw new TypeError("onEvent must be a function");
    }
    this.#onEvent = onEvent;
  }

  #run(script: Script, keys: string[], args: (string | number)[]): Promise<unknown> {
    return runScript(this.#redis, script, keys, args, this.#options);
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
      if (error instanceof EdgelockError && !CALLER_ERRORS.has(error.code)) {
        this.#emit({ type: "error", name, operation, error, ...this.#timing(started) });
      }
      throw error;
    }
  }

  #timing(started: number): { at: number; durationMs: number } {
    return { at: Date.now(), durationMs: performance.now() - started };
  }

  /**
   * Acquires `name`: exclusively (the default), `shared` (a read-write lock's reader), or
   * `permits` of a semaphore of `limit`. When it is busy and `waitMs` > 0, waits in a fair FIFO
   * queue, looking again when the server expects its turn (from recent hold times), never past
   * the holder's TTL. Throws `mode_mismatch` or `limit_mismatch` when the name is held in
   * another mode or with another limit.
   */
  async acquire(name: string, options: AcquireOptions = {}): Promise<AcquireResult> {
    checkLockName(name);
    const { ttlMs, waitMs, token, meta, signal } = checkLeaseOptions(options);
    const { mode, limit, permits } = checkMode(options);
    const hold = checkHold(options);
    const [record, queue, tickets, holders, marks] = this.#keys(name);
    const kind = mode === "exclusive" ? {} : { mode, ...(limit > 0 && { limit, permits }) };
    const call: Attempt<Lease> = mode === "exclusive"
      ? {
        script: ACQUIRE,
        keys: [record, queue, tickets, marks, ...this.#stats(name)],
        args: (ticketMs, waitedMs, waiting) => [
          ...this.#acquireArgs(token, ttlMs, meta, ticketMs),
          name,
          waitedMs,
          waiting,
          hold,
        ],
        members: [token],
        grant: (reply) => ({
          ...toLease(name, token, ACQUIRE, reply),
          ...holdOf(reply, hold),
        }),
      }
      : {
        script: ACQUIRE_SHARED,
        keys: [record, queue, tickets, holders, marks, ...this.#stats(name)],
        args: (ticketMs, waitedMs, waiting) => [
          ...this.#acquireArgs(token, ttlMs, meta, ticketMs),
          name,
          waitedMs,
          waiting,
          limit,
          permits,
          hold,
        ],
        members: [`${token}~${limit > 0 ? permits : "s"}`],
        grant: (reply) => ({
          ...toLease(name, token, ACQUIRE_SHARED, reply),
          ...kind,
          ...holdOf(reply, hold),
        }),
      };
    return await this.#observe(name, "acquire", async () => {
      const result = await this.#attempt(name, [name], call, waitMs, signal);
      return result.acquired ? { acquired: true, lease: result.granted } : result;
    });
  }

  /**
   * Acquires every name exclusively, all or nothing, in one script per attempt (up to 32 names,
   * one token, one fence per name): a multi-name lock. Waits like `acquire`, in every name's
   * queue at once, so overlapping sets never deadlock (see `./multi_scripts.ts`). Any names on
   * one Redis (Upstash included); in the cluster layout all names must share a slot: start each
   * with the same `{group}`, e.g. `{bank}acct:1` and `{bank}acct:2`. Renew and release the leases
   * one by one or with `renewMany`.
   */
  async acquireAll(
    names: readonly string[],
    options: LeaseOptions = {},
  ): Promise<AcquireAllResult> {
    checkLockNames(names, this.#keySpace.cluster);
    const { ttlMs, waitMs, token, meta, signal } = checkLeaseOptions(options);
    const call: Attempt<Lease[]> = {
      script: ACQUIRE_ALL,
      keys: [
        ...names.flatMap((name) => this.#keys(name)).filter((_, i) => i % 5 !== 3), // no holders
        ...this.#stats(names[0]!),
      ],
      args: (ticketMs, waitedMs, waiting) => [
        ...this.#acquireArgs(token, ttlMs, meta, ticketMs),
        names.length,
        waitedMs,
        waiting,
        ...names,
      ],
      members: names.map(() => token),
      grant: (reply) => {
        const [, now, ttl, ...fences] = integers(ACQUIRE_ALL, reply, 3 + names.length);
        return names.map((name, i) => ({
          name,
          token,
          fence: fences[i]!,
          ttlMs: ttl!,
          expiresAt: now! + ttl!,
          serverTime: now!,
        }));
      },
    };
    const label = names.join(",");
    return await this.#observe(label, "acquire", async () => {
      const result = await this.#attempt(label, names, call, waitMs, signal);
      return result.acquired ? { acquired: true, leases: result.granted } : result;
    });
  }

  #acquireArgs(token: string, ttlMs: number, meta: string, ticketMs: number): (string | number)[] {
    return [token, ttlMs, meta, this.#fenceWindowMs, ticketMs, this.#maxWaiters];
  }

  // The waiting loop of every acquire: one script call per look.
  async #attempt<T extends Lease | Lease[]>(
    label: string,
    names: readonly string[],
    call: Attempt<T>,
    waitMs: number,
    signal: AbortSignal | undefined,
  ): Promise<{ acquired: true; granted: T } | Exclude<AcquireResult, { acquired: true }>> {
    const started = performance.now();
    const deadline = started + waitMs;
    const waiting = waitMs > 0 ? "1" : "0";
    const outcome = (outcome: (LockEvent & { type: "acquire" })["outcome"], fence?: number) =>
      this.#emit({
        type: "acquire",
        name: label,
        outcome,
        ...(fence !== undefined && { fence }),
        waitedMs: performance.now() - started,
        ...this.#timing(started),
      });
    let queued = false;
    const leave = (why: string) => queued ? this.#leaveQueues(names, call.members, why) : undefined;

    for (;;) {
      if (signal?.aborted) {
        await leave("aborted");
        outcome("aborted");
        signal.throwIfAborted();
      }
      const left = deadline - performance.now();
      // A waiter holds a FIFO ticket that outlives its next look by a margin.
      const ticketMs = left > 0 ? Math.ceil(Math.min(left, MAX_POLL_MS) + TICKET_MARGIN_MS) : 0;
      const waitedMs = Math.round(performance.now() - started);
      queued ||= ticketMs > 0;
      const sentAt = performance.now();
      const reply = await this.#run(call.script, call.keys, call.args(ticketMs, waitedMs, waiting));
      const [status, code] = integers(call.script, reply, 2);
      if (status === 1) {
        const granted = call.grant(reply);
        for (const lease of [granted].flat()) noteSentAt(lease, sentAt);
        outcome("granted", [granted].flat()[0]!.fence);
        return { acquired: true, granted };
      }
      if (status === MISMATCH) { // the caller's mistake, not an outcome: no acquire event
        await leave("");
        throw mismatchError(label, code!);
      }
      const [, hint, now, position, pttl] = integers(call.script, reply, 5);
      const retryAfterMs = Math.max(1, hint!);
      const busy = {
        acquired: false as const,
        retryAfterMs,
        ...(pttl! > 0 && { lockExpiresAt: now! + pttl! }),
      };
      if (position === QUEUE_FULL) {
        await leave("");
        outcome("queue_full");
        return { ...busy, reason: "queue_full" };
      }
      const remaining = deadline - performance.now();
      if (remaining <= 0) {
        await leave("timeout");
        outcome(queued ? "timeout" : "busy");
        return { ...busy, reason: "busy" };
      }
      if (signal?.aborted) continue;
      this.#emit({
        type: "wait",
        name: label,
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
  // `outcome` ('timeout', 'aborted' or '') is counted in the stats, once.
  async #leaveQueues(names: readonly string[], members: string[], outcome: string): Promise<void> {
    const calls = names.map((name, i) => {
      const [, queue, tickets] = this.#keys(name);
      return {
        keys: [queue, tickets, ...(i === 0 ? this.#keySpace.statsHash(name) : [])],
        args: [members[i]!, i === 0 ? outcome : ""],
      };
    });
    await (calls.length === 1
      ? this.#run(LEAVE_QUEUE, calls[0]!.keys, calls[0]!.args)
      : runScripts(this.#redis, LEAVE_QUEUE, calls, this.#options)).catch(() => {});
  }

  /** Extends a lease still held by its token; the fence stays the same. */
  async renew(lease: LeaseRef, options: RenewOptions = {}): Promise<RenewResult> {
    const { name, token } = checkLease(lease);
    const ttlMs = checkDuration(options.ttlMs, "ttlMs", lease.ttlMs ?? DEFAULT_TTL_MS);
    return await this.#observe(name, "renew", async () => {
      const started = performance.now();
      const reply = await this.#run(
        RENEW,
        this.#renewKeys(name),
        this.#renewArgs(name, token, ttlMs),
      );
      return this.#renewed(lease, reply, started);
    });
  }

  #renewArgs(name: string, token: string, ttlMs: number): (string | number)[] {
    return [token, ttlMs, this.#fenceWindowMs, name];
  }

  #renewed(lease: LeaseRef, reply: unknown, started: number): RenewResult {
    const { name } = lease;
    const result = toRenewal(lease, reply);
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
      keys: this.#renewKeys(name),
      args: this.#renewArgs(name, token, ttlMs),
    }));
    const started = performance.now();
    const replies = await this.#observe(
      refs[0]!.name,
      "renew",
      () => runScripts(this.#redis, RENEW, calls, this.#options),
    );
    return refs.map((ref, i) => this.#renewed(ref, replies[i], started));
  }

  /**
   * Frees a lease. `false` when its token no longer held the lock (expired or taken over);
   * a retry of a release that went through answers `true` again.
   */
  async release(lease: LeaseRef): Promise<boolean> {
    const { name, token } = checkLease(lease);
    const args = [token, this.#fenceWindowMs, fenceArg(lease), name, lease.hold ?? ""];
    return await this.#observe(name, "release", async () => {
      const started = performance.now();
      const [record, , , holders, marks] = this.#keys(name);
      const keys = [record, holders, marks, ...this.#stats(name)];
      const reply = await this.#run(RELEASE, keys, args);
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
    checkLockName(name);
    return await this.#observe(name, "inspect", async () => {
      return toInfo(name, await this.#run(INSPECT, this.#inspectKeys(name), []));
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
      throw new RangeError("prefix must be up to 200 characters of A-Z a-z 0-9 . _ : - { }");
    }
    if (cursor !== "") checkLockName(cursor);
    if (!Number.isInteger(limit) || limit < 1 || limit > MAX_BATCH) {
      throw new RangeError(`limit must be an integer from 1 to ${MAX_BATCH}`);
    }
    return await this.#observe(prefix, "list", async () => {
      const replies = await this.#perBucket(LIST, (base) => [`${base}:held`, `${base}:held:ends`], [
        prefix,
        cursor,
        limit,
      ]);
      const { found, next } = mergePages(replies, limit);
      const calls = found.map((name) => ({ keys: this.#inspectKeys(name), args: [] }));
      const infos = calls.length > 0
        ? await runScripts(this.#redis, INSPECT, calls, this.#options)
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
      const replies = await this.#perBucket(
        READ_STATS,
        (base) => [`${base}:stats`, `${base}:held:ends`],
        [],
      );
      let [now, held] = [0, 0];
      for (const reply of replies) {
        const [bucketNow, bucketHeld] = integers(READ_STATS, reply, 2);
        [now, held] = [Math.max(now, bucketNow!), held + bucketHeld!];
      }
      return toStats(replies.map((reply) => (reply as unknown[]).slice(2)), now, held);
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
    const by = checkText(options?.by, "by", 1, 64);
    const reason = checkText(options?.reason ?? "", "reason", 0, 200);
    const id = options.id === undefined ? "" : checkHoldId(options.id, "The break id");
    return await this.#observe(name, "break", async () => {
      const [record, , , holders, marks] = this.#keys(name);
      const keys = [record, holders, marks, ...this.#stats(name), this.#auditKey(name)];
      const reply = await this.#run(BREAK, keys, [this.#fenceWindowMs, name, by, reason, id]);
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
    const replies = await this.#observe(
      "",
      "audit",
      () => this.#perBucket(READ_AUDIT, (base) => [`${base}:audit`], [limit]),
    );
    return replies.flatMap((reply) => Array.isArray(reply) ? reply : []).map(toAuditEntry)
      .sort(newestFirst).slice(0, limit);
  }

  // One script per bucket (the prefix alone in the single layout), in one request.
  #perBucket(
    script: Script,
    keys: (base: string) => string[],
    args: (string | number)[],
  ): Promise<unknown[]> {
    const bases = this.#keySpace.bases();
    if (bases.length === 1) return this.#run(script, keys(bases[0]!), args).then((r) => [r]);
    const calls = bases.map((base) => ({ keys: keys(base), args }));
    return runScripts(this.#redis, script, calls, this.#options);
  }

  /** Runs `fn` while holding all of `names`; see {@linkcode withLocks}. */
  withLocks<T>(
    names: readonly string[],
    options: LeaseOptions,
    fn: (leases: Lease[], signal: AbortSignal) => Promise<T> | T,
  ): Promise<T> {
    return withLocks(this, names, options, fn);
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

  // The name sits in a hash tag so all keys of a lock share a cluster slot (see slotTag): the
  // record, the queue, its tickets, the shared holders and their last releases.
  #keys(name: string): [string, string, string, string, string] {
    const base = `${this.#keySpace.base(name)}:lock:{${name}}`;
    return [base, `${base}:queue`, `${base}:tickets`, `${base}:holders`, `${base}:released`];
  }

  #renewKeys(name: string): string[] {
    const [record, , , holders] = this.#keys(name);
    return [record, holders, ...this.#stats(name)];
  }

  #inspectKeys(name: string): string[] {
    const [record, , tickets, holders] = this.#keys(name);
    return [record, tickets, holders];
  }

  // The stats hash and the held index of the name's bucket; none with stats off.
  #stats(name: string): string[] {
    return this.#keySpace.statsAndIndex(name);
  }

  #auditKey(name: string): string {
    return `${this.#keySpace.base(name)}:audit`;
  }

  #needStats(what: string): void {
    if (!this.#keySpace.stats) {
      throw new TypeError(`${what}() needs stats on (new Locks(redis, { stats: true }))`);
    }
  }
}

function toInfo(name: string, reply: unknown): LockInfo {
  if (integers(INSPECT, reply, 1)[0] !== 1) return { name, held: false };
  const [, fence, ttlMs, now, waiters] = integers(INSPECT, reply, 5) as number[];
  const [rawMeta, mode, holders, permits, limit] = (reply as unknown[]).slice(5);
  const meta = parseJsonText(rawMeta);
  return {
    name,
    held: true,
    fence: fence!,
    ttlMs: ttlMs!,
    expiresAt: now! + ttlMs!,
    waiters: waiters!,
    ...(meta && { meta }),
    mode: mode === "shared" || mode === "semaphore" ? mode : "exclusive",
    holders: Number(holders),
    permits: Number(permits),
    ...(mode === "semaphore" && { limit: Number(limit) }),
  };
}

// XREVRANGE's entry: [id, [field, value, ...]].
/**
 * One page of held names from every bucket's LIST reply (`{nowMs, next, name…}`). Each bucket
 * lists its first live names after the cursor and, when it has more, where it stopped looking:
 * the page is the names up to the earliest stop, at most `limit` of them, sorted.
 */
function mergePages(replies: unknown[], limit: number): { found: string[]; next?: string } {
  const pages = replies.map((reply) => Array.isArray(reply) ? reply.map(String) : []);
  const stop = pages.map(([, next]) => next ?? "").filter((next) => next !== "").sort()[0];
  const found = pages.flatMap(([, , ...names]) => names).sort()
    .filter((name) => stop === undefined || name <= stop);
  if (found.length > limit) return { found: found.slice(0, limit), next: found[limit - 1]! };
  return { found, ...(stop !== undefined && { next: stop }) };
}

// Stream ids are `<ms>-<seq>`; across buckets (cluster nodes) the clocks may differ a little.
function newestFirst(a: AuditEntry, b: AuditEntry): number {
  const [am, as] = a.id.split("-").map(Number) as [number, number];
  const [bm, bs] = b.id.split("-").map(Number) as [number, number];
  return bm - am || bs - as;
}

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

// A renewed lease keeps what the acquire told of it: mode, limit, permits, hold count.
function toRenewal(ref: LeaseRef, reply: unknown): RenewResult {
  if (integers(RENEW, reply, 1)[0] !== 1) return { renewed: false };
  const kind = leaseKind(ref as Partial<Lease>);
  return {
    renewed: true,
    lease: {
      ...toLease(ref.name, ref.token, RENEW, reply),
      ...kind,
      ...(kind.holdCount !== undefined && { holdCount: integers(RENEW, reply, 5)[4]! }),
    },
  };
}

// A reentrant acquire's hold: its id, for its release, and the lease's hold count.
function holdOf(reply: unknown, hold: string): { hold?: string; holdCount?: number } {
  return hold === "" ? {} : { hold, holdCount: (reply as number[])[4]! };
}

// The acquire scripts' `{-1, code}`: the name is held in another mode (1), as a semaphore with
// another limit (2), by this token with MAX_HOLDS holds already (3) or with other permits (4), or
// reentrant by this token, which a plain acquire would not count (5).
function mismatchError(name: string, code: number): EdgelockError {
  switch (code) {
    case 2:
      return new EdgelockError(
        "limit_mismatch",
        `Lock "${name}" is held as a semaphore with another limit`,
      );
    case 3:
      return new EdgelockError(
        "hold_limit",
        `Cannot acquire lock "${name}" again: this token holds it ${MAX_HOLDS} times already`,
      );
    case 4:
      return new EdgelockError(
        "permits_mismatch",
        `This token holds lock "${name}" with another number of permits: release that lease first`,
      );
    case 5:
      return new EdgelockError(
        "mode_mismatch",
        `This token holds lock "${name}" reentrant: acquire it again with reentrant: true`,
      );
    default:
      return new EdgelockError("mode_mismatch", `Lock "${name}" is held in another mode`);
  }
}

// Errors of the caller's making, which are no `error` event: Redis did not fail.
const CALLER_ERRORS = new Set([
  "invalid_request",
  "mode_mismatch",
  "limit_mismatch",
  "hold_limit",
  "permits_mismatch",
]);

// The acquire scripts' first reply field when the name is held in another mode or limit.
const MISMATCH = -1;

/** One acquire's script call, the same at each look but for the ticket and the time waited. */
interface Attempt<T> {
  script: Script;
  keys: string[];
  args(ticketMs: number, waitedMs: number, waiting: string): (string | number)[];
  /** What the caller is in each name's queue, for leaving it. */
  members: string[];
  grant(reply: unknown): T;
}

function checkLeaseOptions(options: LeaseOptions) {
  return {
    ttlMs: checkDuration(options.ttlMs, "ttlMs", DEFAULT_TTL_MS),
    waitMs: checkDuration(options.waitMs, "waitMs", 0),
    token: options.token === undefined ? newToken() : checkToken(options.token),
    meta: checkMeta(options.meta),
    signal: checkSignal(options.signal),
  };
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
  checkLockName(lease.name);
  checkToken(lease.token);
  if (lease.hold !== undefined) checkHoldId(lease.hold);
  if (lease.fence !== undefined && !(Number.isSafeInteger(lease.fence) && lease.fence > 0)) {
    throw new RangeError("The lease's fence must be a positive integer");
  }
  return lease;
}

// The fence as the release script takes it: '' when the caller has only name and token.
function fenceArg(lease: LeaseRef): string {
  return lease.fence === undefined ? "" : String(lease.fence);
}
