import { LockContext, type LockOpsOptions, timing } from "./_context.ts";
import { leaseKind } from "./_lease.ts";
import { EdgelockError } from "./errors.ts";
import { parseJsonText, type RedisLike } from "./_runner.ts";
import {
  ACQUIRE_OPTIONS,
  checkDuration,
  checkFence,
  checkHold,
  checkHoldId,
  checkLeaseOptions,
  checkLockName,
  checkLockNames,
  checkMode,
  checkNext,
  checkOptions,
  checkToken,
  DEFAULT_MAX_WAITERS,
  DEFAULT_TTL_MS,
  LEASE_OPTIONS,
  MAX_BATCH,
  newToken,
  renewTtl,
} from "./_validate.ts";
import { type Attempt, handOver, handOverAllCall, type Look, multiHead, waitFor } from "./_wait.ts";
import type { Script } from "./lua/_define.ts";
import { ACQUIRE } from "./lua/acquire.ts";
import { ACQUIRE_ALL } from "./lua/acquire_all.ts";
import { ACQUIRE_SHARED } from "./lua/acquire_shared.ts";
import { HAND_OVER_ALL } from "./lua/hand_over_all.ts";
import { INSPECT } from "./lua/inspect.ts";
import { RELEASE } from "./lua/release.ts";
import { RENEW } from "./lua/renew.ts";
import {
  decodeAcquire,
  decodeAcquireAll,
  decodeInspect,
  decodeRelease,
  decodeRenew,
  type Granted,
} from "./lua/replies.ts";
import type {
  AcquireAllResult,
  AcquireOptions,
  AcquireResult,
  Lease,
  LeaseOptions,
  LeaseRef,
  LockClient,
  LockInfo,
  RenewOptions,
  RenewResult,
  WithLockOptions,
} from "./types.ts";
import { withLock, withLocks } from "./with_lock.ts";
import { InvalidRange, InvalidType } from "./_invalid.ts";

export { DEFAULT_MAX_WAITERS, DEFAULT_TTL_MS, MAX_BATCH };

// How many leases' hand-off hints a Locks keeps (a lease not released in time loses its hint).
const HINTS = 1000;
// The longest names (comma-joined) of a multi-name waiter that is handed its names: its offer
// carries them in each queue. Longer ones poll.
const MAX_OFFERED_NAMES = 1000;

/** Options for {@linkcode Locks}. */
export interface LocksOptions extends LockOpsOptions {
  /**
   * The most waiters one name queues, 1–1000; a waiter beyond them is told `queue_full`.
   * @default 128
   */
  maxWaiters?: number;
}

