import type { EdgelockError } from "../core/errors.ts";
import type { Locks } from "../core/locks.ts";
import type { LockOps } from "../core/ops.ts";
import type { Jobs } from "../uses/jobs.ts";
import type { Records } from "../uses/records.ts";

/** One tenant's stores, as the service keeps them. */
export interface TenantStores {
  /** The tenant's locks. */
  locks: Locks;
  /** The operator's acts on the tenant's locks (list and stats need the service's stats). */
  ops: LockOps;
  /** The tenant's idempotency and deduplication records. */
  records: Records;
  /** The tenant's cron jobs. */
  jobs: Jobs;
  /** Runs a server-side wait within the tenant's cap on concurrent waits. */
  wait: <T>(fn: () => Promise<T>) => Promise<T>;
  /**
   * Counts `requests` more against the tenant's request rate (throws `too_many_requests`), for a
   * request that makes that much Redis work (a list page).
   */
  charge: (requests: number) => void;
}

/** What the service's middleware sets for each request: the tenant and its own stores. */
export type AppEnv = {
  /** The tenant's stores (the operator's charge counts nothing), and the request's own. */
  Variables: TenantStores & {
    /** This request's id: the caller's `x-request-id`, or a new one. */
    requestId: string;
    /** `tenant` for a tenant's key (LOCK_API_KEYS), `operator` for an operator's (OPERATOR_API_KEYS). */
    role: "tenant" | "operator";
    /** The operator's name, for an operator's key. */
    operator?: string;
    /** Every tenant's stores by name (operators pick one with `?tenant=`). */
    tenants: ReadonlyMap<string, TenantStores>;
    /** The tenant the API key belongs to (or, for an operator, the one it chose). */
    tenant: string;
    /** Why the request failed, for the request log. */
    failure?: EdgelockError;
  };
};
