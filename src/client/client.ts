import { backoffDelay, sleep } from "../core/_backoff.ts";
import {
  checkDuration,
  checkHold,
  checkHoldId,
  checkLockName,
  checkLockNames,
  checkMeta,
  checkMode,
  checkName,
  checkToken,
  DEFAULT_LEASE_MS,
  DEFAULT_RETENTION_MS,
  newHoldId,
  newToken,
  SEGMENT_PATTERN,
} from "../core/_validate.ts";
import { EdgelockError, type ErrorCode } from "../core/errors.ts";
import type {
  AcquireAllResult,
  AcquireOptions,
  AcquireResult,
  AuditEntry,
  BreakResult,
  Lease,
  LeaseOptions,
  LeaseRef,
  ListOptions,
  LockClient,
  LockInfo,
  LockList,
  RenewOptions,
  RenewResult,
  WithLockOptions,
} from "../core/types.ts";
import type { Stats } from "../core/stats.ts";
import { withLock, withLocks } from "../core/with_lock.ts";
import { noteSentAt } from "../core/_granted.ts";
import { leaseKind } from "../core/_lease.ts";
import type {
  ClaimOptions,
  ClaimRenewal,
  ClaimResult,
  RecordKind,
  RecordState,
  RecordStore,
} from "../uses/records.ts";
import type { JobExtension, JobStart, JobStore, StartJobOptions } from "../uses/jobs.ts";

/** Options for {@linkcode createClient}. */
export interface ClientOptions {
  /** The service's base URL, e.g. `https://locks.example.workers.dev`. */
  baseUrl: string;
  /** A tenant secret from the service's `LOCK_API_KEYS`. */
  apiKey: string;
  /** The fetch to send requests with (a runtime's own, or one for tests). @default globalThis.fetch */
  fetch?: typeof fetch;
  /**
   * Retries after a network error or a 503. Safe for every call: the token (and a reentrant
   * acquire's hold id, and a break's id) is chosen before the first attempt, so a repeated call
   * takes effect once. @default 2
   */
  retries?: number;
  /** For an operator's key: the tenant that `list`, `stats`, `audit` and `break` act on. */
  tenant?: string;
}

/**
 * The typed client: the lock calls of `Locks`, plus `records` and `jobs` with the surface of the
 * library's `Records` and `Jobs`, so `dedupe()`, `cronGuard()` and the Hono middleware run on
 * either.
 */
export interface EdgelockClient extends LockClient {
  /** Idempotency keys and deduplicated ids, as `Records` has them. */
  readonly records: RecordStore;
  /** Cron jobs, as `Jobs` has them. */
  readonly jobs: JobStore;
  /** The tenant's held locks by name, a page at a time, as `Locks.list` (`GET /v1/locks`). */
  list(options?: ListOptions): Promise<LockList>;
  /** The tenant's stats, as `Locks.stats` (`GET /v1/stats`). */
  stats(): Promise<Stats & { tenant: string }>;
  /** The tenant's latest breaks, newest first (`GET /v1/audit`). */
  audit(options?: { limit?: number }): Promise<AuditEntry[]>;
  /** Ends a held lease now; needs an operator's key (`POST /v1/locks/{name}/break`). */
  break(name: string, options?: { reason?: string }): Promise<BreakResult>;
}

/**
 * A client for the edgelock HTTP service with the same surface as the library's `Locks`,
 * `Records` and `Jobs`, so moving between embedded and remote mode is one line.
 *
 * @example
 * ```ts
 * const locks = createClient({ baseUrl: "https://locks.example.com", apiKey: "…" });
 * const result = await locks.acquire("invoice:42", { ttlMs: 5000 });
 * ```
 */