/**
 * Distributed locks on Redis over REST: each acquire, renew, release and inspect is one script
 * in one request. The operator's acts (list, stats, break, audit) are {@linkcode LockOps}'.
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
  readonly #context: LockContext;
  readonly #maxWaiters: number;
  readonly #hints = new Map<string, { fence: number; next: string }>();

  /** Locks on `redis` (an `@upstash/redis` client), their keys under `prefix`. */
  constructor(redis: RedisLike, options: LocksOptions = {}) {
    this.#context = new LockContext(redis, "Locks", options, ["maxWaiters"]);
    const { maxWaiters = DEFAULT_MAX_WAITERS } = options;
    if (!Number.isInteger(maxWaiters) || maxWaiters < 1 || maxWaiters > 1000) {
      throw new InvalidRange("maxWaiters must be an integer from 1 to 1000");
    }
    this.#maxWaiters = maxWaiters;
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
    checkOptions(options, ACQUIRE_OPTIONS, "acquire()");
    const lease = checkLeaseOptions(options);
    const attempt = this.#acquireAttempt(name, lease, checkMode(options), checkHold(options));
    return await this.#context.observe(name, "acquire", async () => {
      const result = await waitFor(this.#context, name, [name], attempt, lease);
      return result.acquired ? { acquired: true, lease: result.granted } : result;
    });
  }

  #acquireAttempt(
    name: string,
    lease: ReturnType<typeof checkLeaseOptions>,
    { mode, limit, permits }: ReturnType<typeof checkMode>,
    hold: string,
  ): Attempt<Lease> {
    const { lockKey, queueKey, ticketsKey, holdersKey, marksKey, offersKey, readersKey } = this
      .#context.keys.lock(name);
    const stats = this.#context.keys.statsKeys(name);
    const keys = { lockKey, queueKey, ticketsKey, marksKey, ...stats };
    const common = (look: Look) => ({
      ...this.#acquireArgs(lease, look.ticketMs),
      name,
      waitedMs: look.waitedMs,
      waiting: look.waiting,
      hold,
    });
    const withHold = (granted: Lease, holdCount: number): Lease =>
      hold === "" ? granted : { ...granted, hold, holdCount };
    const granted = (script: Script, extra: Partial<Lease>) => (reply: unknown) => {
      const decoded = decodeAcquire(script, reply);
      if (decoded.status !== "granted") return decoded;
      const granted = this.#hinted(
        { ...toLease(name, lease.token, decoded), ...extra },
        decoded.next,
      );
      return { status: "granted" as const, granted: withHold(granted, decoded.holdCount) };
    };
    // A waiter that blocks between looks (exclusive, or a semaphore's) has a wake key of its own,
    // or the one a look gave it (a lease's successor key, see `wakeFor`): each look declares it.
    const wakeId = `w${newToken().slice(0, 16)}`;
    const wakeKey = this.#context.keys.wake(name, wakeId);
    const lookKey = (look: Look) => this.#context.keys.wake(name, look.wakeId || wakeId);
    const wake = (extra: Partial<Lease>) => ({
      key: wakeKey,
      id: wakeId,
      lease: (grant: { fence: number; ttlMs: number; now: number; next: string }) => {
        const handed = this.#hinted({ ...toLease(name, lease.token, grant), ...extra }, grant.next);
        return withHold(handed, 1);
      },
    });
    if (mode === "exclusive") {
      return {
        script: ACQUIRE,
        call: (look) =>
          ACQUIRE.call({
            keys: { ...keys, offersKey, wakeKey: lookKey(look) },
            args: { ...common(look), wakeId: look.wakeId },
          }),
        members: [lease.token],
        decode: granted(ACQUIRE, {}),
        wake: wake({}),
      };
    }
    const kind = { mode, ...(limit > 0 && { limit, permits }) };
    return {
      script: ACQUIRE_SHARED,
      call: (look) =>
        ACQUIRE_SHARED.call({
          keys: { ...keys, holdersKey, offersKey, wakeKey: lookKey(look), readersKey },
          args: { ...common(look), limit, permits, wakeId: look.wakeId },
        }),
      members: [`${lease.token}~${limit > 0 ? permits : "s"}`],
      decode: granted(ACQUIRE_SHARED, kind),
      // A semaphore's waiter is handed its permits; a reader its lease on its wake key or in a ring.
      ...(limit > 0
        ? { wake: wake(kind) }
        : { bell: { ...wake(kind), key: readersKey, own: wakeKey, hold } }),
    };
  }

  // The next holders' wake ids as a lease's grant told them, for its release's hand-off: in the
  // lease (its `next`), and here by name and token with the lease's fence, the last HINTS of them,
  // for a release given less than the lease. A release without them hands over in a second
  // request.
  #hinted(lease: Lease, next: string): Lease {
    const key = `${lease.name}\n${lease.token}`;
    this.#hints.delete(key);
    if (next === "") return lease;
    this.#hints.set(key, { fence: lease.fence, next });
    if (this.#hints.size > HINTS) this.#hints.delete(this.#hints.keys().next().value!);
    return { ...lease, next };
  }

  /**
   * Acquires every name exclusively, all or nothing, in one script per attempt (up to 32 names,
   * one token, one fence per name): a multi-name lock. Waits like `acquire`, in every name's
   * queue at once, so overlapping sets never deadlock (see `./lua/acquire_all.ts`). Any names on
   * one Redis (Upstash included); in the cluster layout all names must share a slot: start each
   * with the same `{group}`, e.g. `{bank}acct:1` and `{bank}acct:2`. Renew and release the leases
   * one by one or with `renewMany`.
   */
  async acquireAll(
    names: readonly string[],
    options: LeaseOptions = {},
  ): Promise<AcquireAllResult> {
    checkLockNames(names, this.#context.keys.cluster);
    checkOptions(options, LEASE_OPTIONS, "acquireAll()");
    const lease = checkLeaseOptions(options);
    const each = names.map((name) => this.#context.keys.lock(name));
    // Each lease keeps its name's grant hint (`hints`, in order), for its release's hand-off.
    const leases = (
      { fences, ttlMs, now, hints }: {
        fences: number[];
        ttlMs: number;
        now: number;
        hints: string[];
      },
    ) =>
      names.map((name, i) => {
        const granted = toLease(name, lease.token, { fence: fences[i]!, ttlMs, now });
        return this.#hinted(granted, hints[i] ?? "");
      });
    // A waiter that blocks has a wake key beside its first name's keys; its offer in every queue
    // carries its names, so one whose names are long polls instead.
    const wakeId = `w${newToken().slice(0, 16)}`;
    const wakeKey = this.#context.keys.wake(names[0]!, wakeId);
    const attempt: Attempt<Lease[]> = {
      script: ACQUIRE_ALL,
      call: (look) =>
        ACQUIRE_ALL.call({
          each,
          keys: { wakeKey, ...this.#context.keys.statsKeys(names[0]!) },
          args: {
            ...this.#acquireArgs(lease, look.ticketMs),
            n: names.length,
            waitedMs: look.waitedMs,
            waiting: look.waiting,
            wakeId: look.wakeId,
          },
          rest: names,
        }),
      members: names.map(() => lease.token),
      decode: (reply) => {
        const decoded = decodeAcquireAll(ACQUIRE_ALL, reply, names.length);
        if (decoded.status !== "granted") return decoded;
        return { status: "granted", granted: leases(decoded) };
      },
      ...(names.join(",").length <= MAX_OFFERED_NAMES && {
        wake: {
          key: wakeKey,
          id: wakeId,
          lease: ({ fence, fences = names.length === 1 ? [fence] : [], ttlMs, now, next }) =>
            fences.length === names.length
              ? leases({ fences, ttlMs, now, hints: next.split(";") })
              : undefined,
        },
      }),
    };
    const label = names.join(",");
    return await this.#context.observe(label, "acquire", async () => {
      const result = await waitFor(this.#context, label, names, attempt, lease);
      return result.acquired ? { acquired: true, leases: result.granted } : result;
    });
  }

  #acquireArgs(
    { token, ttlMs, meta, fresh }: { token: string; ttlMs: number; meta: string; fresh: boolean },
    ticketMs: number,
  ) {
    const graceMs = this.#context.fenceWindowMs;
    return { token, ttlMs, meta, graceMs, ticketMs, maxWaiters: this.#maxWaiters, fresh };
  }

  /** Extends a lease still held by its token; the fence stays the same. */
  async renew(lease: LeaseRef, options: RenewOptions = {}): Promise<RenewResult> {
    const { name } = checkLease(lease);
    checkOptions(options, ["ttlMs"], "renew()");
    const ttlMs = renewTtl(options.ttlMs, lease.ttlMs);
    return await this.#context.observe(name, "renew", async () => {
      const started = performance.now();
      const reply = await this.#context.run(RENEW, this.#renewCall(lease, ttlMs));
      return this.#renewed(lease, reply, started);
    });
  }

  /**
   * Renews up to 1000 leases in one request (one script per lease in one pipeline, so the names
   * may live in different Redis Cluster slots), each with `ttlMs` from now (default 10000).
   * Results come in the same order; the fence of each renewed lease stays the same.
   */
  async renewMany(leases: readonly LeaseRef[], options: RenewOptions = {}): Promise<RenewResult[]> {
    if (!Array.isArray(leases) || leases.length === 0 || leases.length > MAX_BATCH) {
      throw new InvalidRange(`renewMany takes 1 to ${MAX_BATCH} leases`);
    }
    checkOptions(options, ["ttlMs"], "renewMany()");
    const ttlMs = checkDuration(options.ttlMs, "ttlMs", DEFAULT_TTL_MS);
    const refs = Array.from(leases, checkLease); // a hole is a TypeError, not skipped
    const started = performance.now();
    const replies = await this.#context.observe(
      refs[0]!.name,
      "renew",
      () => this.#context.runMany(RENEW, refs.map((ref) => this.#renewCall(ref, ttlMs))),
    );
    return refs.map((ref, i) => this.#renewed(ref, replies[i], started));
  }

  // With the lease's fence, only that lease is renewed: never a later lease of the same token.
  // With a reentrant hold's id, only while that hold is held.
  #renewCall({ name, token, fence, hold }: LeaseRef, ttlMs: number) {
    const { lockKey, holdersKey } = this.#context.keys.lock(name);
    return RENEW.call({
      keys: { lockKey, holdersKey, ...this.#context.keys.statsKeys(name) },
      args: {
        token,
        ttlMs,
        graceMs: this.#context.fenceWindowMs,
        name,
        fence: fence?.toString() ?? "",
        hold: hold ?? "",
      },
    });
  }

  // A renewed lease tells its kind as Redis keeps it (mode, limit, permits; the hold count of a
  // reentrant one), keeps its hold when Redis counts it (the script checked), and who waited, when
  // it is the same lease.
  #renewed(ref: LeaseRef, reply: unknown, started: number): RenewResult {
    const decoded = decodeRenew(RENEW, reply);
    let result: RenewResult = { renewed: false };
    if (decoded.status !== "lost") {
      const { next } = leaseKind(ref as Partial<Lease>, decoded.fence);
      const lease = {
        ...toLease(ref.name, ref.token, decoded),
        ...decoded.kind,
        ...(decoded.reentrant && { holdCount: decoded.holdCount }),
        ...(decoded.reentrant && ref.hold !== undefined && { hold: ref.hold }),
        ...(next !== undefined && { next }),
      };
      result = { renewed: true, lease };
    }
    this.#context.emit({
      type: "renew",
      name: ref.name,
      outcome: result.renewed ? "renewed" : "lost",
      ...(result.renewed && { fence: result.lease.fence }),
      ...timing(started),
    });
    return result;
  }

  /**
   * Frees a lease. `false` when its token no longer held the lock (expired or taken over);
   * a retry of a release that went through answers `true` again. A reentrant lease ends one
   * hold per release, the one in `lease.hold`; without it, `mode_mismatch` (nothing ends).
   */
  async release(lease: LeaseRef): Promise<boolean> {
    const { name, token } = checkLease(lease);
    const keys = this.#context.keys;
    const { lockKey, holdersKey, marksKey, queueKey, ticketsKey, offersKey, readersKey } = keys
      .lock(name);
    // The grant's hint: the next waiters' wake keys, declared; or a multi-name waiter at the
    // head, handed its names by a second script in the same request, after the release.
    // This instance's for that very lease (its latest, for a reentrant lease's later holds), else
    // the lease's own; this instance's for the token when the caller gave no fence.
    const kept = this.#hints.get(`${name}\n${token}`);
    const hint = kept && kept.fence === lease.fence
      ? kept.next
      : lease.next ?? (kept && lease.fence === undefined ? kept.next : "");
    const waiter = multiHead(hint);
    const multi = waiter && handOverAllCall(this.#context, waiter, { name, token });
    // And the lease's successor key, `f<fence>`, which the first waiter to queue behind a lease
    // granted with no one waiting blocks on (see `wakeFor`): known to any caller with the fence.
    const hints = [
      ...(hint === "" || waiter ? [] : hint.split(",")),
      ...(lease.fence === undefined ? [] : [`f${lease.fence}`]),
    ];
    const call = RELEASE.call({
      keys: {
        lockKey,
        holdersKey,
        marksKey,
        queueKey,
        ticketsKey,
        offersKey,
        readersKey,
        ...keys.statsKeys(name),
      },
      each: hints.map((id) => ({ hintKey: keys.wake(name, id) })),
      args: {
        token,
        graceMs: this.#context.fenceWindowMs,
        fence: lease.fence === undefined ? "" : String(lease.fence),
        name,
        hold: lease.hold ?? "",
        n: hints.length,
      },
      rest: hints,
    });
    return await this.#context.observe(name, "release", async () => {
      const started = performance.now();
      const [reply, handedAll] = multi
        ? await this.#context.runMany(RELEASE, [call, { ...multi, script: HAND_OVER_ALL }])
        : [await this.#context.run(RELEASE, call)];
      const { released, head, ended, holdNeeded } = decodeRelease(RELEASE, reply);
      if (holdNeeded) {
        throw new EdgelockError(
          "mode_mismatch",
          `This token holds lock "${name}" reentrant: release each hold with its lease (its hold)`,
        );
      }
      if (ended) this.#hints.delete(`${name}\n${token}`); // a reentrant lease keeps it
      // The head blocks on a wake key this release could not name, or is a multi-name waiter
      // the script after it did not hand its names: hand over in a second step, unless another
      // lease holds another of its names (that lease's release hands over). The script answers
      // 0 when it ran before the release (whose source was loaded anew): this step then runs.
      const held = waiter && typeof handedAll === "number" && handedAll < 0
        ? waiter.names[-handedAll - 1]
        : undefined;
      if (head !== "" && !(head === hint && (handedAll === 1 || (held && held !== name)))) {
        await handOver(this.#context, name, head);
      }
      this.#context.emit({
        type: "release",
        name,
        outcome: released ? "released" : "lost",
        ...(lease.fence !== undefined && { fence: lease.fence }),
        ...timing(started),
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
    return await this.#context.observe(name, "inspect", async () => {
      return toInfo(name, await this.#context.run(INSPECT, inspectCall(this.#context, name)));
    });
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
      this.#context.emit({
        type: "lost",
        name,
        fence: lease.fence,
        reason: error.message,
        ...timing(started),
      }));
  }
}

