import { createRoute, OpenAPIHono, z } from "@hono/zod-openapi";
import type { Context } from "hono";
import { bodyLimit } from "hono/body-limit";
import { HTTPException } from "hono/http-exception";
import { type ApiKey, findTenant, sha256 } from "./auth.ts";
import { EdgelockError, type ErrorCode } from "./errors.ts";
import { Locks } from "./locks.ts";
import { type RedisLike, runScript } from "./_runner.ts";
import { LIMITS, MAX_META_BYTES, NAME_PATTERN, TOKEN_PATTERN } from "./_validate.ts";
import { PING } from "./scripts.ts";
import { problem } from "./_problem.ts";
import type { Lease } from "./types.ts";

/** What {@linkcode createApp} needs; each runtime's entry builds it from its own environment. */
export interface AppDeps {
  /** An `@upstash/redis` client (or anything with its `evalsha` and `eval`). */
  redis: RedisLike;
  /** The tenants and their secrets, e.g. from `parseApiKeys(LOCK_API_KEYS)`. */
  apiKeys: readonly ApiKey[];
  /** Prefix of every Redis key; each tenant's keys live under `<prefix>:<tenant>`. @default "edgelock" */
  keyPrefix?: string;
}

/** The largest request body, in bytes. */
export const MAX_BODY_BYTES = 64 * 1024;

const STATUS: Record<ErrorCode, 400 | 401 | 404 | 409 | 413 | 500 | 503> = {
  invalid_request: 400,
  unauthorized: 401,
  not_found: 404,
  payload_too_large: 413,
  lock_busy: 409,
  lock_lost: 409,
  backend_unavailable: 503,
  internal_error: 500,
};

const TITLES: Record<ErrorCode, string> = {
  invalid_request: "The request is not valid",
  unauthorized: "Missing or unknown API key",
  not_found: "No such route",
  payload_too_large: "The request body is too large",
  lock_busy: "The lock is held by another token",
  lock_lost: "The lease is no longer held by this token",
  backend_unavailable: "Redis is unreachable",
  internal_error: "An unexpected error (a bug in edgelock)",
};

// ---- schemas: they validate the requests and generate /openapi.json ----

const Name = z.string().regex(NAME_PATTERN).openapi({
  description: "1–200 characters of A-Z a-z 0-9 . _ : -",
  example: "invoice:42",
});
const Token = z.string().regex(TOKEN_PATTERN).openapi({
  description: "Owner token: 16–128 characters of A-Z a-z 0-9 _ -",
  example: "b3JkZXItNDItd29ya2VyLTE",
});
const duration = (field: keyof typeof LIMITS, description: string) =>
  z.number().int().min(LIMITS[field].min).max(LIMITS[field].max).openapi({ description });
const Meta = z.record(z.string(), z.unknown()).refine(
  (meta) => new TextEncoder().encode(JSON.stringify(meta)).length <= MAX_META_BYTES,
  { message: `meta must be at most ${MAX_META_BYTES} bytes as JSON` },
).openapi({ description: "A JSON object of at most 1 KiB, shown by GET" });

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
const ReleaseBody = z.strictObject({ token: Token }).openapi("ReleaseRequest");

const LeaseSchema = z.object({
  name: Name,
  token: Token,
  fence: z.number().int().openapi({ description: "Strictly increasing per name" }),
  ttlMs: z.number().int(),
  expiresAt: z.number().int().openapi({ description: "Epoch ms, Redis server clock" }),
  serverTime: z.number().int().openapi({ description: "Epoch ms, Redis server clock" }),
}).openapi("Lease");
const LockInfoSchema = z.object({
  name: Name,
  held: z.boolean(),
  fence: z.number().int().optional(),
  ttlMs: z.number().int().optional(),
  expiresAt: z.number().int().optional(),
  meta: z.record(z.string(), z.unknown()).optional(),
}).openapi("LockInfo");
const Problem = z.object({
  type: z.string(),
  title: z.string(),
  status: z.number().int(),
  detail: z.string(),
  code: z.string(),
  retryAfterMs: z.number().int().optional(),
  errors: z.array(z.object({ path: z.string(), message: z.string() })).optional(),
}).openapi("Problem");

const problemDoc = (description: string) => ({
  description,
  content: { "application/problem+json": { schema: Problem } },
});
const json = <T extends z.ZodType>(schema: T, description: string) => ({
  description,
  content: { "application/json": { schema } },
});
const body = <T extends z.ZodType>(schema: T) => ({
  required: true,
  content: { "application/json": { schema } },
});
const common = {
  400: problemDoc("invalid_request"),
  401: problemDoc("unauthorized"),
  413: problemDoc("payload_too_large"),
  503: problemDoc("backend_unavailable"),
};
const secured = { security: [{ bearer: [] }], tags: ["locks"] };

const acquireRoute = createRoute({
  ...secured,
  method: "post",
  path: "/v1/locks/{name}/acquire",
  operationId: "acquireLock",
  summary: "Acquire a lock (a retry with the holder's token returns the same fence)",
  request: { params: NameParams, body: body(AcquireBody) },
  responses: {
    200: json(LeaseSchema, "Acquired"),
    409: problemDoc("lock_busy, with retryAfterMs and Retry-After"),
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

type Env = { Variables: { locks: Locks } };

/** The edgelock HTTP service as a Hono app; runtime-agnostic. */
export function createApp({ redis, apiKeys, keyPrefix = "edgelock" }: AppDeps): OpenAPIHono<Env> {
  if (apiKeys.length === 0) throw new RangeError("createApp needs at least one API key");
  const digests = Promise.all(
    apiKeys.map(async ({ tenant, secret }) => ({ tenant, digest: await sha256(secret) })),
  );
  const locksByTenant = new Map(
    apiKeys.map(({ tenant }) => [tenant, new Locks(redis, { prefix: `${keyPrefix}:${tenant}` })]),
  );

  const app = new OpenAPIHono<Env>({
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
    c.set("locks", locksByTenant.get(tenant)!);
    await next();
  });

  app.openapi(acquireRoute, async (c) => {
    const { name } = c.req.valid("param");
    const options = c.req.valid("json");
    // Waiting stops when the client goes away.
    const signal = c.req.raw.signal;
    const result = await c.var.locks.acquire(name, { ...options, signal }).catch((error) => {
      if (signal.aborted) return { acquired: false as const, retryAfterMs: 1 };
      throw error;
    });
    if (!result.acquired) {
      throw new EdgelockError("lock_busy", `Lock "${name}" is held by another token`, {
        retryAfterMs: result.retryAfterMs,
      });
    }
    return c.json(leaseBody(result.lease), 200);
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

  app.openapi(releaseRoute, async (c) => {
    const { name } = c.req.valid("param");
    const { token } = c.req.valid("json");
    return c.json({ released: await c.var.locks.release({ name, token }) }, 200);
  });

  app.openapi(inspectRoute, async (c) => {
    const { name } = c.req.valid("param");
    return c.json(await c.var.locks.inspect(name), 200);
  });

  app.openapi(healthRoute, async (c) => {
    await runScript(redis, PING, [], []);
    return c.json({ ok: true as const }, 200);
  });

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
  return problem(STATUS[error.code], error.code, error.message, {
    title: TITLES[error.code],
    headers,
    extra,
  });
}
