// The client's HTTP core: one request with its retries, problem+json replies as EdgelockError,
// and the paths the resource modules share.
import { backoffDelay, sleep } from "../core/_backoff.ts";
import { EdgelockError, type ErrorCode } from "../core/errors.ts";
import { connectFailure } from "../core/_failure.ts";
import type { ClientOptions } from "./types.ts";
import { InvalidRange, InvalidType } from "../core/_invalid.ts";

/** What the HTTP core needs from `ClientOptions`. */
export type HttpOptions = Pick<
  ClientOptions,
  "baseUrl" | "apiKey" | "fetch" | "retries" | "timeoutMs"
>;

type Data = Record<string, unknown>;

/** A reply the service sent: its status and JSON object, and when the request went out. */
export interface Reply {
  status: number;
  data: Data;
  sentAt: number;
}

/** The HTTP core each resource module is made from. */
export interface Http {
  /** Sends a request, retrying a network error or a 503 with backoff. */
  call(method: "GET" | "POST", path: string, body?: unknown, signal?: AbortSignal): Promise<Reply>;
  /** Sends a request and answers its 200 reply's data; anything else is thrown as a problem. */
  ok<T>(method: "GET" | "POST", path: string, body?: unknown): Promise<T>;
}

const MAX_RETRIES = 10;
const DEFAULT_TIMEOUT_MS = 10_000;
// The backoff ceiling between attempts, and the hint a caller gets once they all failed.
const RETRY_CAP_MS = 1000;

/** The HTTP core over the options' service, key and fetch; throws on an invalid option. */
export function createHttp(options: HttpOptions): Http {
  const { base, apiKey, fetchFn, retries, timeoutMs } = settings(options);
  const init = (method: string, body: unknown, signal?: AbortSignal): RequestInit => ({
    method,
    headers: {
      authorization: `Bearer ${apiKey}`,
      ...(body !== undefined && { "content-type": "application/json" }),
    },
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
  });
  const call: Http["call"] = async (method, path, body, signal) => {
    for (let tries = 0;; tries++) {
      const sentAt = performance.now();
      // An attempt waits for the reply as long as the wait it asked the service for, and then
      // timeoutMs: a service that accepts and never answers is a failure, not a hang.
      const waitMs = (body as { waitMs?: unknown } | undefined)?.waitMs;
      const limit = timeoutMs + (typeof waitMs === "number" ? waitMs : 0);
      const deadline = AbortSignal.timeout(limit);
      const { status, data, failure } = await attempt(
        fetchFn,
        new URL(path, base),
        init(method, body, signal ? AbortSignal.any([signal, deadline]) : deadline),
        signal,
      );
      if (data && status !== 503) return { status, data: checked(base, status, data), sentAt };
      // A connection that failed says why: nothing listening, TLS to plain HTTP, no such host.
      const look = status === 0 ? connectFailure(failure, base.href, "check baseUrl") : undefined;
      const found = look === "timeout" ? undefined : look;
      if (found && !found.retry) {
        throw new EdgelockError("config_error", found.message, { cause: found.cause });
      }
      if (tries >= retries) {
        throw new EdgelockError(
          "backend_unavailable",
          found
            ? `The lock service is unavailable: ${found.message}`
            : `The lock service at ${base.origin} is unavailable`,
          { cause: found?.cause ?? failure ?? `HTTP ${status}`, retryAfterMs: RETRY_CAP_MS },
        );
      }
      await sleep(backoffDelay(tries + 2, RETRY_CAP_MS), signal);
    }
  };
  return {
    call,
    async ok<T>(method: "GET" | "POST", path: string, body?: unknown): Promise<T> {
      const { status, data } = await call(method, path, body);
      if (status !== 200) throw fromProblem(status, data);
      return data as T;
    },
  };
}

// The options checked, with their defaults.
function settings(options: HttpOptions) {
  const {
    baseUrl,
    apiKey,
    fetch: fetchFn = globalThis.fetch,
    retries = 2,
    timeoutMs = DEFAULT_TIMEOUT_MS,
  } = options;
  let base: URL;
  try {
    base = new URL(baseUrl.endsWith("/") ? baseUrl : `${baseUrl}/`);
  } catch {
    throw new InvalidType(`baseUrl "${baseUrl}" is not a valid URL`);
  }
  if (base.protocol !== "http:" && base.protocol !== "https:") {
    throw new InvalidType(`baseUrl "${baseUrl}" must be an http or https URL`);
  }
  if (base.pathname.endsWith("/v1/")) {
    throw new InvalidType(
      `baseUrl "${baseUrl}" ends in /v1: give the service's root (${
        new URL("..", base).href.replace(/\/$/, "")
      }); the client adds /v1`,
    );
  }
  if (typeof apiKey !== "string" || apiKey === "") throw new InvalidType("apiKey is required");
  if (typeof fetchFn !== "function") throw new InvalidType("fetch must be a function");
  if (!Number.isInteger(retries) || retries < 0 || retries > MAX_RETRIES) {
    throw new InvalidRange(`retries must be an integer from 0 to ${MAX_RETRIES}`);
  }
  if (!Number.isInteger(timeoutMs) || timeoutMs < 100 || timeoutMs > 120_000) {
    throw new InvalidRange("timeoutMs must be an integer from 100 to 120000 milliseconds");
  }
  return { base, apiKey, fetchFn, retries, timeoutMs };
}

// One attempt: the reply's status and object, or the failure that kept it from coming.
async function attempt(
  fetchFn: typeof fetch,
  url: URL,
  init: RequestInit,
  signal: AbortSignal | undefined,
): Promise<{ status: number; data?: Data; failure?: unknown }> {
  let status = 0;
  try {
    const response = await fetchFn(url, init);
    status = response.status;
    // A reply cut short is a transport failure like any other, never an empty success.
    const parsed: unknown = await response.json();
    if (typeof parsed !== "object" || parsed === null) throw new InvalidType("not a JSON object");
    return { status, data: parsed as Data };
  } catch (error) {
    if (signal?.aborted) throw signal.reason; // the caller's abort; a timeout is a failure
    return { status, failure: error };
  }
}

// A failure reply that is no edgelock problem is a wrong baseUrl, not an outage: say so, without
// the other server's text. So is "no such route" on a path the client always uses.
function checked(base: URL, status: number, data: Data): Data {
  if (status < 400) return data;
  const ours = typeof data.type === "string" && data.type.startsWith("urn:edgelock:problem:");
  const where = `The server at ${base.href.replace(/\/$/, "")}`;
  if (!ours) {
    throw new EdgelockError(
      "config_error",
      "error" in data
        ? `${where} answered like a Redis REST endpoint (HTTP ${status}): baseUrl is the lock ` +
          "service's URL, not UPSTASH_REDIS_REST_URL"
        : `${where} is not an edgelock service (HTTP ${status}): check baseUrl`,
    );
  }
  if (status === 404 && data.detail === "No such route") {
    throw new EdgelockError(
      "config_error",
      `${where} has no edgelock API there (HTTP 404, no such route): baseUrl is the service's ` +
        "root, where /openapi.json is",
    );
  }
  return data;
}

/** A lock's path, or one of its actions'. */
export function lockPath(name: string, action?: string): string {
  return `v1/locks/${encodeURIComponent(name)}${action ? `/${action}` : ""}`;
}

/** A problem+json reply as the EdgelockError it describes. */
export function fromProblem(status: number, data: Data): EdgelockError {
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
