import { createRoute, OpenAPIHono, z } from "@hono/zod-openapi";
import type { Context } from "hono";
import { bodyLimit } from "hono/body-limit";
import { HTTPException } from "hono/http-exception";
import { type ApiKey, findTenant } from "./auth.ts";
import { sha256 } from "../core/_crypto.ts";
import { busyError, EdgelockError, type ErrorCode } from "../core/errors.ts";
import { Locks } from "../core/locks.ts";
import { sentAtOf } from "../core/_granted.ts";
import { tenantLimiter, type TenantLimits } from "./_limits.ts";
import { Store } from "../uses/store.ts";
import { type AppEnv, registerUseRoutes } from "./uses_routes.ts";
import { checkTimeout, type RedisLike, runScript } from "../core/_runner.ts";
import { body, common, duration, json, Meta, Name, problemDoc, Token } from "./_schemas.ts";
import { PING } from "../core/scripts.ts";
import { problem } from "../hono/_problem.ts";
import type { Lease } from "../core/types.ts";

/** What {@linkcode createApp} needs; each runtime's entry builds it from its own environment. */
export interface AppDeps {
  /** An `@upstash/redis` client (or anything with its `evalsha` and `eval`). */
  redis: RedisLike;
  /** The tenants and their secrets, e.g. from `parseApiKeys(LOCK_API_KEYS)`. */
  apiKeys: readonly ApiKey[];
  /** Prefix of every Redis key; each tenant's keys live under `<prefix>:<tenant>`. @default "edgelock" */
  keyPrefix?: string;
  /** How long one Redis request may take before the reply is 503, ms. @default 2000 */
  redisTimeoutMs?: number;
  /** Per-tenant caps on this instance: concurrent waits and requests per second. */
  limits?: TenantLimits;
}

/** The largest request body, in bytes. */
export const MAX_BODY_BYTES = 64 * 1024;

const STATUS: Record<ErrorCode, 400 | 401 | 404 | 409 | 413 | 422 | 429 | 500 | 503> = {
  invalid_request: 400,
  unauthorized: 401,
  not_found: 404,
  payload_too_large: 413,
  lock_busy: 409,
  queue_full: 409,
  too_many_requests: 429,
  lock_lost: 409,
  in_progress: 409,
  lease_lost: 409,
  fingerprint_mismatch: 422,
  backend_unavailable: 503,
  internal_error: 500,
};

const TITLES: Record<ErrorCode, string> = {
  invalid_request: "The request is not valid",
  unauthorized: "Missing or unknown API key",
  not_found: "No such route",
  payload_too_large: "The request body is too large",
  lock_busy: "The lock is held by another token",
  queue_full: "Too many callers wait for this lock already",
  too_many_requests: "This tenant is over its request limit",
  lock_lost: "The lease is no longer held by this token",
  in_progress: "Another request with this key is in flight",
  lease_lost: "The claim is no longer held by this token",
  fingerprint_mismatch: "This key was used with another payload",
  backend_unavailable: "Redis is unreachable",
  internal_error: "An unexpected error (a bug in edgelock)",
};

const NameParams = z.object({ name: Name.openapi({ param: { name: "name", in: "path" } }) });
const AcquireBody = z.strictObject({
  ttlMs: duration("ttlMs", "Lease length in ms (default 10000)").optional(),
  waitMs: duration("waitMs", "How long the server waits for a busy lock, ms (default 0)")
    .optional(),
  token: Token.optional().openapi({ description: "Choose it to make retries safe" }),
  meta: Meta.optional(),
}).openapi("AcquireRequest");
const RenewBody = z.strictObject({
  token: Token,
  ttlMs: duration("ttlMs", "New lease length from now, ms"),
}).openapi("RenewRequest");
const ReleaseBody = z.strictObject({
  token: Token,
  fence: z.number().int().positive().max(Number.MAX_SAFE_INTEGER).optional().openapi({
    description: "The lease's fence: a retried release then answers true for exactly this lease",
  }),
}).openapi("ReleaseRequest");

const LeaseSchema = z.object({
  name: Name,
  token: Token,
  fence: z.number().int().openapi({ description: "Strictly increasing per name" }),
  ttlMs: z.number().int(),
  expiresAt: z.number().int().openapi({ description: "Epoch ms, Redis server clock" }),
  serverTime: z.number().int().openapi({ description: "Epoch ms, Redis server clock" }),
}).openapi("Lease");
const AcquiredSchema = LeaseSchema.extend({
  waitedMs: z.number().int().nonnegative().optional().openapi({
    description: "How long the service waited before the request to Redis that granted the " +
      "lease, ms: the lease is valid at least ttlMs from when the client sent its request plus this",
  }),
}).openapi("AcquiredLease");
const LockInfoSchema = z.object({
  name: Name,
  held: z.boolean(),
  fence: z.number().int().optional(),
  ttlMs: z.number().int().optional(),
  expiresAt: z.number().int().optional(),
  meta: z.record(z.string(), z.unknown()).optional(),
}).openapi("LockInfo");
const secured = { security: [{ bearer: [] }], tags: ["locks"] };

