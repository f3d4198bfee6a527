// The lock routes: acquire (optionally waiting in the fair queue), renew, batch renew, release,
// inspect. Each is one script through the tenant's Locks.
import { createRoute, type OpenAPIHono, z } from "@hono/zod-openapi";
import { busyError, EdgelockError } from "../../core/errors.ts";
import { MAX_LIMIT, MAX_NAMES } from "../../core/_validate.ts";
import { sentAtOf } from "../../core/_granted.ts";
import { leaseKind } from "../../core/_lease.ts";
import type { Lease } from "../../core/types.ts";
import type { Context } from "hono";
import type { AppEnv } from "../_env.ts";
import {
  body,
  common,
  duration,
  HoldId,
  Holding,
  json,
  LockName,
  Meta,
  post,
  problemDoc,
  secured,
  Token,
} from "../_schemas.ts";

const NameParams = z.object({ name: LockName.openapi({ param: { name: "name", in: "path" } }) });
const LeaseBody = z.strictObject({
  ttlMs: duration("ttlMs", "Lease length in ms (default 10000)").optional(),
  waitMs: duration("waitMs", "How long the server waits for a busy lock, ms (default 0)")
    .optional(),
  token: Token.optional().openapi({ description: "Choose it to make retries safe" }),
  meta: Meta.optional(),
});
const AcquireBody = LeaseBody.extend({
  mode: z.enum(["exclusive", "shared"]).optional().openapi({
    description: "exclusive (default): one holder; shared: many readers, no writer",
  }),
  limit: z.number().int().min(1).max(MAX_LIMIT).optional().openapi({
    description: "A semaphore of this many permits; every caller of the name passes the same",
  }),
  permits: z.number().int().min(1).max(MAX_LIMIT).optional().openapi({
    description: "How many of the semaphore's permits this lease takes (default 1, at most limit)",
  }),
  reentrant: z.boolean().optional().openapi({
    description: "The holder's token acquiring again counts a hold (holdCount) instead of " +
      "answering the same lease; it then takes as many releases, each with its hold",
  }),
  hold: HoldId.optional().openapi({
    description: "With reentrant: this acquire's hold id (default: a new one). Send the same " +
      "id when you retry, so the hold counts once",
  }),
}).openapi("AcquireRequest");
const AcquireAllBody = LeaseBody.extend({
  names: z.array(LockName).min(1).max(MAX_NAMES).openapi({
    description:
      `1–${MAX_NAMES} distinct names; with LOCK_KEY_LAYOUT=cluster in one slot (the same {group})`,
  }),
}).openapi("AcquireAllRequest");
const RenewBody = z.strictObject({
  token: Token,
  ttlMs: duration("ttlMs", "New lease length from now, ms"),
}).openapi("RenewRequest");
const ReleaseBody = z.strictObject({
  token: Token,
  fence: z.number().int().positive().max(Number.MAX_SAFE_INTEGER).optional().openapi({
    description: "The lease's fence: a retried release then answers true for exactly this lease",
  }),
  hold: HoldId.optional().openapi({
    description: "A reentrant lease's hold to end (the lease's hold): a retry then ends it once",
  }),
}).openapi("ReleaseRequest");

const LeaseSchema = z.object({
  name: LockName,
  token: Token,
  fence: z.number().int().openapi({ description: "Strictly increasing per name" }),
  ttlMs: z.number().int(),
  expiresAt: z.number().int().openapi({ description: "Epoch ms, Redis server clock" }),
  serverTime: z.number().int().openapi({ description: "Epoch ms, Redis server clock" }),
  mode: z.enum(["shared", "semaphore"]).optional().openapi({ description: "Absent: exclusive" }),
  limit: z.number().int().optional(),
  permits: z.number().int().optional(),
  holdCount: z.number().int().optional().openapi({ description: "A reentrant lease's holds" }),
  hold: HoldId.optional().openapi({ description: "This reentrant acquire's hold" }),
}).openapi("Lease");
const AcquiredSchema = LeaseSchema.extend({
  waitedMs: z.number().int().nonnegative().optional().openapi({
    description: "How long the service waited before the request to Redis that granted the " +
      "lease, ms: the lease is valid at least ttlMs from when the client sent its request plus this",
  }),
}).openapi("AcquiredLease");
const LockInfoSchema = z.object({
  name: LockName,
  held: z.boolean(),
  fence: z.number().int().optional(),
  ttlMs: z.number().int().optional(),
  expiresAt: z.number().int().optional(),
  waiters: z.number().int().optional(),
  meta: z.record(z.string(), z.unknown()).optional(),
  ...Holding.shape,
}).openapi("LockInfo");