export function createClient(options: ClientOptions): EdgelockClient {
  const { baseUrl, apiKey, fetch: fetchFn = globalThis.fetch, retries = 2, tenant } = options;
  let base: URL;
  try {
    base = new URL(baseUrl.endsWith("/") ? baseUrl : `${baseUrl}/`);
  } catch {
    throw new TypeError(`baseUrl "${baseUrl}" is not a valid URL`);
  }
  if (typeof apiKey !== "string" || apiKey === "") throw new TypeError("apiKey is required");
  if (!Number.isInteger(retries) || retries < 0 || retries > 10) {
    throw new RangeError("retries must be an integer from 0 to 10");
  }

  async function call(
    method: "GET" | "POST",
    path: string,
    body?: unknown,
    signal?: AbortSignal,
  ): Promise<{ status: number; data: Record<string, unknown>; sentAt: number }> {
    for (let attempt = 0;; attempt++) {
      let data: Record<string, unknown> | undefined;
      let status = 0;
      let failure: unknown;
      const sentAt = performance.now();
      try {
        const response = await fetchFn(new URL(path, base), {
          method,
          headers: {
            authorization: `Bearer ${apiKey}`,
            ...(body !== undefined && { "content-type": "application/json" }),
          },
          body: body === undefined ? undefined : JSON.stringify(body),
          signal,
        });
        status = response.status;
        // A reply cut short is a transport failure like any other, never an empty success.
        const parsed: unknown = await response.json();
        if (typeof parsed !== "object" || parsed === null) throw new TypeError("not a JSON object");
        data = parsed as Record<string, unknown>;
      } catch (error) {
        if (signal?.aborted) throw signal.reason;
        failure = error;
      }
      if (data && status !== 503) return { status, data, sentAt };
      if (attempt >= retries) {
        throw new EdgelockError(
          "backend_unavailable",
          `The lock service at ${base.origin} is unavailable`,
          { cause: failure ?? status, retryAfterMs: 1000 },
        );
      }
      await sleep(backoffDelay(attempt + 2, 1000), signal);
    }
  }

  const lockPath = (name: string, action?: string) =>
    `v1/locks/${encodeURIComponent(name)}${action ? `/${action}` : ""}`;
  // The operations routes, with the operator's chosen tenant.
  const opsPath = (path: string, query: Record<string, string | number | undefined> = {}) => {
    const params = new URLSearchParams();
    for (const [key, value] of Object.entries({ ...query, tenant })) {
      if (value !== undefined && value !== "") params.set(key, String(value));
    }
    const text = params.toString();
    return text ? `${path}?${text}` : path;
  };
  const read = async <T>(path: string): Promise<T> => {
    const { status, data } = await call("GET", path);
    if (status !== 200) throw fromProblem(status, data);
    return data as T;
  };

  const records: RecordStore = {
    async claim(kind: RecordKind, id: string, opts: ClaimOptions = {}): Promise<ClaimResult> {
      const body = {
        token: opts.token === undefined ? newToken() : checkToken(opts.token),
        leaseMs: checkDuration(opts.leaseMs, "leaseMs", DEFAULT_LEASE_MS),
        retentionMs: checkDuration(opts.retentionMs, "retentionMs", DEFAULT_RETENTION_MS),
        ...(opts.fingerprint !== undefined && { fingerprint: opts.fingerprint }),
      };
      const { status, data } = await call("POST", recordPath(kind, id, "claim"), body);
      if (status === 201) return data as unknown as ClaimResult;
      if (status === 200) {
        const response = data.response as Record<string, unknown> | undefined;
        return response ? { state: "completed", response } : { state: "completed" };
      }
      if (data.code === "in_progress") {
        return { state: "in_progress", retryAfterMs: Number(data.retryAfterMs) || 1 };
      }
      if (data.code === "fingerprint_mismatch") return { state: "mismatch" };
      throw fromProblem(status, data);
    },
    async renew(kind, id, token, leaseMs = DEFAULT_LEASE_MS): Promise<ClaimRenewal> {
      const body = { token: checkToken(token), leaseMs: checkDuration(leaseMs, "leaseMs", 0) };
      const { status, data } = await call("POST", recordPath(kind, id, "renew"), body);
      if (status === 200) return data as unknown as ClaimRenewal;
      throw fromProblem(status, data);
    },
    async complete(kind, id, token, response): Promise<boolean> {
      const body = { token: checkToken(token), ...(response !== undefined && { response }) };
      const action = kind === "dedupe" ? "done" : "complete";
      const { status, data } = await call("POST", recordPath(kind, id, action), body);
      if (status === 200) return true;
      if (data.code === "lease_lost") return false;
      throw fromProblem(status, data);
    },
    async release(kind, id, token): Promise<boolean> {
      const body = { token: checkToken(token) };
      const { status, data } = await call("POST", recordPath(kind, id, "release"), body);
      if (status === 200) return data.released === true;
      throw fromProblem(status, data);
    },
    async get(kind, id): Promise<RecordState> {
      const { status, data } = await call("GET", recordPath(kind, id));
      if (status !== 200) throw fromProblem(status, data);
      return (data.state === "done" ? { ...data, state: "completed" } : data) as RecordState;
    },
  };

  const jobPath = (job: string, action: string) =>
    `v1/jobs/${encodeURIComponent(checkName(job, "job name"))}/${action}`;
  const jobs: JobStore = {
    async start(job: string, opts: StartJobOptions): Promise<JobStart> {
      if (opts?.atMostMs === undefined) throw new TypeError("atMostMs is required");
      const body = {
        ...opts,
        token: opts.token === undefined ? newToken() : checkToken(opts.token),
      };
      const { status, data } = await call("POST", jobPath(job, "start"), body);
      if (status === 200) return data as unknown as JobStart;
      throw fromProblem(status, data);
    },
    async extend(job: string, token: string, atMostMs: number): Promise<JobExtension> {
      const body = { token: checkToken(token), atMostMs: checkDuration(atMostMs, "atMostMs", 0) };
      const { status, data } = await call("POST", jobPath(job, "extend"), body);
      if (status === 200) return data as unknown as JobExtension;
      throw fromProblem(status, data);
    },
    async finish(job: string, token: string): Promise<boolean> {
      const { status, data } = await call("POST", jobPath(job, "finish"), {
        token: checkToken(token),
      });
      if (status === 200) return data.finished === true;
      throw fromProblem(status, data);
    },
  };

  const client: EdgelockClient = {
    records,
    jobs,
    async acquire(name: string, opts: AcquireOptions = {}): Promise<AcquireResult> {
      checkLockName(name);
      const { mode, limit, permits } = checkMode(opts);
      const body = {
        ...leaseBody(opts),
        ...(mode === "shared" && { mode }),
        ...(limit > 0 && { limit, permits }),
        ...hold(opts),
      };
      const { status, data, sentAt } = await call(
        "POST",
        lockPath(name, "acquire"),
        body,
        opts.signal,
      );
      if (status === 200) return { acquired: true, lease: granted(data, data, sentAt) };
      return busyOrThrow(status, data);
    },

    async acquireAll(names: readonly string[], opts: LeaseOptions = {}): Promise<AcquireAllResult> {
      // The service knows its key layout, and refuses names in different slots in the cluster one.
      const body = { names: checkLockNames(names, false), ...leaseBody(opts) };
      const { status, data, sentAt } = await call("POST", "v1/locks/acquire", body, opts.signal);
      if (status === 200 && Array.isArray(data.leases)) {
        const leases = data.leases as Record<string, unknown>[];
        return { acquired: true, leases: leases.map((lease) => granted(lease, data, sentAt)) };
      }
      return busyOrThrow(status, data);
    },

    async renew(lease: LeaseRef, opts: RenewOptions = {}): Promise<RenewResult> {
      checkLockName(lease?.name);
      const body = {
        token: checkToken(lease.token),
        ttlMs: checkDuration(opts.ttlMs, "ttlMs", lease.ttlMs ?? 10_000),
      };
      const { status, data } = await call("POST", lockPath(lease.name, "renew"), body);
      if (status === 200) {
        return { renewed: true, lease: { ...leaseKind(lease), ...toLease(data) } };
      }
      if (data.code === "lock_lost") return { renewed: false };
      throw fromProblem(status, data);
    },

    async renewMany(leases: readonly LeaseRef[], opts: RenewOptions = {}): Promise<RenewResult[]> {
      if (!Array.isArray(leases) || leases.length === 0 || leases.length > 1000) {
        throw new RangeError("renewMany takes 1 to 1000 leases");
      }
      const body = {
        ttlMs: checkDuration(opts.ttlMs, "ttlMs", 10_000),
        leases: leases.map((lease) => ({
          name: checkLockName(lease?.name),
          token: checkToken(lease.token),
        })),
      };
      const { status, data } = await call("POST", "v1/locks/renew", body);
      if (status !== 200 || !Array.isArray(data.results)) throw fromProblem(status, data);
      return (data.results as Record<string, unknown>[]).map((result, i): RenewResult =>
        result.renewed === true
          ? { renewed: true, lease: { ...leaseKind(leases[i]!), ...toLease(result) } }
          : { renewed: false }
      );
    },

    async release(lease: LeaseRef): Promise<boolean> {
      checkLockName(lease?.name);
      const body = {
        token: checkToken(lease.token),
        ...(Number.isSafeInteger(lease.fence) && { fence: lease.fence }),
        ...(lease.hold !== undefined && { hold: checkHoldId(lease.hold) }),
      };
      const { status, data } = await call("POST", lockPath(lease.name, "release"), body);
      if (status === 200) return data.released === true;
      throw fromProblem(status, data);
    },

    async inspect(name: string): Promise<LockInfo> {
      checkLockName(name);
      const { status, data } = await call("GET", lockPath(name));
      if (status === 200) return data as unknown as LockInfo;
      throw fromProblem(status, data);
    },

    withLocks<T>(
      names: readonly string[],
      opts: LeaseOptions,
      fn: (leases: Lease[], signal: AbortSignal) => Promise<T> | T,
    ): Promise<T> {
      return withLocks(client, names, opts, fn);
    },

    withLock<T>(
      name: string,
      opts: WithLockOptions,
      fn: (lease: Lease, signal: AbortSignal) => Promise<T> | T,
    ): Promise<T> {
      return withLock(client, name, opts, fn);
    },

    list(opts: ListOptions = {}): Promise<LockList> {
      if (opts.cursor !== undefined) checkLockName(opts.cursor);
      return read(
        opsPath("v1/locks", { prefix: opts.prefix, cursor: opts.cursor, limit: opts.limit }),
      );
    },

    stats(): Promise<Stats & { tenant: string }> {
      return read(opsPath("v1/stats"));
    },

    async audit(opts: { limit?: number } = {}): Promise<AuditEntry[]> {
      return (await read<{ entries: AuditEntry[] }>(opsPath("v1/audit", { limit: opts.limit })))
        .entries;
    },

    async break(name: string, opts: { reason?: string } = {}): Promise<BreakResult> {
      checkLockName(name);
      // A break id chosen now: a retry of this break answers the same and ends nothing more.
      const body = { ...(opts.reason !== undefined && { reason: opts.reason }), id: newHoldId() };
      const { status, data } = await call("POST", opsPath(lockPath(name, "break")), body);
      if (status === 200) return data as unknown as BreakResult;
      throw fromProblem(status, data);
    },
  };
  return client;
}