const acquireRoute = createRoute({
  ...secured,
  method: "post",
  path: "/v1/locks/{name}/acquire",
  operationId: "acquireLock",
  summary: "Acquire a lock (a retry with the holder's token returns the same fence)",
  request: { params: NameParams, body: body(AcquireBody) },
  responses: {
    200: json(AcquiredSchema, "Acquired"),
    409: problemDoc("lock_busy or queue_full, with retryAfterMs and Retry-After"),
    429: problemDoc("too_many_requests: this tenant's concurrent waits or request rate"),
    ...common,
  },
});
const renewRoute = createRoute({
  ...secured,
  method: "post",
  path: "/v1/locks/{name}/renew",
  operationId: "renewLock",
  summary: "Extend a lease held by this token; the fence stays the same",
  request: { params: NameParams, body: body(RenewBody) },
  responses: { 200: json(LeaseSchema, "Renewed"), 409: problemDoc("lock_lost"), ...common },
});
const RenewManyBody = z.strictObject({
  ttlMs: duration("ttlMs", "New lease length from now, ms (default 10000)").optional(),
  leases: z.array(z.strictObject({ name: Name, token: Token })).min(1).max(1000),
}).openapi("RenewManyRequest");
const renewManyRoute = createRoute({
  ...secured,
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
          z.object({ name: Name, renewed: z.literal(false) }),
        ])),
      }).openapi("RenewManyResults"),
      "One result per lease, in order",
    ),
    ...common,
  },
});
const releaseRoute = createRoute({
  ...secured,
  method: "post",
  path: "/v1/locks/{name}/release",
  operationId: "releaseLock",
  summary: "Release a lease; released is false when this token no longer held it",
  request: { params: NameParams, body: body(ReleaseBody) },
  responses: {
    200: json(z.object({ released: z.boolean() }).openapi("Released"), "Done"),
    ...common,
  },
});
const inspectRoute = createRoute({
  ...secured,
  method: "get",
  path: "/v1/locks/{name}",
  operationId: "inspectLock",
  summary: "Whether the lock is held, with fence, TTL and meta; never the token",
  request: { params: NameParams },
  responses: { 200: json(LockInfoSchema, "State"), ...common },
});
const healthRoute = createRoute({
  method: "get",
  path: "/healthz",
  operationId: "health",
  summary: "200 when Redis answers",
  tags: ["service"],
  security: [],
  responses: {
    200: json(z.object({ ok: z.literal(true) }), "Healthy"),
    503: problemDoc("backend_unavailable"),
  },
});