const acquireRoute = createRoute({
  ...post("locks", "acquireLock", "/v1/locks/{name}/acquire", NameParams, AcquireBody),
  summary: "Acquire a lock (a retry with the holder's token returns the same fence)",
  responses: {
    200: json(AcquiredSchema, "Acquired"),
    409: problemDoc(
      "lock_busy or queue_full, with retryAfterMs and Retry-After; mode_mismatch (held in " +
        "another mode), limit_mismatch (a semaphore with another limit) or hold_limit (this " +
        "token holds it 64 times already)",
    ),
    429: problemDoc("too_many_requests: this tenant's concurrent waits or request rate"),
    ...common,
  },
});
const acquireAllRoute = createRoute({
  ...secured("locks"),
  method: "post",
  path: "/v1/locks/acquire",
  operationId: "acquireLocks",
  summary: "Acquire several locks exclusively, all or none (one script): a lease per name",
  request: { body: body(AcquireAllBody) },
  responses: {
    200: json(
      z.object({ leases: z.array(LeaseSchema), waitedMs: AcquiredSchema.shape.waitedMs })
        .openapi("AcquiredLeases"),
      "Acquired, one lease per name in order; renew and release each with the same token",
    ),
    409: problemDoc("lock_busy, queue_full or mode_mismatch, as for one lock"),
    429: problemDoc("too_many_requests: this tenant's concurrent waits or request rate"),
    ...common,
  },
});
const renewRoute = createRoute({
  ...post("locks", "renewLock", "/v1/locks/{name}/renew", NameParams, RenewBody),
  summary: "Extend a lease held by this token; the fence stays the same",
  responses: { 200: json(LeaseSchema, "Renewed"), 409: problemDoc("lock_lost"), ...common },
});
const RenewManyBody = z.strictObject({
  ttlMs: duration("ttlMs", "New lease length from now, ms (default 10000)").optional(),
  leases: z.array(z.strictObject({ name: LockName, token: Token })).min(1).max(1000),
}).openapi("RenewManyRequest");
const renewManyRoute = createRoute({
  ...secured("locks"),
  method: "post",
  path: "/v1/locks/renew",
  operationId: "renewLocks",
  summary: "Renew up to 1000 leases in one request (one script)",
  request: { body: body(RenewManyBody) },
  responses: {
    200: json(
      z.object({
        results: z.array(z.union([
          LeaseSchema.extend({ renewed: z.literal(true) }),
          z.object({ name: LockName, renewed: z.literal(false) }),
        ])),
      }).openapi("RenewManyResults"),
      "One result per lease, in order",
    ),
    ...common,
  },
});
const releaseRoute = createRoute({
  ...post("locks", "releaseLock", "/v1/locks/{name}/release", NameParams, ReleaseBody),
  summary: "Release a lease; released is false when this token no longer held it",
  responses: {
    200: json(z.object({ released: z.boolean() }).openapi("Released"), "Done"),
    ...common,
  },
});
const inspectRoute = createRoute({
  ...secured("locks"),
  method: "get",
  path: "/v1/locks/{name}",
  operationId: "inspectLock",
  summary: "Whether the lock is held, with fence, TTL and meta; never the token",
  request: { params: NameParams },
  responses: { 200: json(LockInfoSchema, "State"), ...common },
});

/** Registers the lock routes on `app`. */
export function lockRoutes(app: OpenAPIHono<AppEnv>): void {
  app.openapi(acquireRoute, async (c) => {
    const { name } = c.req.valid("param");
    const options = c.req.valid("json");
    const receivedAt = performance.now();
    const result = await waitFor(
      c,
      options.waitMs,
      (signal) => c.var.locks.acquire(name, { ...options, signal }),
    );
    if (!result.acquired) throw busyError(name, result);
    return c.json({ ...leaseBody(result.lease), waitedMs: waited(result.lease, receivedAt) }, 200);
  });

  app.openapi(acquireAllRoute, async (c) => {
    const { names, ...options } = c.req.valid("json");
    const receivedAt = performance.now();
    const result = await waitFor(
      c,
      options.waitMs,
      (signal) => c.var.locks.acquireAll(names, { ...options, signal }),
    );
    if (!result.acquired) throw busyError(names.join(", "), result);
    const waitedMs = waited(result.leases[0]!, receivedAt);
    return c.json({ leases: result.leases.map(leaseBody), waitedMs }, 200);
  });

  app.openapi(renewRoute, async (c) => {
    const { name } = c.req.valid("param");
    const { token, ttlMs } = c.req.valid("json");
    const result = await c.var.locks.renew({ name, token }, { ttlMs });
    if (!result.renewed) {
      throw new EdgelockError(
        "lock_lost",
        `Cannot renew lock "${name}": the token does not hold it`,
      );
    }
    return c.json(leaseBody(result.lease), 200);
  });

  app.openapi(renewManyRoute, async (c) => {
    const { leases, ttlMs } = c.req.valid("json");
    const results = await c.var.locks.renewMany(leases, { ttlMs });
    return c.json({
      results: results.map((result, i) =>
        result.renewed
          ? { ...leaseBody(result.lease), renewed: true as const }
          : { name: leases[i]!.name, renewed: false as const }
      ),
    }, 200);
  });

  app.openapi(releaseRoute, async (c) => {
    const { name } = c.req.valid("param");
    const { token, fence, hold } = c.req.valid("json");
    return c.json({ released: await c.var.locks.release({ name, token, fence, hold }) }, 200);
  });

  app.openapi(inspectRoute, async (c) => {
    const { name } = c.req.valid("param");
    return c.json(await c.var.locks.inspect(name), 200);
  });
}

// Waiting stops when the client goes away; each tenant has a bounded number of waits. A call
// that does not wait is one script, so only a wait takes the request's signal.
function waitFor<T>(
  c: Context<AppEnv>,
  waitMs: number | undefined,
  acquire: (signal?: AbortSignal) => Promise<T | typeof GONE>,
): Promise<T | typeof GONE> {
  if (!waitMs) return acquire();
  const signal = c.req.raw.signal;
  return c.var.wait(() =>
    acquire(signal).catch((error) => {
      if (signal.aborted) return GONE;
      throw error;
    })
  );
}
const GONE = { acquired: false as const, retryAfterMs: 1, reason: "busy" as const };

// How long the service waited before the request to Redis that granted the lease, ms.
function waited(lease: Lease, receivedAt: number): number {
  return Math.max(0, Math.floor((sentAtOf(lease) ?? receivedAt) - receivedAt));
}

function leaseBody(lease: Lease) {
  const { name, token, fence, ttlMs, expiresAt, serverTime } = lease;
  return { name, token, fence, ttlMs, expiresAt, serverTime, ...leaseKind(lease) };
}
