// Every failure as RFC 9457 problem+json: a stable code, a status, and a detail written for the
// client. Internals (Redis key names, script names, upstream error text) stay in the log.
import type { Context } from "hono";
import { HTTPException } from "hono/http-exception";
import { EdgelockError, type ErrorCode } from "../core/errors.ts";
import { InvalidRange, InvalidType } from "../core/_invalid.ts";
import { problem } from "../hono/_problem.ts";

type Status = 400 | 401 | 403 | 404 | 405 | 409 | 413 | 422 | 429 | 500 | 503;

const PROBLEMS: Record<ErrorCode, [Status, string]> = {
  invalid_request: [400, "The request is not valid"],
  unauthorized: [401, "Missing or unknown API key"],
  forbidden: [403, "This API key may not do this"],
  not_found: [404, "No such route"],
  method_not_allowed: [405, "This route does not take this method"],
  payload_too_large: [413, "The request body is too large"],
  lock_busy: [409, "The lock is held by another token"],
  queue_full: [409, "Too many callers wait for this lock already"],
  mode_mismatch: [409, "The lock is held in another mode"],
  limit_mismatch: [409, "The semaphore is held with another limit"],
  hold_limit: [409, "This token holds the lock as many times as it may"],
  permits_mismatch: [409, "This token holds the semaphore with another number of permits"],
  too_many_requests: [429, "This tenant is over its request limit"],
  lock_lost: [409, "The lease is no longer held by this token"],
  in_progress: [409, "Another request with this key is in flight"],
  lease_lost: [409, "The claim is no longer held by this token"],
  fingerprint_mismatch: [422, "This key was used with another payload"],
  backend_unavailable: [503, "Redis is unreachable"],
  config_error: [500, "The service is misconfigured"],
  internal_error: [500, "An unexpected error (a bug in edgelock)"],
};

// The library's messages for these name scripts and carry upstream text: clients get these.
const CLIENT_DETAIL: Partial<Record<ErrorCode, string>> = {
  backend_unavailable: "Redis did not answer in time or could not be reached; try again shortly",
  config_error: "The service is misconfigured (e.g. cannot reach its Redis with its settings); " +
    "its operator must fix it (the service's log says what). Retrying will not help.",
  internal_error: "The service failed unexpectedly",
};

/** Any thrown value as an {@linkcode EdgelockError}; an unexpected one is `internal_error`. */
export function toEdgelockError(error: unknown): EdgelockError {
  if (error instanceof EdgelockError) return error;
  // The library's own argument checks (the same limits as the schemas); a bug's TypeError is not.
  if (error instanceof InvalidRange || error instanceof InvalidType) {
    return new EdgelockError("invalid_request", error.message);
  }
  // A client error Hono itself raises (the routes read and check bodies in ../_route.ts).
  if (error instanceof HTTPException && error.status < 500) {
    return new EdgelockError("invalid_request", error.message || "Malformed request");
  }
  return new EdgelockError("internal_error", "The service failed unexpectedly", { cause: error });
}

/** The problem+json reply for `error`. */
export function problemResponse(
  c: Context,
  error: EdgelockError,
  headers: Record<string, string> = {},
): Response {
  const [status, title] = PROBLEMS[error.code];
  const extra: Record<string, unknown> = {};
  if (error.retryAfterMs !== undefined) {
    headers["retry-after"] = String(Math.max(1, Math.ceil(error.retryAfterMs / 1000)));
    extra.retryAfterMs = error.retryAfterMs;
  }
  if (error.lockExpiresAt !== undefined) extra.lockExpiresAt = error.lockExpiresAt;
  if (error.code === "invalid_request" && Array.isArray(error.cause)) extra.errors = error.cause;
  const requestId = c.get("requestId" as never) as string | undefined;
  if (requestId) extra.requestId = requestId;
  return problem(status, error.code, CLIENT_DETAIL[error.code] ?? error.message, {
    title,
    headers,
    extra,
  });
}
