// The routes for seeing and operating the locks: who am I, the tenant's stats, its held locks and
// audit, breaking a lock (operators only) and the Prometheus scrape. Tenants' keys see their own
// tenant; operators' keys pick one with ?tenant= (GET /metrics: all of them).
import * as z from "zod/mini";
import type { Context, Hono } from "hono";
import { EdgelockError } from "../../core/errors.ts";
import { LIST_PAGE_DEFAULT, NAME_PREFIX_PATTERN } from "../../core/_validate.ts";
import type { Stats } from "../../core/stats.ts";
import type { AppEnv } from "../_env.ts";
import { toPrometheus } from "../metrics.ts";
import { route } from "../_route.ts";
import {
  doc,
  holdId,
  holding,
  int,
  json,
  LockName,
  lockName,
  NameParams,
  problemDoc,
} from "../_schemas.ts";

const tenantField = {
  tenant: z.optional(doc(z.string(), {
    description: "Operators: the tenant to read (a tenant's key may only name its own)",
  })),
};
const TenantQuery = z.object(tenantField);
// A whole number from 1 to 1000, written plainly (not " 5", "1e3" or "0x10").
const pageLimit = (description: string) =>
  z.optional(doc(
    z.pipe(
      z.string().check(
        z.regex(/^(1000|[1-9][0-9]{0,2})$/, "limit must be a whole number from 1 to 1000"),
      ),
      z.transform(Number),
    ),
    { description },
  ));
const ListQuery = z.object({
  ...tenantField,
  prefix: z.optional(doc(
    z.string().check(
      z.regex(NAME_PREFIX_PATTERN, "must be up to 200 characters of A-Z a-z 0-9 . _ : - { }"),
    ),
    {
      description: "Only names that start with this",
    },
  )),
  cursor: z.optional(lockName("The previous page's cursor")),
  limit: pageLimit("The most locks on the page, 1–1000 (default 100)"),
});

const serverClock = "Epoch ms, Redis server clock";
const HeldLock = doc(
  z.object({
    name: LockName,
    held: z.literal(true),
    fence: int(),
    ttlMs: int(),
    expiresAt: int(serverClock),
    waiters: int(),
    meta: z.optional(z.record(z.string(), z.unknown())),
    ...holding,
  }),
  { id: "HeldLock" },
);
const Counts = doc(z.record(z.string(), z.unknown()), {
  id: "Counts",
  description: "acquire, renew, release, lease_lost, break, idempotency, dedupe, cron counters " +
    "by outcome, and the wait and hold histograms (buckets by le_ms, p50_ms, p99_ms)",
});
const StatsSchema = doc(
  z.object({
    tenant: z.string(),
    at: int(),
    locks_held: int(),
    total: Counts,
    last_hour: Counts,
    minutes: z.array(z.object({
      at: int(),
      granted: int(),
      busy: int(),
      timeout: int(),
      lease_lost: int(),
      wait_p50_ms: z.nullable(z.number()),
      wait_p99_ms: z.nullable(z.number()),
    })),
  }),
  { id: "Stats" },
);
const AuditEntry = doc(
  z.object({
    id: z.string(),
    action: z.literal("break"),
    name: LockName,
    fence: int(),
    by: z.string(),
    reason: z.string(),
    at: int(),
  }),
  { id: "AuditEntry" },
);
const BreakBody = doc(
  z.strictObject({
    reason: z.optional(
      doc(
        z.string().check(z.maxLength(200), z.regex(/^[\x20-\x7e]*$/, "must be printable ASCII")),
        {
          description: "Why, for the audit stream (printable ASCII, at most 200)",
        },
      ),
    ),
    id: z.optional(holdId(
      "This break's id: a retry with it answers the same and ends nothing more",
    )),
    fence: z.optional(doc(z.number().check(z.int(), z.minimum(1)), {
      description:
        "The fence of the lease to break, as inspect showed it: a lease granted since is left alone",
    })),
  }),
  { id: "BreakRequest" },
);

const denied = {
  400: problemDoc("invalid_request (an operator key must name ?tenant=)"),
  401: problemDoc("unauthorized"),
  403: problemDoc("forbidden: another tenant, or a tenant's key on an operator route"),
  404: problemDoc("not_found: no such tenant"),
  503: problemDoc("backend_unavailable"),
};
const get = (operationId: string, path: string, summary: string) => ({
  tags: ["operations"],
  method: "get" as const,
  path,
  operationId,
  summary,
});

const OPERATOR_ROUTES = [
  /^GET \/v1\/(me|stats|locks|audit)$/,
  /^POST \/v1\/locks\/[^/]+\/break$/,
  /^GET \/metrics$/,
];

/** Whether an operator's key may call `method path` (HEAD counts as GET). */
export function isOperatorRoute(method: string, path: string): boolean {
  const line = `${method === "HEAD" ? "GET" : method} ${path}`;
  return OPERATOR_ROUTES.some((route) => route.test(line));
}

// The tenant the request reads: the key's own, or the one an operator named.
function tenantOf(c: Context<AppEnv>): string {
  const tenant = c.get("tenant");
  if (!tenant) {
    throw new EdgelockError("invalid_request", "An operator key names the tenant: ?tenant=<name>");
  }
  return tenant;
}

