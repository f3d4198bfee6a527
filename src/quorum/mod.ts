/**
 * Quorum locks over N independent databases (3, 5, …: Upstash databases, or redis-servers), as
 * in the Redlock description, with fences that still strictly increase. An acquire holds the name
 * on a majority within the validity window (TTL less the time taken and a clock-drift
 * allowance), then commits its fence to that majority before the lease counts: the fence is
 * above the committed floor of every database it holds, and any two majorities share a database.
 * The argument, and what this does not give, are in docs/quorum.md.
 *
 * @example
 * ```ts
 * import { Redis } from "@upstash/redis";
 * import { QuorumLocks } from "@edgelock/edgelock/quorum";
 *
 * const locks = new QuorumLocks([1, 2, 3].map((i) =>
 *   new Redis({ url: Deno.env.get(`REDIS_URL_${i}`)!, token: Deno.env.get(`REDIS_TOKEN_${i}`)! })
 * ));
 * await locks.withLock("payout:7", { ttlMs: 5000 }, async (lease) => {
 *   // … write, passing lease.fence along
 * });
 * ```
 *
 * @module
 */
import { sleep } from "../core/_backoff.ts";
import { noteSentAt } from "../core/_granted.ts";
import {
  checkRedis,
  checkTimeout,
  integers,
  keyLockingFor,
  type RedisLike,
  type RunOptions,
  runScript,
} from "../core/_runner.ts";
import type { CallOf, Contract, ContractScript } from "../core/lua/_define.ts";
import {
  ACQUIRE_OPTIONS,
  checkDuration,
  checkFence,
  checkLockName,
  checkOptions,
  checkSignal,
  checkToken,
  DEFAULT_PREFIX,
  DEFAULT_TTL_MS,
  FENCE_GRACE_MS,
  newToken,
  renewTtl,
} from "../core/_validate.ts";
import type {
  AcquireAllResult,
  AcquireOptions,
  AcquireResult,
  Lease,
  LeaseRef,
  LockClient,
  LockInfo,
  RenewOptions,
  RenewResult,
  WithLockOptions,
} from "../core/types.ts";
import { withLock, withLocks } from "../core/with_lock.ts";
import { Q_ACQUIRE, Q_COMMIT, Q_INSPECT, Q_RELEASE, Q_RENEW } from "./scripts.ts";
import { InvalidRange, InvalidType } from "../core/_invalid.ts";

/** Options for {@linkcode QuorumLocks}. */
export interface QuorumLocksOptions {
  /** Prefix of every key, on every database. @default "edgelock" */
  prefix?: string;
  /** How long one database may take to answer, 1–60000 ms; a slower one counts as down. @default 500 */
  timeoutMs?: number;
  /**
   * The clocks' drift allowance, a fraction of the TTL (plus 2 ms) taken off every lease's
   * validity. @default 0.01
   */
  driftFactor?: number;
  /**
   * Send the scripts with Upstash's `allow-key-locking` flag, as `Locks` with `keyLocking`.
   * @default decided for each database: on for an Upstash one, off otherwise
   */
  keyLocking?: boolean;
}

/** Fenced quorum locks: the surface of `Locks` (exclusive leases, one name at a time). */
export class QuorumLocks implements LockClient {
  readonly #databases: RedisLike[];
  readonly #majority: number;
  readonly #prefix: string;
  readonly #options: RunOptions[];
  readonly #driftFactor: number;
  readonly #down = new Set<number>();

