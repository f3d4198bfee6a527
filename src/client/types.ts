// The typed client's options and surface, apart from its parts so they import no cycle.
import type { AuditEntry, BreakResult, ListOptions, LockClient, LockList } from "../core/types.ts";
import type { Stats } from "../core/stats.ts";
import type { RecordStore } from "../uses/records.ts";
import type { JobStore } from "../uses/jobs.ts";

/** Options for `createClient`. */
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
  /**
   * How long one attempt waits for the service's reply, beyond the wait it asked for (`waitMs`),
   * before it counts as failed (and is retried), ms. @default 10000
   */
  timeoutMs?: number;
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
  /** The tenant's held locks by name, a page at a time, as `LockOps.list` (`GET /v1/locks`). */
  list(options?: ListOptions): Promise<LockList>;
  /** The tenant's stats, as `LockOps.stats` (`GET /v1/stats`). */
  stats(): Promise<Stats & { tenant: string }>;
  /** The tenant's latest breaks, newest first (`GET /v1/audit`). */
  audit(options?: { limit?: number }): Promise<AuditEntry[]>;
  /**
   * Ends a held lease now (only the lease of `fence`, when given); needs an operator's key
   * (`POST /v1/locks/{name}/break`).
   */
  break(name: string, options?: { reason?: string; fence?: number }): Promise<BreakResult>;
}
