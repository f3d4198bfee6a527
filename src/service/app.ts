import * as z from "zod/mini";
import { Hono } from "hono";
import { bodyLimit } from "hono/body-limit";
import { matchedRoutes } from "hono/route";
import { type ApiKey, authenticator } from "./auth.ts";
import { DEFAULT_PREFIX } from "../core/_validate.ts";
import { EdgelockError } from "../core/errors.ts";
import { Locks } from "../core/locks.ts";
import { LockOps } from "../core/ops.ts";
import { checkTimeout, keyLockingFor, type RedisLike, runScript } from "../core/_runner.ts";
import { PING } from "../core/lua/ping.ts";
import { Jobs } from "../uses/jobs.ts";
import { Records } from "../uses/records.ts";
import type { AppEnv, TenantStores } from "./_env.ts";
import { problemResponse, toEdgelockError } from "./_errors.ts";
import { type TenantLimiter, tenantLimiter, type TenantLimits } from "./_limits.ts";
import { json, problemDoc } from "./_schemas.ts";
import { route, unreadable } from "./_route.ts";
import { jobRoutes } from "./routes/jobs.ts";
import { lockRoutes } from "./routes/locks.ts";
import { recordRoutes } from "./routes/records.ts";
import { opsRoutes } from "./routes/ops.ts";
import { dashboardRoutes } from "./dashboard.ts";
import type { MiddlewareHandler } from "hono";
import type { LockEvent } from "../core/types.ts";
import { InvalidRange } from "../core/_invalid.ts";

/** What {@linkcode createApp} needs; each runtime's entry builds it from its own environment. */
export interface AppDeps {
  /** An `@upstash/redis` client (or anything with its `evalsha` and `eval`). */
  redis: RedisLike;
  /** The tenants and their secrets, e.g. from `parseApiKeys(LOCK_API_KEYS)`. */
  apiKeys: readonly ApiKey[];
  /**
   * Operators' keys, e.g. from `parseOperatorKeys(OPERATOR_API_KEYS)`: they read every tenant's
   * stats, list and audit, break locks, and scrape `/metrics` for all tenants; they cannot lock.
   */
  operatorKeys?: readonly ApiKey[];
  /** Told of every lock operation of every tenant, e.g. `openTelemetry()` from `/otel`. */
  onEvent?: (event: LockEvent & { tenant: string }) => void;
  /** Prefix of every Redis key; each tenant's keys live under `<prefix>:<tenant>`. @default "edgelock" */
  keyPrefix?: string;
  /** How long one Redis request may take before the reply is 503, ms. @default 2000 */
  redisTimeoutMs?: number;
  /** Keep stats and the held index (`/v1/stats`, `/v1/locks`, `/metrics` need them). @default true */
  stats?: boolean;
  /** Lay the keys out for a Redis Cluster (`LOCK_KEY_LAYOUT=cluster`; see `Locks`). @default false */
  cluster?: boolean;
  /** Upstash's per-key locking (`LOCK_KEY_LOCKING`; see `Locks`). @default on for `*.upstash.io` */
  keyLocking?: boolean;
  /** Per-tenant caps on this instance: concurrent waits and requests per second. */
  limits?: TenantLimits;
  /** Where each request's log line goes. @default one JSON line on the console */
  log?: (entry: RequestLog) => void;
}

/**
 * One line per request, for Workers Logs, Deno Deploy's logs or any JSON log pipeline. It names
 * the route template, never the lock name or key, and carries the internal detail of a failure
 * that the reply leaves out.
 */
export interface RequestLog {
  /** `info` below 400, `warn` for 4xx, `error` for 5xx. */
  level: "info" | "warn" | "error";
  /** Always `"request"`. */
  msg: "request";
  /** The `x-request-id` of the reply: the caller's, or a new one. */
  requestId: string;
  /** The HTTP method. */
  method: string;
  /** The matched route's template, e.g. `/v1/locks/:name/acquire`; `(none)` when none matched. */
  route: string;
  /** The reply's status. */
  status: number;
  /** Time from the request to the reply, ms. */
  durationMs: number;
  /** The tenant of the API key, once known. */
  tenant?: string;
  /** The problem code of a failed request. */
  code?: string;
  /** For 5xx: what failed, as the service saw it (never sent to the client). */
  error?: string;
}

