// Per-tenant caps of one service instance (an isolate on the edge): concurrent server-side waits
// and a request rate. They bound what one tenant's client can make an instance hold open and
// send to Redis; instances do not share them.
import { EdgelockError } from "../core/errors.ts";
import { InvalidRange } from "../core/_invalid.ts";

/** Per-tenant caps on one service instance. */
export interface TenantLimits {
  /** Concurrent acquire requests with `waitMs` > 0 per tenant, 1–10000. @default 100 */
  maxWaits?: number;
  /** Requests per second per tenant (bursts up to one second's worth), 0 for none. @default 5000 */
  requestsPerSecond?: number;
}

/** The default caps. */
export const DEFAULT_LIMITS = { maxWaits: 100, requestsPerSecond: 5000 } as const;

/** Admission control for one instance: throws `too_many_requests` (HTTP 429) over a cap. */
export interface TenantLimiter {
  /** Counts one request of `tenant` against its rate. */
  admit(tenant: string): void;
  /**
   * Counts `extra` requests' worth more for a request already admitted (a list page counts each
   * name it may inspect): with the admission, at most one second's worth, so any page can pass.
   */
  charge(tenant: string, extra: number): void;
  /** Runs a server-side wait of `tenant`, unless it has `maxWaits` running already. */
  wait<T>(tenant: string, fn: () => Promise<T>): Promise<T>;
}

export function tenantLimiter(
  {
    maxWaits = DEFAULT_LIMITS.maxWaits,
    requestsPerSecond = DEFAULT_LIMITS.requestsPerSecond,
  }: TenantLimits = {},
  now: () => number = () => performance.now(),
): TenantLimiter {
  if (!Number.isInteger(maxWaits) || maxWaits < 1 || maxWaits > 10_000) {
    throw new InvalidRange("maxWaits must be an integer from 1 to 10000");
  }
  if (!Number.isInteger(requestsPerSecond) || requestsPerSecond < 0) {
    throw new InvalidRange("requestsPerSecond must be a non-negative integer (0 for no limit)");
  }
  const waits = new Map<string, number>();
  // A token bucket per tenant: `requestsPerSecond` tokens, refilled continuously.
  const buckets = new Map<string, { tokens: number; at: number }>();
  const take = (tenant: string, need: number) => {
    if (requestsPerSecond === 0 || need <= 0) return;
    const t = now();
    const bucket = buckets.get(tenant) ?? { tokens: requestsPerSecond, at: t };
    bucket.tokens = Math.min(
      requestsPerSecond,
      bucket.tokens + (t - bucket.at) * requestsPerSecond / 1000,
    );
    bucket.at = t;
    buckets.set(tenant, bucket);
    if (bucket.tokens < need) {
      const retryAfterMs = Math.ceil((need - bucket.tokens) * 1000 / requestsPerSecond);
      throw new EdgelockError(
        "too_many_requests",
        `Over ${requestsPerSecond} requests per second for this API key`,
        { retryAfterMs },
      );
    }
    bucket.tokens -= need;
  };
  return {
    admit(tenant) {
      take(tenant, 1);
    },
    charge(tenant, extra) {
      take(tenant, Math.min(extra, requestsPerSecond - 1));
    },
    async wait(tenant, fn) {
      const running = waits.get(tenant) ?? 0;
      if (running >= maxWaits) {
        throw new EdgelockError(
          "too_many_requests",
          `This API key already has ${maxWaits} acquire requests waiting; retry, or wait less`,
          { retryAfterMs: 1000 },
        );
      }
      waits.set(tenant, running + 1);
      try {
        return await fn();
      } finally {
        const left = waits.get(tenant)! - 1;
        if (left === 0) waits.delete(tenant);
        else waits.set(tenant, left);
      }
    },
  };
}
