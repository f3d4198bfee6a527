import { sleep } from "./_backoff.ts";
import { integers, type RedisLike, runScript } from "./_runner.ts";
import {
  checkDuration,
  checkMeta,
  checkName,
  checkPrefix,
  checkSignal,
  checkToken,
  newToken,
} from "./_validate.ts";
import {
  ACQUIRE,
  FENCE_GRACE_MS,
  INSPECT,
  LEAVE_QUEUE,
  RELEASE,
  RENEW,
  RENEW_MANY,
  type Script,
} from "./scripts.ts";
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
}

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

  constructor(redis: RedisLike, { prefix = "edgelock" }: LocksOptions = {}) {
    if (typeof redis?.evalsha !== "function" || typeof redis?.eval !== "function") {
      throw new TypeError("Locks needs a Redis client with evalsha and eval (@upstash/redis)");
    }
    checkPrefix(prefix);
    this.#redis = redis;
    this.#prefix = prefix;
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
      const args = [token, ttlMs, meta, FENCE_GRACE_MS, ticketMs];
      queued ||= ticketMs > 0;
      const reply = await runScript(this.#redis, ACQUIRE, keys, args);
      if (integers(ACQUIRE, reply, 1)[0] === 1) {
        return { acquired: true, lease: toLease(name, token, ACQUIRE, reply) };
      }
      const retryAfterMs = Math.max(1, integers(ACQUIRE, reply, 2)[1]!);
      const remaining = deadline - performance.now();
      if (remaining <= 0 || signal?.aborted) {
        if (queued) await this.#leaveQueue(keys, token);
        signal?.throwIfAborted();
        return { acquired: false, retryAfterMs };
      }
      // Look again when the server expects our turn, with ±10 % jitter so waiters spread out.
      const delay = Math.min(remaining, MAX_POLL_MS, retryAfterMs * (0.9 + Math.random() * 0.2));
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
    await runScript(this.#redis, LEAVE_QUEUE, [keys[2]!], [token]).catch(() => {});
  }

  /** Extends a lease still held by its token; the fence stays the same. */
  async renew(lease: LeaseRef, options: RenewOptions = {}): Promise<RenewResult> {
    const { name, token } = checkLease(lease);
    const ttlMs = checkDuration(options.ttlMs, "ttlMs", lease.ttlMs ?? DEFAULT_TTL_MS);
    const args = [token, ttlMs, FENCE_GRACE_MS];
    const reply = await runScript(this.#redis, RENEW, this.#keys(name), args);
    if (integers(RENEW, reply, 1)[0] !== 1) return { renewed: false };
    return { renewed: true, lease: toLease(name, token, RENEW, reply) };
  }

  /**
   * Renews up to 1000 leases in one script and one request, each with `ttlMs` from now (default
   * 10000). Results come in the same order; the fence of each renewed lease stays the same.
   */
  async renewMany(leases: readonly LeaseRef[], options: RenewOptions = {}): Promise<RenewResult[]> {
    if (!Array.isArray(leases) || leases.length === 0 || leases.length > MAX_BATCH) {
      throw new RangeError(`renewMany takes 1 to ${MAX_BATCH} leases`);
    }
    const ttlMs = checkDuration(options.ttlMs, "ttlMs", DEFAULT_TTL_MS);
    const refs = leases.map(checkLease);
    const keys = refs.flatMap(({ name }) => this.#keys(name).slice(0, 2));
    const args = [ttlMs, FENCE_GRACE_MS, ...refs.map((ref) => ref.token)];
    const reply = await runScript(this.#redis, RENEW_MANY, keys, args);
    const values = integers(RENEW_MANY, reply, refs.length + 1);
    const serverTime = values[refs.length]!;
    return refs.map(({ name, token }, i): RenewResult =>
      values[i] === 0 ? { renewed: false } : {
        renewed: true,
        lease: { name, token, fence: values[i]!, ttlMs, expiresAt: serverTime + ttlMs, serverTime },
      }
    );
  }

  /**
   * Frees a lease. `false` when its token no longer held the lock (expired or taken over);
   * a retry of a release that went through answers `true` again.
   */
  async release(lease: LeaseRef): Promise<boolean> {
    const { name, token } = checkLease(lease);
    const reply = await runScript(this.#redis, RELEASE, this.#keys(name), [token]);
    return integers(RELEASE, [reply], 1)[0] === 1;
  }

  /** Tells whether `name` is held, with its fence, remaining TTL and meta; never the token. */
  async inspect(name: string): Promise<LockInfo> {
    checkName(name);
    const reply = await runScript(this.#redis, INSPECT, this.#keys(name), []);
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
    return [base, `${base}:fence`, `${base}:queue`];
  }
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
  return lease;
}

// The Upstash client may already have JSON-parsed the text (automaticDeserialization).
export function parseJsonText(raw: unknown): Record<string, unknown> | undefined {
  if (typeof raw === "object" && raw !== null) return raw as Record<string, unknown>;
  if (typeof raw !== "string" || raw === "") return undefined;
  try {
    return JSON.parse(raw);
  } catch {
    return undefined;
  }
}
