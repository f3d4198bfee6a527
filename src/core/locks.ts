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
import {
  checkDuration,
  checkMeta,
  checkName,
  checkPrefix,
  checkSignal,
  checkToken,
  newToken,
} from "./_validate.ts";
import { ACQUIRE, FENCE_GRACE_MS, INSPECT, LEAVE_QUEUE, RELEASE, RENEW } from "./scripts.ts";
import { type Script } from "./_lua.ts";
import type {
  AcquireOptions,
  AcquireResult,
  Lease,
  LeaseRef,
  LockClient,
  LockInfo,
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

  /** Locks on `redis` (an `@upstash/redis` client), their keys under `prefix`. */
  constructor(
    redis: RedisLike,
    {
      prefix = "edgelock",
      maxWaiters = DEFAULT_MAX_WAITERS,
      timeoutMs,
      fenceWindowMs,
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
  }

  #run(script: Script, keys: string[], args: (string | number)[]): Promise<unknown> {
    return runScript(this.#redis, script, keys, args, this.#timeoutMs);
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
    const deadline = performance.now() + waitMs;
    const keys = this.#keys(name);
    let queued = false;

    for (;;) {
      signal?.throwIfAborted();
      const left = deadline - performance.now();
      // A waiter holds a FIFO ticket that outlives its next look by a margin.
      const ticketMs = left > 0 ? Math.ceil(Math.min(left, MAX_POLL_MS) + TICKET_MARGIN_MS) : 0;
      const args = [token, ttlMs, meta, this.#fenceWindowMs, ticketMs, this.#maxWaiters];
      queued ||= ticketMs > 0;
      const sentAt = performance.now();
      const reply = await this.#run(ACQUIRE, keys, args);
      if (integers(ACQUIRE, reply, 1)[0] === 1) {
        return { acquired: true, lease: noteSentAt(toLease(name, token, ACQUIRE, reply), sentAt) };
      }
      const [, hint, now, position, pttl] = integers(ACQUIRE, reply, 5);
      const retryAfterMs = Math.max(1, hint!);
      const busy = {
        acquired: false as const,
        retryAfterMs,
        ...(pttl! > 0 && { lockExpiresAt: now! + pttl! }),
      };
      if (position === QUEUE_FULL) {
        if (queued) await this.#leaveQueue(keys, token);
        return { ...busy, reason: "queue_full" };
      }
      const remaining = deadline - performance.now();
      if (remaining <= 0 || signal?.aborted) {
        if (queued) await this.#leaveQueue(keys, token);
        signal?.throwIfAborted();
        return { ...busy, reason: "busy" };
      }
      // Look again so the request arrives when the server expects our turn: the hint counts from
      // the reply's making, and half a round trip has passed since, half is still ahead. The head
      // and the next in line aim a little late (early costs a round trip); the others spread ±10 %.
      const rtt = performance.now() - sentAt;
      const jitter = position! <= 1 ? 1 + Math.random() * 0.1 : 0.9 + Math.random() * 0.2;
      const delay = Math.min(remaining, MAX_POLL_MS, retryAfterMs * jitter - rtt);
      try {
        await sleep(Math.max(1, delay), signal);
      } catch (error) {
        await this.#leaveQueue(keys, token);
        throw error;
      }
    }
  }

  async #leaveQueue(keys: string[], token: string): Promise<void> {
    // Best effort: a ticket left behind lapses by itself within MAX_POLL_MS + TICKET_MARGIN_MS.
    await this.#run(LEAVE_QUEUE, keys.slice(1), [token]).catch(() => {});
  }

  /** Extends a lease still held by its token; the fence stays the same. */
  async renew(lease: LeaseRef, options: RenewOptions = {}): Promise<RenewResult> {
    const { name, token } = checkLease(lease);
    const ttlMs = checkDuration(options.ttlMs, "ttlMs", lease.ttlMs ?? DEFAULT_TTL_MS);
    const args = [token, ttlMs, this.#fenceWindowMs];
    const reply = await this.#run(RENEW, this.#keys(name).slice(0, 1), args);
    return toRenewal(name, token, reply);
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
      keys: this.#keys(name).slice(0, 1),
      args: [token, ttlMs, this.#fenceWindowMs],
    }));
    const replies = await runScripts(this.#redis, RENEW, calls, this.#timeoutMs);
    return refs.map(({ name, token }, i) => toRenewal(name, token, replies[i]));
  }

  /**
   * Frees a lease. `false` when its token no longer held the lock (expired or taken over);
   * a retry of a release that went through answers `true` again.
   */
  async release(lease: LeaseRef): Promise<boolean> {
    const { name, token } = checkLease(lease);
    const args = [token, this.#fenceWindowMs, fenceArg(lease)];
    const reply = await this.#run(RELEASE, this.#keys(name).slice(0, 1), args);
    return integers(RELEASE, [reply], 1)[0] === 1;
  }

  /** Tells whether `name` is held, with its fence, remaining TTL and meta; never the token. */
  async inspect(name: string): Promise<LockInfo> {
    checkName(name);
    const reply = await this.#run(INSPECT, this.#keys(name).slice(0, 1), []);
    if (integers(INSPECT, reply, 1)[0] !== 1) return { name, held: false };
    const [, fence, ttlMs, now] = integers(INSPECT, reply, 4) as [number, number, number, number];
    const meta = parseJsonText((reply as unknown[])[4]);
    return { name, held: true, fence, ttlMs, expiresAt: now + ttlMs, ...(meta && { meta }) };
  }

  /** Runs `fn` while holding `name`; see {@linkcode withLock}. */
  withLock<T>(
    name: string,
    options: WithLockOptions,
    fn: (lease: Lease, signal: AbortSignal) => Promise<T> | T,
  ): Promise<T> {
    return withLock(this, name, options, fn);
  }

  // The name sits in a hash tag so all keys of a lock share a cluster slot.
  #keys(name: string): [string, string, string] {
    const base = `${this.#prefix}:lock:{${name}}`;
    return [base, `${base}:queue`, `${base}:tickets`];
  }
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