  /** Quorum locks over `databases` (at least 3; a majority of them must agree). */
  constructor(databases: readonly RedisLike[], options: QuorumLocksOptions = {}) {
    if (!Array.isArray(databases) || databases.length < 3 || databases.length > 15) {
      throw new InvalidRange("QuorumLocks takes 3 to 15 independent databases");
    }
    this.#databases = databases.map((db) => checkRedis(db, "QuorumLocks"));
    this.#majority = Math.floor(databases.length / 2) + 1;
    this.#prefix = options.prefix ?? DEFAULT_PREFIX;
    const timeoutMs = checkTimeout(options.timeoutMs ?? 500);
    this.#options = databases.map((db) => ({
      timeoutMs,
      keyLocking: keyLockingFor(db, options.keyLocking),
    }));
    const drift = options.driftFactor ?? 0.01;
    if (typeof drift !== "number" || !(drift >= 0 && drift < 0.5)) {
      throw new InvalidRange("driftFactor must be a number from 0 to 0.5");
    }
    this.#driftFactor = drift;
  }

  /** How many databases must agree: a majority. */
  get quorum(): number {
    return this.#majority;
  }

  #key(name: string): string {
    return `${this.#prefix}:qlock:{${name}}`;
  }

  // One script on the given databases at once (`named` its arguments, or database i's); a
  // database that fails or is slow answers undefined, and is taken for down until it answers again.
  // `late` is given the reply of a database that answered after its deadline.
  #run<C extends Contract>(
    script: ContractScript<C>,
    name: string,
    named: CallOf<C>["args"] | ((i: number) => CallOf<C>["args"]),
    on = this.#all(),
    late?: (i: number, reply: unknown) => void,
  ) {
    const call = (i: number) =>
      script.call({
        keys: { key: this.#key(name) },
        args: typeof named === "function" ? named(i) : named,
      } as CallOf<C>);
    return Promise.all(
      on.map((i) => {
        const { keys, args } = call(i);
        const options = late
          ? { ...this.#options[i]!, onLate: (reply: unknown) => late(i, reply) }
          : this.#options[i];
        return runScript(this.#databases[i]!, script, keys, args, options).then(
          (reply) => (this.#down.delete(i), reply),
          () => void this.#down.add(i),
        );
      }),
    );
  }

  // The database a name's retries ask first: its own by FNV-1a of the name, or the next one up.
  #leader(name: string): number {
    let hash = 0x811c9dc5;
    for (let i = 0; i < name.length; i++) hash = Math.imul(hash ^ name.charCodeAt(i), 0x01000193);
    const n = this.#databases.length;
    const own = (hash >>> 0) % n;
    for (let k = 0; k < n; k++) if (!this.#down.has((own + k) % n)) return (own + k) % n;
    return own;
  }

  #all(): number[] {
    return this.#databases.map((_, i) => i);
  }

  // What is left of a lease `ttlMs` long whose requests were sent at `started`.
  #validity(ttlMs: number, started: number): number {
    return ttlMs - (performance.now() - started) - (ttlMs * this.#driftFactor + 2);
  }

  /**
   * Acquires `name` on a majority, waiting up to `waitMs` (tries again with a random backoff). A
   * failed attempt releases the holds it was granted, also those whose answers come late (those
   * its requests cannot reach stay until the TTL: see docs/quorum.md).
   */
  async acquire(name: string, options: AcquireOptions = {}): Promise<AcquireResult> {
    checkLockName(name);
    checkOptions(options, ACQUIRE_OPTIONS, "acquire()");
    if (options.mode === "shared" || options.limit !== undefined || options.reentrant) {
      throw new InvalidRange("Quorum locks are exclusive: no mode, limit or reentrant");
    }
    const ttlMs = checkDuration(options.ttlMs, "ttlMs", DEFAULT_TTL_MS);
    const waitMs = checkDuration(options.waitMs, "waitMs", 0);
    const token = options.token === undefined ? newToken() : checkToken(options.token);
    const signal = checkSignal(options.signal);
    const deadline = performance.now() + waitMs;
    const leftovers = new Leftovers((i, at, seen) =>
      this.#run(Q_RELEASE, name, { token, graceMs: FENCE_GRACE_MS, fence: 0, at, seen }, [i])
    );
    for (let attempt = 0;; attempt++) {
      signal?.throwIfAborted();
      const result = await this.#attempt(name, token, ttlMs, attempt > 0, leftovers);
      const left = deadline - performance.now();
      if (result.acquired || left <= 0) return result;
      const delay = Math.min(left, result.retryAfterMs, 50 * 2 ** Math.min(attempt, 4));
      await sleep(delay * (0.5 + Math.random()), signal).catch(() => {});
    }
  }

  // One try. All databases at once; a retry (`leaderFirst`, after contention) asks the name's
  // leader database (the first one up in the name's order) first and the others only once it
  // granted, so contenders queue at the leader instead of splitting the votes (a leader that does
  // not answer: all at once again).
  async #attempt(
    name: string,
    token: string,
    ttlMs: number,
    leaderFirst: boolean,
    leftovers: Leftovers,
  ): Promise<AcquireResult> {
    const started = performance.now();
    const args = { token, ttlMs, graceMs: FENCE_GRACE_MS };
    // Answers that come after their deadline: no lease counts those holds, so they go to the
    // leftovers once this attempt is decided (a database answering the leader-first ask late
    // and then the ask to all: two holds, the second extending the first).
    const late: [number, Grant][] = [];
    let decided = false;
    const onLate = (i: number, reply: unknown) => {
      const grant = grantIn(reply);
      if (!grant) return;
      if (decided) leftovers.add(i, grant);
      else late.push([i, grant]);
    };
    const decide = () => {
      decided = true;
      for (const [i, grant] of late) leftovers.add(i, grant);
    };
    let replies: unknown[];
    const leader = this.#leader(name);
    const first = leaderFirst
      ? (await this.#run(Q_ACQUIRE, name, args, [leader], onLate))[0]
      : undefined;
    if (first !== undefined && integers(Q_ACQUIRE, first, 1)[0] !== 1) {
      decide();
      const [, pttl] = integers(Q_ACQUIRE, first, 2);
      return { acquired: false, retryAfterMs: Math.max(5, pttl!), reason: "busy" };
    }
    if (first !== undefined) {
      const others = this.#all().filter((i) => i !== leader);
      const rest = await this.#run(Q_ACQUIRE, name, args, others, onLate);
      replies = this.#all().map((i) => i === leader ? first : rest[others.indexOf(i)]);
    } else {
      replies = await this.#run(Q_ACQUIRE, name, args, this.#all(), onLate);
    }
    // Each granting database's hold, named by its end and the floor it answered, which this
    // attempt's commit and clean-up carry (one that lands after a later attempt took the name again
    // does nothing there).
    const holds = new Map<number, Grant>();
    let fence = 0;
    const busyFor: number[] = [];
    replies.forEach((reply, i) => {
      if (reply === undefined) return;
      const grant = grantIn(reply);
      if (!grant) return void busyFor.push(integers(Q_ACQUIRE, reply, 2)[1]!);
      // Above this database's committed floor and, should it have lost its data, its clock in µs.
      fence = Math.max(fence, grant.seen + 1, grant.clockUs);
      holds.set(i, grant);
    });
    if (holds.size >= this.quorum && this.#validity(ttlMs, started) > 0) {
      const commits = await this.#run(
        Q_COMMIT,
        name,
        (i) => ({
          token,
          fence,
          graceMs: FENCE_GRACE_MS,
          at: holds.get(i)!.at,
          seen: holds.get(i)!.seen,
        }),
        [...holds.keys()],
      );
      const committed = commits.filter((reply) => reply === 1).length;
      const validMs = Math.floor(this.#validity(ttlMs, started));
      if (committed >= this.quorum && validMs > 0) {
        decide();
        const now = Date.now();
        const lease = { name, token, fence, ttlMs, expiresAt: now + validMs, serverTime: now };
        return { acquired: true, lease: noteSentAt(lease, started) };
      }
    }
    // Not a majority in time: free the holds it made (see Leftovers). Where its own commit landed,
    // the clean-up finds the floor moved and frees nothing.
    decide();
    await Promise.all([...holds].map(([i, grant]) => leftovers.add(i, grant)));
    const retryAfterMs = Math.max(5, busyFor.length > 0 ? Math.min(...busyFor) : 50);
    return { acquired: false, retryAfterMs, reason: "busy" };
  }

  /**
   * Extends a lease on a majority within its validity; the fence stays the same. Takes the lease
   * with its fence: a database keeps no lease's fence, only the highest committed, so without it a
   * renewal could not say which lease it extended (a `TypeError`).
   */
  async renew(lease: LeaseRef, options: RenewOptions = {}): Promise<RenewResult> {
    const { name, token, fence } = checkFenced(lease);
    checkOptions(options, ["ttlMs"], "renew()");
    const ttlMs = renewTtl(options.ttlMs, lease.ttlMs);
    const started = performance.now();
    const replies = await this.#run(Q_RENEW, name, {
      token,
      ttlMs,
      graceMs: FENCE_GRACE_MS,
      fence,
    });
    const validMs = Math.floor(this.#validity(ttlMs, started));
    if (replies.filter((reply) => reply === 1).length < this.quorum || validMs <= 0) {
      return { renewed: false };
    }
    const now = Date.now();
    return {
      renewed: true,
      lease: { name, token, fence, ttlMs, expiresAt: now + validMs, serverTime: now },
    };
  }

  /** Renews each lease (one request per database per lease); results in the same order. */
  async renewMany(leases: readonly LeaseRef[], options: RenewOptions = {}): Promise<RenewResult[]> {
    if (!Array.isArray(leases) || leases.length === 0 || leases.length > 1000) {
      throw new InvalidRange("renewMany takes 1 to 1000 leases");
    }
    leases.forEach(checkFenced); // every lease checked before any is renewed
    return await Promise.all(leases.map((lease) => this.renew(lease, options)));
  }

  /**
   * Frees a lease on every database. `true` when a majority held it until now; a retry of a
   * release that went through answers `false`.
   */
  async release(lease: LeaseRef): Promise<boolean> {
    const { name, token } = checkRef(lease);
    const replies = await this.#run(Q_RELEASE, name, {
      token,
      graceMs: FENCE_GRACE_MS,
      fence: lease.fence ?? 0,
      at: 0,
      seen: 0,
    });
    return replies.filter((reply) => reply === 1).length >= this.quorum;
  }

  /** Held when a majority says so, with the highest committed fence and the shortest TTL left. */
  async inspect(name: string): Promise<LockInfo> {
    checkLockName(name);
    const replies = await this.#run(Q_INSPECT, name, {});
    const held = replies.filter((reply) => Array.isArray(reply) && reply[0] === 1) as number[][];
    if (held.length < this.quorum) return { name, held: false };
    const fence = Math.max(...held.map((reply) => reply[1]!));
    const ttlMs = Math.min(...held.map((reply) => reply[2]!));
    return { name, held: true, fence, ttlMs, expiresAt: Date.now() + ttlMs };
  }

  /** Not offered: quorum locks take one name at a time. */
  acquireAll(): Promise<AcquireAllResult> {
    return Promise.reject(new InvalidType("Quorum locks take one name at a time"));
  }

  /** Runs `fn` while holding `name`; see `withLock`. */
  withLock<T>(
    name: string,
    options: WithLockOptions,
    fn: (lease: Lease, signal: AbortSignal) => Promise<T> | T,
  ): Promise<T> {
    return withLock(this, name, options, fn);
  }

  /** Not offered: quorum locks take one name at a time. */
  withLocks<T>(
    names: readonly string[],
    options: AcquireOptions,
    fn: (leases: Lease[], signal: AbortSignal) => Promise<T> | T,
  ): Promise<T> {
    return withLocks(this, names, options, fn);
  }
}

