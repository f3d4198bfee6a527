// The lock calls of `Locks` over HTTP: acquire (one name or all of several), renew, release and
// inspect. `withLock` and `withLocks` are built on them in client.ts.
import {
  ACQUIRE_OPTIONS,
  checkDuration,
  checkFence,
  checkHoldId,
  checkLockName,
  checkLockNames,
  checkMode,
  checkNext,
  checkOptions,
  checkToken,
  DEFAULT_TTL_MS,
  LEASE_OPTIONS,
  MAX_BATCH,
  renewTtl,
} from "../core/_validate.ts";
import type { LeaseRef, LockClient, LockInfo, RenewResult } from "../core/types.ts";
import { fromProblem, type Http, lockPath } from "./_http.ts";
import { busyOrThrow, granted, hold, leaseBody, toLease } from "./_leases.ts";
import { InvalidRange } from "../core/_invalid.ts";

/** The lock calls that go over HTTP; `withLock` and `withLocks` are not among them. */
export type LockCalls = Omit<LockClient, "withLock" | "withLocks">;

type Data = Record<string, unknown>;

/** The lock calls over `http`. */
export function createLocks(http: Http): LockCalls {
  return { ...acquiring(http), ...renewing(http), ...releasing(http) };
}

// Acquiring: one name in any mode, or several exclusively, all or none.
function acquiring(http: Http): Pick<LockClient, "acquire" | "acquireAll"> {
  return {
    async acquire(name, opts = {}) {
      checkLockName(name);
      checkOptions(opts, ACQUIRE_OPTIONS, "acquire()");
      const { mode, limit, permits } = checkMode(opts);
      const body = {
        ...leaseBody(opts),
        ...(mode === "shared" && { mode }),
        ...(limit > 0 && { limit, permits }),
        ...hold(opts),
      };
      const { status, data, sentAt } = await http.call(
        "POST",
        lockPath(name, "acquire"),
        body,
        opts.signal,
      );
      if (status === 200) return { acquired: true, lease: granted(data, data, sentAt) };
      return busyOrThrow(status, data);
    },

    async acquireAll(names, opts = {}) {
      checkOptions(opts, LEASE_OPTIONS, "acquireAll()");
      // The service knows its key layout, and refuses names in different slots in the cluster one.
      const body = { names: checkLockNames(names, false), ...leaseBody(opts) };
      const { status, data, sentAt } = await http.call(
        "POST",
        "v1/locks/acquire",
        body,
        opts.signal,
      );
      if (status === 200 && Array.isArray(data.leases)) {
        const leases = data.leases as Data[];
        return { acquired: true, leases: leases.map((lease) => granted(lease, data, sentAt)) };
      }
      return busyOrThrow(status, data);
    },
  };
}

// What a renewal or a release sends of a lease, checked as the library checks it. A fence that is
// not one (a string from stored JSON) is refused, not dropped: without it the call would mean the
// token's latest lease; with it, exactly that lease.
function leaseRef(lease: LeaseRef) {
  const name = checkLockName(lease?.name);
  const fence = checkFence(lease.fence);
  return {
    name,
    token: checkToken(lease.token),
    ...(fence !== undefined && { fence }),
    ...(lease.hold !== undefined && { hold: checkHoldId(lease.hold) }),
    ...(lease.next !== undefined && { next: checkNext(lease.next) }),
  };
}

// Renewing a lease, or up to MAX_BATCH of them in one request.
function renewing(http: Http): Pick<LockClient, "renew" | "renewMany"> {
  return {
    async renew(lease, opts = {}) {
      const { name: _, ...ref } = leaseRef(lease);
      checkOptions(opts, ["ttlMs"], "renew()");
      const body = { ...ref, ttlMs: renewTtl(opts.ttlMs, lease.ttlMs) };
      const { status, data } = await http.call("POST", lockPath(lease.name, "renew"), body);
      // The lease as the service tells it: its kind, its hold and next where they still apply.
      if (status === 200) return { renewed: true, lease: toLease(data) };
      if (data.code === "lock_lost") return { renewed: false };
      throw fromProblem(status, data);
    },

    async renewMany(leases, opts = {}) {
      checkOptions(opts, ["ttlMs"], "renewMany()");
      if (!Array.isArray(leases) || leases.length === 0 || leases.length > MAX_BATCH) {
        throw new InvalidRange(`renewMany takes 1 to ${MAX_BATCH} leases`);
      }
      const body = {
        ttlMs: checkDuration(opts.ttlMs, "ttlMs", DEFAULT_TTL_MS),
        leases: Array.from(leases, leaseRef),
      };
      const { status, data } = await http.call("POST", "v1/locks/renew", body);
      if (status !== 200 || !Array.isArray(data.results)) throw fromProblem(status, data);
      return (data.results as Data[]).map((result): RenewResult =>
        result.renewed === true ? { renewed: true, lease: toLease(result) } : { renewed: false }
      );
    },
  };
}

// Releasing a lease, and a look at a lock.
function releasing(http: Http): Pick<LockClient, "release" | "inspect"> {
  return {
    async release(lease) {
      const { name: _, ...body } = leaseRef(lease);
      const data = await http.ok<Data>("POST", lockPath(lease.name, "release"), body);
      return data.released === true;
    },

    async inspect(name) {
      checkLockName(name);
      return await http.ok<LockInfo>("GET", lockPath(name));
    },
  };
}