/** The largest request body, in bytes. */
export const MAX_BODY_BYTES = 64 * 1024;

const REQUEST_ID = /^[A-Za-z0-9._:-]{1,128}$/;

/** The caller's `x-request-id` when it is 1–128 characters of `A-Z a-z 0-9 . _ : -`, else a new one. */
export function requestIdFrom(header: string | null | undefined): string {
  return header && REQUEST_ID.test(header) ? header : crypto.randomUUID();
}

/**
 * Where `GET /openapi.json` gets the prebuilt document, given the request's URL: `./mod.ts` builds
 * it in; the Worker fetches it from its static assets, so that its script does not carry it. A
 * reply other than 200 is a `config_error` (the document is missing where the service looks).
 */
export type OpenApiSource = (url: URL) => Response | Promise<Response>;

/** The edgelock HTTP service as a Hono app, its OpenAPI document from `openapi`; runtime-agnostic. */
export function serviceApp(deps: AppDeps, openapi: OpenApiSource): Hono<AppEnv> {
  const { redis, apiKeys, operatorKeys = [], log = logLine, stats = true } = deps;
  if (apiKeys.length === 0) throw new InvalidRange("createApp needs at least one API key");
  const timeoutMs = checkTimeout(deps.redisTimeoutMs);
  const keyLocking = keyLockingFor(redis, deps.keyLocking);
  const limiter = tenantLimiter(deps.limits);
  const byTenant = tenantStores(deps, { timeoutMs, keyLocking, stats }, limiter);

  const app = new Hono<AppEnv>();
  app.use("*", requestLogger(log));
  const limit = bodyLimit({ maxSize: MAX_BODY_BYTES, onError: tooLarge });
  // No route of GET or HEAD reads a body (and workerd refuses the copy bodyLimit makes of one).
  app.use("/v1/*", async (c, next) => {
    if (c.req.method === "GET" || c.req.method === "HEAD") return await next();
    // Errors after it are the routes', which Hono answers before they come back here.
    return await limit(c, next).catch((error) => Promise.reject(unreadable(error)));
  });
  const authenticate = authenticator(apiKeys, operatorKeys, byTenant, limiter);
  app.use("/v1/*", authenticate);
  app.use("/metrics", authenticate);

  opsRoutes(app, { stats });
  dashboardRoutes(app);
  lockRoutes(app);
  recordRoutes(app);
  jobRoutes(app);
  route(app, {
    method: "get",
    path: "/healthz",
    operationId: "health",
    summary: "200 when Redis answers",
    tags: ["service"],
    secured: false,
    responses: {
      200: json(z.object({ ok: z.literal(true) }), "Healthy"),
      405: problemDoc("method_not_allowed: a method other than GET or HEAD"),
      500: problemDoc("config_error: Redis refuses the service's credentials"),
      503: problemDoc("backend_unavailable"),
    },
  }, async (c) => {
    await runScript(redis, PING, [], [], { timeoutMs, keyLocking });
    return c.json({ ok: true as const }, 200);
  });
  // The OpenAPI document, built from the routes ahead of time (`deno task openapi`): its body
  // only, so every entry answers alike (no ETag or 304 from an asset server).
  app.get("/openapi.json", async (c) => {
    const reply = await openapi(new URL(c.req.url));
    if (reply.status !== 200) {
      await reply.body?.cancel();
      throw new EdgelockError(
        "config_error",
        `The OpenAPI document is missing where the service looks (HTTP ${reply.status}): ` +
          "deploy the Worker with the [assets] section of the repository's wrangler.toml",
      );
    }
    return new Response(reply.body, { headers: { "content-type": "application/json" } });
  });
  // Where a newcomer who opens the service's URL goes next.
  app.get("/", (c) =>
    c.json({
      service: "edgelock",
      api: "/v1 (Authorization: Bearer <api key>)",
      openapi: "/openapi.json",
      dashboard: "/dashboard",
      health: "/healthz",
    }));
  answerProblems(app);
  return app;
}

