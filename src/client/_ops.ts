// The operator's calls over HTTP: list, stats, audit and break, for the chosen tenant.
import {
  checkFence,
  checkListOptions,
  checkLockName,
  checkOptions,
  newHoldId,
} from "../core/_validate.ts";
import type { AuditEntry } from "../core/types.ts";
import type { EdgelockClient } from "./types.ts";
import { type Http, lockPath } from "./_http.ts";

/** The operator's calls: the tenant's held locks, stats and audit, and breaking a lease. */
export type OpsCalls = Pick<EdgelockClient, "list" | "stats" | "audit" | "break">;

/** The operator's calls over `http`; with an operator's key, `tenant` is the one they act on. */
export function createOps(http: Http, tenant?: string): OpsCalls {
  // The operations routes, with the operator's chosen tenant.
  const opsPath = (path: string, query: Record<string, string | number | undefined> = {}) => {
    const params = new URLSearchParams();
    for (const [key, value] of Object.entries({ ...query, tenant })) {
      if (value !== undefined && value !== "") params.set(key, String(value));
    }
    const text = params.toString();
    return text ? `${path}?${text}` : path;
  };
  return {
    async list(opts = {}) {
      const { prefix, cursor, limit } = checkListOptions(opts);
      return await http.ok("GET", opsPath("v1/locks", { prefix, cursor, limit }));
    },
    stats() {
      return http.ok("GET", opsPath("v1/stats"));
    },
    async audit(opts = {}) {
      checkOptions(opts, ["limit"], "audit()");
      const path = opsPath("v1/audit", { limit: opts.limit });
      return (await http.ok<{ entries: AuditEntry[] }>("GET", path)).entries;
    },
    async break(name, opts = {}) {
      checkLockName(name);
      checkOptions(opts, ["reason", "fence"], "break()");
      // A break id chosen now: a retry of this break answers the same and ends nothing more.
      const body = {
        ...(opts.reason !== undefined && { reason: opts.reason }),
        ...(opts.fence !== undefined && { fence: checkFence(opts.fence) }),
        id: newHoldId(),
      };
      return await http.ok("POST", opsPath(lockPath(name, "break")), body);
    },
  };
}