/** The inspect script's call for `name`. */
export function inspectCall(context: LockContext, name: string) {
  const { lockKey, ticketsKey, holdersKey } = context.keys.lock(name);
  return INSPECT.call({ keys: { lockKey, ticketsKey, holdersKey }, args: {} });
}

/** What the inspect script told of `name`. */
export function toInfo(name: string, reply: unknown): LockInfo {
  const info = decodeInspect(INSPECT, reply);
  if (!info) return { name, held: false };
  const meta = parseJsonText(info.meta);
  return {
    name,
    held: true,
    fence: info.fence,
    ttlMs: info.ttlMs,
    expiresAt: info.now + info.ttlMs,
    waiters: info.waiters,
    ...(meta && { meta }),
    mode: info.mode === "shared" || info.mode === "semaphore" ? info.mode : "exclusive",
    holders: info.holders,
    permits: info.permits,
    ...(info.mode === "semaphore" && { limit: info.limit }),
  };
}

function toLease(
  name: string,
  token: string,
  { fence, ttlMs, now }: Pick<Granted, "fence" | "ttlMs" | "now">,
): Lease {
  return { name, token, fence, ttlMs, expiresAt: now + ttlMs, serverTime: now };
}

function checkLease(lease: LeaseRef): LeaseRef {
  if (typeof lease !== "object" || lease === null) {
    throw new InvalidType("Expected a lease returned by acquire or renew");
  }
  checkLockName(lease.name);
  checkToken(lease.token);
  if (lease.hold !== undefined) checkHoldId(lease.hold);
  checkFence(lease.fence);
  checkNext(lease.next);
  return lease;
}