// Each tenant's stores, under `<keyPrefix>:<tenant>`, each with its share of the limits.
function tenantStores(
  { redis, apiKeys, keyPrefix = DEFAULT_PREFIX, cluster = false, onEvent }: AppDeps,
  run: { timeoutMs: number; keyLocking: boolean; stats: boolean },
  limiter: TenantLimiter,
): ReadonlyMap<string, TenantStores> {
  return new Map(apiKeys.map(({ tenant }) => {
    const { timeoutMs, keyLocking, stats } = run;
    const where = { prefix: `${keyPrefix}:${tenant}`, cluster, timeoutMs, keyLocking };
    const tell = onEvent && ((event: LockEvent) => onEvent({ ...event, tenant }));
    const observed = { ...where, stats, ...(tell && { onEvent: tell }) };
    return [tenant, {
      locks: new Locks(redis, observed),
      ops: new LockOps(redis, observed),
      records: new Records(redis, { ...where, stats }),
      jobs: new Jobs(redis, { ...where, stats }),
      wait: <T>(fn: () => Promise<T>) => limiter.wait(tenant, fn),
      charge: (requests: number) => limiter.charge(tenant, requests),
    }];
  }));
}

function tooLarge(): never {
  throw new EdgelockError("payload_too_large", `Bodies are limited to ${MAX_BODY_BYTES} bytes`);
}

// Every reply: an x-request-id, no caching, and one log line.
function requestLogger(log: (entry: RequestLog) => void): MiddlewareHandler<AppEnv> {
  return async (c, next) => {
    const startedAt = performance.now();
    const requestId = requestIdFrom(c.req.header("x-request-id"));
    c.set("requestId", requestId);
    await next();
    c.res.headers.set("x-request-id", requestId);
    c.res.headers.set("cache-control", "no-store");
    const { status } = c.res;
    const failure = c.get("failure");
    const route = matchedRoutes(c).findLast((r) => r.method !== "ALL")?.path ?? "(none)";
    log({
      level: status >= 500 ? "error" : status >= 400 ? "warn" : "info",
      msg: "request",
      requestId,
      method: c.req.method,
      route,
      status,
      durationMs: Math.round((performance.now() - startedAt) * 10) / 10,
      ...(c.get("tenant") && { tenant: c.get("tenant") }),
      ...(failure && { code: failure.code }),
      ...(failure && status >= 500 && { error: describe(failure) }),
    });
  };
}

// Every failure as problem+json: no route (404, or 405 with Allow), and any error thrown.
function answerProblems(app: Hono<AppEnv>): void {
  const allowed = methodsByPath(app);
  app.notFound((c) => {
    const allow = allowed(c.req.path);
    if (allow.length > 0) {
      c.set("failure", new EdgelockError("method_not_allowed", `Use ${allow.join(" or ")}`));
      return problemResponse(c, c.get("failure")!, { allow: allow.join(", ") });
    }
    c.set("failure", new EdgelockError("not_found", "No such route"));
    return problemResponse(c, c.get("failure")!);
  });
  app.onError((error, c) => {
    const failure = toEdgelockError(error);
    c.set("failure", failure);
    return problemResponse(c, failure);
  });
}

/** For a path no route of its method matches: the methods that routes of that path take. */
function methodsByPath(app: Hono<AppEnv>): (path: string) => string[] {
  let patterns: { pattern: RegExp; method: string }[] | undefined;
  return (path) => {
    patterns ??= app.routes.filter((route) => route.method !== "ALL").map((route) => ({
      method: route.method,
      pattern: new RegExp(
        `^${route.path.replace(/[.*+?^${}()|[\]\\]/g, "\\$&").replace(/:[A-Za-z]+/g, "[^/]+")}$`,
      ),
    }));
    const methods = new Set(patterns.filter((p) => p.pattern.test(path)).map((p) => p.method));
    if (methods.has("GET")) methods.add("HEAD");
    return [...methods];
  };
}

function describe(error: EdgelockError): string {
  const said = error.cause instanceof Error ? error.cause.message : "";
  const cause = said && said !== "undefined" && !error.message.includes(said) ? `: ${said}` : "";
  return `${error.message}${cause}`.slice(0, 2000);
}

function logLine(entry: RequestLog): void {
  const line = JSON.stringify(entry);
  if (entry.level === "error") console.error(line);
  else if (entry.level === "warn") console.warn(line);
  else console.log(line);
}