/** The edgelock HTTP service as a Hono app; runtime-agnostic. */
export function createApp(
  { redis, apiKeys, keyPrefix = "edgelock", redisTimeoutMs, limits }: AppDeps,
): OpenAPIHono<AppEnv> {
  if (apiKeys.length === 0) throw new RangeError("createApp needs at least one API key");
  const timeoutMs = checkTimeout(redisTimeoutMs);
  const limiter = tenantLimiter(limits);
  const digests = Promise.all(
    apiKeys.map(async ({ tenant, secret }) => ({ tenant, digest: await sha256(secret) })),
  );
  const byTenant = new Map(apiKeys.map(({ tenant }) => {
    const prefix = `${keyPrefix}:${tenant}`;
    return [tenant, {
      locks: new Locks(redis, { prefix, timeoutMs }),
      store: new Store(redis, { prefix, timeoutMs }),
    }];
  }));

  const app = new OpenAPIHono<AppEnv>({
    defaultHook(result) {
      if (!result.success) {
        throw new EdgelockError("invalid_request", "The request does not match the schema", {
          cause: result.error.issues.map((issue) => ({
            path: issue.path.map(String).join(".") || "(body)",
            message: issue.message,
          })),
        });
      }
    },
  });

  app.use("/v1/*", async (c, next) => {
    await next();
    c.res.headers.set("cache-control", "no-store");
  });
  app.use(
    "/v1/*",
    bodyLimit({
      maxSize: MAX_BODY_BYTES,
      onError() {
        throw new EdgelockError(
          "payload_too_large",
          `Bodies are limited to ${MAX_BODY_BYTES} bytes`,
        );
      },
    }),
  );
  app.use("/v1/*", async (c, next) => {
    const header = c.req.header("authorization") ?? "";
    const match = /^Bearer ([\x21-\x7e]{1,256})$/.exec(header);
    const tenant = match ? await findTenant(await digests, match[1]!) : undefined;
    if (!tenant) {
      throw new EdgelockError("unauthorized", "Send Authorization: Bearer <api key>");
    }
    limiter.admit(tenant);
    const { locks, store } = byTenant.get(tenant)!;
    c.set("tenant", tenant);
    c.set("locks", locks);
    c.set("store", store);
    await next();
  });

  app.openapi(acquireRoute, async (c) => {
    const { name } = c.req.valid("param");
    const options = c.req.valid("json");
    const receivedAt = performance.now();
    // Waiting stops when the client goes away; each tenant has a bounded number of waits.
    const signal = c.req.raw.signal;
    const acquire = () =>
      c.var.locks.acquire(name, { ...options, signal }).catch((error) => {
        if (signal.aborted) {
          return { acquired: false as const, retryAfterMs: 1, reason: "busy" as const };
        }
        throw error;
      });
    const result = options.waitMs ? await limiter.wait(c.var.tenant, acquire) : await acquire();
    if (!result.acquired) throw busyError(name, result);
    const waitedMs = Math.max(0, Math.floor((sentAtOf(result.lease) ?? receivedAt) - receivedAt));
    return c.json({ ...leaseBody(result.lease), waitedMs }, 200);
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
    const { token, fence } = c.req.valid("json");
    return c.json({ released: await c.var.locks.release({ name, token, fence }) }, 200);
  });

  app.openapi(inspectRoute, async (c) => {
    const { name } = c.req.valid("param");
    return c.json(await c.var.locks.inspect(name), 200);
  });

  app.openapi(healthRoute, async (c) => {
    await runScript(redis, PING, [], [], timeoutMs);
    return c.json({ ok: true as const }, 200);
  });

  registerUseRoutes(app);

  app.openAPIRegistry.registerComponent("securitySchemes", "bearer", {
    type: "http",
    scheme: "bearer",
    description: "A tenant's secret from LOCK_API_KEYS",
  });
  app.doc31("/openapi.json", {
    openapi: "3.1.0",
    servers: [{ url: "/", description: "This service" }],
    info: {
      title: "edgelock",
      version: "1",
      description: "Distributed locks with fencing tokens for edge runtimes",
    },
  });

  app.notFound(() => {
    throw new EdgelockError("not_found", "No such route");
  });
  app.onError((error, c) => problemResponse(c, toEdgelockError(error)));
  return app;
}

function leaseBody({ name, token, fence, ttlMs, expiresAt, serverTime }: Lease) {
  return { name, token, fence, ttlMs, expiresAt, serverTime };
}

function toEdgelockError(error: unknown): EdgelockError {
  if (error instanceof EdgelockError) return error;
  // The library's own argument checks (the same limits as the schemas).
  if (error instanceof RangeError || error instanceof TypeError) {
    return new EdgelockError("invalid_request", error.message);
  }
  // Hono's validators: malformed JSON (400), a body that is not application/json (415).
  if (error instanceof HTTPException && error.status === 415) {
    return new EdgelockError("invalid_request", "Send the body as Content-Type: application/json");
  }
  if (error instanceof HTTPException && error.status < 500) {
    return new EdgelockError("invalid_request", error.message || "Malformed request");
  }
  console.error("edgelock: unexpected error", error);
  return new EdgelockError("internal_error", "The service failed unexpectedly");
}

function problemResponse(c: Context, error: EdgelockError): Response {
  const headers: Record<string, string> = {};
  if (c.req.path.startsWith("/v1/")) headers["cache-control"] = "no-store";
  if (error.retryAfterMs !== undefined) {
    headers["retry-after"] = String(Math.max(1, Math.ceil(error.retryAfterMs / 1000)));
  }
  const extra: Record<string, unknown> = {};
  if (error.retryAfterMs !== undefined) extra.retryAfterMs = error.retryAfterMs;
  if (error.code === "invalid_request" && Array.isArray(error.cause)) extra.errors = error.cause;
  // The library's message names the script and carries the upstream error: not for clients.
  const detail = error.code === "backend_unavailable"
    ? "Redis did not answer in time or could not be reached; try again shortly"
    : error.message;
  return problem(STATUS[error.code], error.code, detail, {
    title: TITLES[error.code],
    headers,
    extra,
  });
}
