// The routes for seeing and operating the locks: who am I, the tenant's stats, its held locks and
// audit, breaking a lock (operators only) and the Prometheus scrape. Tenants' keys see their own
// tenant; operators' keys pick one with ?tenant= (GET /metrics: all of them).
import { LIST_PAGE_DEFAULT } from "../../core/_validate.ts";
import { createRoute, type OpenAPIHono, z } from "@hono/zod-openapi";
import type { Context } from "hono";
import { EdgelockError } from "../../core/errors.ts";
import { NAME_PREFIX_PATTERN } from "../../core/_validate.ts";
import type { Stats } from "../../core/stats.ts";
import type { AppEnv } from "../_env.ts";
import { toPrometheus } from "../metrics.ts";
import { HoldId, Holding, json, LockName, problemDoc, secured } from "../_schemas.ts";

const TenantQuery = z.object({
  tenant: z.string().optional().openapi({
    description: "Operators: the tenant to read (a tenant's key may only name its own)",
  }),
});
const ListQuery = TenantQuery.extend({
  prefix: z.string().regex(NAME_PREFIX_PATTERN).optional().openapi({
    description: "Only names that start with this",
  }),
  cursor: LockName.optional().openapi({ description: "The previous page's cursor" }),
  limit: z.coerce.number().int().min(1).max(1000).optional().openapi({
    description: "The most locks on the page, 1–1000 (default 100)",
  }),
});

const HeldLock = z.object({
  name: LockName,
  held: z.literal(true),
  fence: z.number().int(),
  ttlMs: z.number().int(),
  expiresAt: z.number().int().openapi({ description: "Epoch ms, Redis server clock" }),
  waiters: z.number().int(),
  meta: z.record(z.string(), z.unknown()).optional(),
  ...Holding.shape,
}).openapi("HeldLock");
const Counts = z.record(z.string(), z.unknown()).openapi("Counts", {
  description: "acquire, renew, release, lease_lost, break, idempotency, dedupe, cron counters " +
    "by outcome, and the wait and hold histograms (buckets by le_ms, p50_ms, p99_ms)",
});
const StatsSchema = z.object({
  tenant: z.string(),
  at: z.number().int(),
  locks_held: z.number().int(),
  total: Counts,
  last_hour: Counts,
  minutes: z.array(z.object({
    at: z.number().int(),
    granted: z.number().int(),
    busy: z.number().int(),
    timeout: z.number().int(),
    lease_lost: z.number().int(),
    wait_p50_ms: z.number().nullable(),
    wait_p99_ms: z.number().nullable(),
  })),
}).openapi("Stats");
const AuditEntry = z.object({
  id: z.string(),
  action: z.literal("break"),
  name: LockName,
  fence: z.number().int(),
  by: z.string(),
  reason: z.string(),
  at: z.number().int(),
}).openapi("AuditEntry");
const BreakBody = z.strictObject({
  reason: z.string().max(200).regex(/^[\x20-\x7e]*$/).optional().openapi({
    description: "Why, for the audit stream (printable ASCII, at most 200)",
  }),
  id: HoldId.optional().openapi({
    description: "This break's id: a retry with it answers the same and ends nothing more",
  }),
}).openapi("BreakRequest");

const denied = {
  400: problemDoc("invalid_request (an operator key must name ?tenant=)"),
  401: problemDoc("unauthorized"),
  403: problemDoc("forbidden: another tenant, or a tenant's key on an operator route"),
  404: problemDoc("not_found: no such tenant"),
  503: problemDoc("backend_unavailable"),
};
const get = (operationId: string, path: string, summary: string) => ({
  ...secured("operations"),
  method: "get" as const,
  path,
  operationId,
  summary,
});