// A lease to renew: with its fence, since a database keeps no lease's fence, only the highest.
function checkFenced(lease: LeaseRef): LeaseRef & { fence: number } {
  const ref = checkRef(lease);
  if (ref.fence === undefined) throw new InvalidType("QuorumLocks.renew needs the lease's fence");
  return ref as LeaseRef & { fence: number };
}

function checkRef(lease: LeaseRef): LeaseRef {
  if (typeof lease !== "object" || lease === null) {
    throw new InvalidType("Expected a lease returned by acquire or renew");
  }
  checkLockName(lease.name);
  checkToken(lease.token);
  checkFence(lease.fence);
  return lease;
}

// A database's grant in an acquire's reply: the end of the hold it made (`at`), the committed
// floor it answered (`seen`), its clock in µs, and when it extended a live hold of the token, that
// hold's end (`extended`, else 0). Undefined when it was busy.
type Grant = { at: number; seen: number; clockUs: number; extended: number };
function grantIn(reply: unknown): Grant | undefined {
  if (integers(Q_ACQUIRE, reply, 1)[0] !== 1) return undefined;
  const [, seen, clockUs, at, extended] = integers(Q_ACQUIRE, reply, 5) as number[];
  return { at: at!, seen: seen!, clockUs: clockUs!, extended: extended! };
}

