// Leases on the wire: the fields an acquire sends, and the lease, or the busy answer, a reply
// holds.
import { checkHold, checkLeaseOptions, HINT } from "../core/_validate.ts";
import { EdgelockError } from "../core/errors.ts";
import type { AcquireOptions, AcquireResult, Lease, LeaseOptions } from "../core/types.ts";
import { noteSentAt } from "../core/_granted.ts";
import { fromProblem } from "./_http.ts";

type Data = Record<string, unknown>;

// The body fields every acquire sends (its signal checked too, as the library checks it).
export function leaseBody(opts: LeaseOptions) {
  const { ttlMs, waitMs, token, fresh, meta } = checkLeaseOptions(opts);
  return {
    ttlMs,
    waitMs,
    token,
    // made here for this call (or said to be): a late copy of a retried attempt is refused
    ...(fresh && { freshToken: true }),
    ...(meta !== "" && { meta: JSON.parse(meta) }),
  };
}

// A reentrant acquire's fields, its hold id chosen once for every attempt.
export function hold(opts: AcquireOptions): { reentrant?: true; hold?: string } {
  const id = checkHold(opts);
  return id === "" ? {} : { reentrant: true, hold: id };
}

// A granted lease; the service waited `waitedMs` before the grant, so the lease runs from then
// at the earliest.
export function granted(data: Data, reply: Data, sentAt: number) {
  const waitedMs = Number.isSafeInteger(reply.waitedMs) ? reply.waitedMs as number : 0;
  return noteSentAt(toLease(data), sentAt + waitedMs);
}

export function busyOrThrow(
  status: number,
  data: Data,
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

export function toLease(data: Data): Lease {
  const { name, token, fence, ttlMs, expiresAt, serverTime, mode, limit, permits, holdCount } =
    data;
  const hold = typeof data.hold === "string" ? data.hold : undefined;
  const next = typeof data.next === "string" && HINT.test(data.next) ? data.next : undefined;
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
    ...(next !== undefined && { next }),
  } as Lease;
}