// Over HTTP a record id is scope/key (idempotency) or namespace/id (dedupe), as recordId() makes.
function recordPath(kind: RecordKind, id: string, action?: string): string {
  if (kind !== "idempotency" && kind !== "dedupe") {
    throw new RangeError(`kind must be "idempotency" or "dedupe", not ${JSON.stringify(kind)}`);
  }
  const parts = typeof id === "string" ? id.split("/") : [];
  if (parts.length !== 2 || !parts.every((part) => SEGMENT_PATTERN.test(part))) {
    throw new RangeError(`The ${kind} id must be scope/key, from recordId()`);
  }
  const path = `v1/${kind}/${parts.map(encodeURIComponent).join("/")}`;
  return action ? `${path}/${action}` : path;
}

// The body fields every acquire sends.
function leaseBody(opts: LeaseOptions) {
  return {
    ttlMs: checkDuration(opts.ttlMs, "ttlMs", 10_000),
    waitMs: checkDuration(opts.waitMs, "waitMs", 0),
    token: opts.token === undefined ? newToken() : checkToken(opts.token),
    ...(opts.meta !== undefined && { meta: JSON.parse(checkMeta(opts.meta)) }),
  };
}

// A reentrant acquire's fields, its hold id chosen once for every attempt.
function hold(opts: AcquireOptions): { reentrant?: true; hold?: string } {
  const id = checkHold(opts);
  return id === "" ? {} : { reentrant: true, hold: id };
}

