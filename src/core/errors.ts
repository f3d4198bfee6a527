/** Stable codes for the failures edgelock reports; the HTTP layer maps each to a status. */
export type ErrorCode =
  | "invalid_request"
  | "unauthorized"
  | "forbidden"
  | "not_found"
  | "payload_too_large"
  | "lock_busy"
  | "queue_full"
  | "mode_mismatch"
  | "limit_mismatch"
  | "hold_limit"
  | "permits_mismatch"
  | "too_many_requests"
  | "lock_lost"
  | "in_progress"
  | "lease_lost"
  | "fingerprint_mismatch"
  | "backend_unavailable"
  | "config_error"
  | "method_not_allowed"
  | "internal_error";

/** Options for {@linkcode EdgelockError}. */
export interface EdgelockErrorOptions extends ErrorOptions {
  /** When the caller may try again, in milliseconds. */
  retryAfterMs?: number;
  /** For `lock_busy` and `queue_full`: when the holder's lease ends unless renewed, epoch ms. */
  lockExpiresAt?: number;
}

/** An error with a stable {@linkcode ErrorCode}, the same one the HTTP API returns. */
export class EdgelockError extends Error {
  /** Always `"EdgelockError"`. */
  override name = "EdgelockError";
  /** The stable code, the same as the HTTP API's problem `code`. */
  readonly code: ErrorCode;
  /** When the caller may try again, in milliseconds, where that is known. */
  declare readonly retryAfterMs?: number;
  /** For `lock_busy` and `queue_full`: when the holder's lease ends unless renewed, epoch ms. */
  declare readonly lockExpiresAt?: number;

  /** An error with `code`, a message for people, and optionally `retryAfterMs` and a `cause`. */
  constructor(code: ErrorCode, message: string, options: EdgelockErrorOptions = {}) {
    super(message, options);
    this.code = code;
    if (options.retryAfterMs !== undefined) this.retryAfterMs = options.retryAfterMs;
    if (options.lockExpiresAt !== undefined) this.lockExpiresAt = options.lockExpiresAt;
  }
}

/** The error for an acquire that stayed busy: `lock_busy`, or `queue_full` when too many wait. */
export function busyError(
  name: string,
  { retryAfterMs, lockExpiresAt, reason }: {
    retryAfterMs: number;
    lockExpiresAt?: number;
    reason: "busy" | "queue_full";
  },
): EdgelockError {
  const options = { retryAfterMs, ...(lockExpiresAt !== undefined && { lockExpiresAt }) };
  return reason === "queue_full"
    ? new EdgelockError("queue_full", `Too many callers wait for lock "${name}" already`, options)
    : new EdgelockError(
      "lock_busy",
      `Cannot acquire lock "${name}": another token holds it`,
      options,
    );
}