/** Registers the routes above. */
export function opsRoutes(app: Hono<AppEnv>, { stats }: { stats: boolean }): void {
  // Before the body is read: a tenant's key is told it may not break, whatever it sent.
  app.post("/v1/locks/:name/break", async (c, next) => {
    if (c.get("operator") === undefined) {
      throw new EdgelockError("forbidden", "Only an operator key (OPERATOR_API_KEYS) breaks locks");
    }
    await next();
  });
  // Stats and the held index exist only when the service keeps them.
  const needStats = (what: string) => {
    if (!stats) throw new EdgelockError("not_found", `${what} is off: this service keeps no stats`);
  };
  route(app, {
    ...get("whoAmI", "/v1/me", "The key's role and the tenants it reads"),
    responses: {
      200: json(
        z.object({
          role: z.enum(["tenant", "operator"]),
          name: z.string(),
          tenants: z.array(z.string()),
        }),
        "Who",
      ),
      401: problemDoc("unauthorized"),
    },
  }, (c) => {
    const operator = c.get("operator");
    const tenants = operator === undefined ? [c.get("tenant")] : [...c.get("tenants").keys()];
    return c.json({
      role: c.get("role"),
      name: operator ?? c.get("tenant"),
      tenants,
    }, 200);
  });

  route(app, {
    ...get("readStats", "/v1/stats", "The tenant's stats: totals, the last hour, per minute"),
    query: TenantQuery,
    responses: { 200: json(StatsSchema, "Stats"), ...denied },
  }, async (c) => {
    const tenant = tenantOf(c);
    needStats("/v1/stats");
    return c.json({ tenant, ...await c.get("ops").stats() }, 200);
  });

  route(app, {
    ...get(
      "listLocks",
      "/v1/locks",
      "The tenant's held locks by name, a page at a time; a page counts as `limit` requests " +
        "(default 100) against the tenant's request rate",
    ),
    query: ListQuery,
    responses: {
      200: json(
        z.object({ locks: z.array(HeldLock), cursor: z.optional(z.string()) }),
        "A page",
      ),
      429: problemDoc("too_many_requests: the page's cost is over this tenant's request rate"),
      ...denied,
    },
  }, async (c, { query: { prefix, cursor, limit } }) => {
    tenantOf(c);
    needStats("/v1/locks");
    // A page inspects up to `limit` names (a script each) after scanning the index: it counts
    // as that many requests against the tenant's rate, one already counted.
    c.get("charge")((limit ?? LIST_PAGE_DEFAULT) - 1);
    const page = await c.get("ops").list({
      ...(prefix && { prefix }),
      ...(cursor && { cursor }),
      ...(limit && { limit }),
    });
    const locks = page.locks.map((lock) => ({ ...lock, waiters: lock.waiters ?? 0 }));
    return c.json({ ...page, locks }, 200);
  });

  route(app, {
    ...get("readAudit", "/v1/audit", "The tenant's latest breaks, newest first (last 1000 kept)"),
    query: z.object({ ...tenantField, limit: pageLimit("The most entries (default 100)") }),
    responses: {
      200: json(z.object({ entries: z.array(AuditEntry) }), "Audit"),
      ...denied,
    },
  }, async (c, { query: { limit } }) => {
    tenantOf(c);
    return c.json({ entries: await c.get("ops").audit(limit ? { limit } : {}) }, 200);
  });

  route(app, {
    tags: ["operations"],
    method: "post",
    path: "/v1/locks/{name}/break",
    operationId: "breakLock",
    summary: "Operators: end a held lease now (its holder's renew and release then fail)",
    params: NameParams,
    query: TenantQuery,
    body: BreakBody,
    bodyOptional: true,
    responses: {
      200: json(
        z.object({ broken: z.boolean(), fence: z.optional(int()) }),
        "Broken, with the fence of the lease that ended; or not held",
      ),
      ...denied,
    },
  }, async (c, { params: { name }, body: { reason = "", id, fence } }) => {
    const operator = c.get("operator")!; // the route's check below let only operators in
    tenantOf(c);
    return c.json(await c.get("ops").break(name, { by: operator, reason, id, fence }), 200);
  });

  route(app, {
    ...get("metrics", "/metrics", "Prometheus text format: the key's tenant, or all for operators"),
    responses: {
      200: { description: "Prometheus exposition", schema: z.string(), type: "text/plain" },
      401: problemDoc("unauthorized"),
      503: problemDoc("backend_unavailable"),
    },
  }, async (c) => {
    const stores = c.get("tenants");
    const names = c.get("operator") === undefined ? [c.get("tenant")] : [...stores.keys()];
    needStats("/metrics");
    const read: { tenant: string; stats: Stats }[] = await Promise.all(
      names.map(async (tenant) => ({ tenant, stats: await stores.get(tenant)!.ops.stats() })),
    );
    return c.text(toPrometheus(read), 200, {
      "content-type": "text/plain; version=0.0.4; charset=utf-8",
    });
  });
}