// A granted lease; the service waited `waitedMs` before the grant, so the lease runs from then
// at the earliest.
function granted(data: Record<string, unknown>, reply: Record<string, unknown>, sentAt: number) {
  const waitedMs = Number.isSafeInteger(reply.waitedMs) ? reply.waitedMs as number : 0;
  return noteSentAt(toLease(data), sentAt + waitedMs);
}

function busyOrThrow(
  status: number,
  data: Record<string, unknown>,
): Exclude<AcquireResult, { acquired: true }> {
  if (data.code === "lock_busy" || data.code === "queue_full") {
    return {
      acquired: false,
      retryAfterMs: Number(data.retryAfterMs) || 1,
      ...(Number.isSafeInteger(data.lockExpiresAt) &&
        { lockExpiresAt: data.lockExpiresAt as number }),
      reason: data.code === "queue_full" ? "queue_full" : "busy",
    };
  }
  throw fromProblem(status, data);
}

function toLease(data: Record<string, unknown>): Lease {
  const { name, token, fence, ttlMs, expiresAt, serverTime, mode, limit, permits, holdCount } =
    data;
  const hold = typeof data.hold === "string" ? data.hold : undefined;
  if (
    typeof name !== "string" || typeof token !== "string" ||
    ![fence, ttlMs, expiresAt, serverTime].every(Number.isSafeInteger)
  ) {
    throw new EdgelockError("backend_unavailable", "The lock service sent a malformed lease", {
      cause: data,
    });
  }
  return {
    name,
    token,
    fence,
    ttlMs,
    expiresAt,
    serverTime,
    ...((mode === "shared" || mode === "semaphore") && { mode }),
    ...(Number.isSafeInteger(limit) && { limit, permits }),
    ...(Number.isSafeInteger(holdCount) && { holdCount }),
    ...(hold !== undefined && { hold }),
  } as Lease;
}

function fromProblem(status: number, data: Record<string, unknown>): EdgelockError {
  const code = typeof data.code === "string" ? data.code as ErrorCode : "internal_error";
  const detail = typeof data.detail === "string" ? data.detail : `HTTP ${status}`;
  const retryAfterMs = Number.isSafeInteger(data.retryAfterMs)
    ? data.retryAfterMs as number
    : undefined;
  return new EdgelockError(code, detail, {
    cause: data,
    ...(retryAfterMs !== undefined && { retryAfterMs }),
    ...(Number.isSafeInteger(data.lockExpiresAt) &&
      { lockExpiresAt: data.lockExpiresAt as number }),
  });
}