const meRoute = createRoute({
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
});
const statsRoute = createRoute({
  ...get("readStats", "/v1/stats", "The tenant's stats: totals, the last hour, per minute"),
  request: { query: TenantQuery },
  responses: { 200: json(StatsSchema, "Stats"), ...denied },
});
const listRoute = createRoute({
  ...get(
    "listLocks",
    "/v1/locks",
    "The tenant's held locks by name, a page at a time; a page counts as `limit` requests " +
      "(default 100) against the tenant's request rate",
  ),
  request: { query: ListQuery },
  responses: {
    200: json(z.object({ locks: z.array(HeldLock), cursor: z.string().optional() }), "A page"),
    429: problemDoc("too_many_requests: the page's cost is over this tenant's request rate"),
    ...denied,
  },
});
const auditRoute = createRoute({
  ...get("readAudit", "/v1/audit", "The tenant's latest breaks, newest first (last 1000 kept)"),
  request: {
    query: TenantQuery.extend({ limit: z.coerce.number().int().min(1).max(1000).optional() }),
  },
  responses: { 200: json(z.object({ entries: z.array(AuditEntry) }), "Audit"), ...denied },
});
const breakRoute = createRoute({
  ...secured("operations"),
  method: "post",
  path: "/v1/locks/{name}/break",
  operationId: "breakLock",
  summary: "Operators: end a held lease now (its holder's renew and release then fail)",
  request: {
    params: z.object({ name: LockName.openapi({ param: { name: "name", in: "path" } }) }),
    query: TenantQuery,
    body: { required: false, content: { "application/json": { schema: BreakBody } } },
  },
  responses: {
    200: json(
      z.object({ broken: z.boolean(), fence: z.number().int().optional() }),
      "Broken, with the fence of the lease that ended; or not held",
    ),
    ...denied,
  },
});
const metricsRoute = createRoute({
  ...get("metrics", "/metrics", "Prometheus text format: the key's tenant, or all for operators"),
  responses: {
    200: {
      description: "Prometheus exposition",
      content: { "text/plain": { schema: z.string() } },
    },
    401: problemDoc("unauthorized"),
    503: problemDoc("backend_unavailable"),
  },
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
export function opsRoutes(app: OpenAPIHono<AppEnv>, { stats }: { stats: boolean }): void {
  // Stats and the held index exist only when the service keeps them.
  const needStats = (what: string) => {
    if (!stats) throw new TypeError(`${what} needs stats on (createApp({ stats: true }))`);
  };
  app.openapi(meRoute, (c) => {
    const operator = c.get("operator");
    const tenants = operator === undefined ? [c.get("tenant")] : [...c.get("tenants").keys()];
    return c.json({
      role: c.get("role"),
      name: operator ?? c.get("tenant"),
      tenants,
    }, 200);
  });

  app.openapi(statsRoute, async (c) => {
    const tenant = tenantOf(c);
    needStats("/v1/stats");
    return c.json({ tenant, ...await c.get("ops").stats() }, 200);
  });

  app.openapi(listRoute, async (c) => {
    tenantOf(c);
    needStats("/v1/locks");
    const { prefix, cursor, limit } = c.req.valid("query");
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

  app.openapi(auditRoute, async (c) => {
    tenantOf(c);
    const { limit } = c.req.valid("query");
    return c.json({ entries: await c.get("ops").audit(limit ? { limit } : {}) }, 200);
  });

  app.openapi(breakRoute, async (c) => {
    const operator = c.get("operator");
    if (operator === undefined) {
      throw new EdgelockError("forbidden", "Only an operator key (OPERATOR_API_KEYS) breaks locks");
    }
    tenantOf(c);
    const text = await c.req.text();
    let raw: unknown = {};
    try {
      if (text !== "") raw = JSON.parse(text);
    } catch {
      throw new EdgelockError("invalid_request", "The body is not JSON");
    }
    const parsed = BreakBody.safeParse(raw);
    if (!parsed.success) {
      throw new EdgelockError("invalid_request", "The body is { reason?, id? }");
    }
    const { name } = c.req.valid("param");
    const { reason = "", id } = parsed.data;
    const result = await c.get("ops").break(name, { by: operator, reason, id });
    return c.json(result, 200);
  });

  app.openapi(metricsRoute, async (c) => {
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