/**
 * The holds one acquire call made that no lease it returns counts: its failed attempts' grants,
 * and any grant that answered after its deadline. Each is freed by a clean-up that names it by
 * its end and the floor its acquire answered (`free`), once it is known to be the call's own: a
 * hold the acquire made, or one it extended that was the call's own (a retry reaching a
 * database before the earlier attempt's clean-up, or the leader asked twice). A hold it extended
 * that is not (a live lease of the token's) is left alone. A clean-up that lands after the hold
 * was extended again, committed by a lease or counted by a renewal finds another end or floor and
 * frees nothing.
 */
class Leftovers {
  // per database: the call's own holds ("<at>/<seen>"), and extensions of holds not yet known
  readonly #own = new Map<number, Set<string>>();
  readonly #waiting = new Map<number, Grant[]>();

  constructor(readonly free: (i: number, at: number, seen: number) => Promise<unknown>) {}

  /** Notes database i's grant; returns the clean-ups it sent. */
  add(i: number, grant: Grant): Promise<unknown> {
    const own = this.#own.get(i) ?? new Set<string>();
    this.#own.set(i, own);
    const waiting = this.#waiting.get(i) ?? [];
    this.#waiting.set(i, waiting);
    if (grant.extended !== 0 && !own.has(`${grant.extended}/${grant.seen}`)) {
      waiting.push(grant);
      return Promise.resolve();
    }
    const sent: Promise<unknown>[] = [];
    for (const found = [grant]; found.length > 0;) {
      const { at, seen } = found.pop()!;
      own.add(`${at}/${seen}`);
      sent.push(this.free(i, at, seen));
      for (let k = waiting.length - 1; k >= 0; k--) {
        if (waiting[k]!.extended === at && waiting[k]!.seen === seen) {
          found.push(...waiting.splice(k, 1));
        }
      }
    }
    return Promise.all(sent);
  }
}
