// HTTP routes for the three uses: idempotent submissions, webhook deduplication, cron jobs.
import { createRoute, type OpenAPIHono, z } from "@hono/zod-openapi";
import { body, common, duration, json, nameParam, problemDoc, Token } from "./_schemas.ts";
import { EdgelockError } from "../core/errors.ts";
import type { Locks } from "../core/locks.ts";
import { MAX_RESPONSE_BYTES, recordId, type Store } from "../uses/store.ts";
import { DEDUPE_RETENTION_MS } from "../uses/dedupe.ts";

/** The variables the auth middleware sets for each request: the tenant's own stores. */
export type AppEnv = { Variables: { tenant: string; locks: Locks; store: Store } };

const ScopeKey = z.object({ scope: nameParam("scope"), key: nameParam("key") });
const NamespaceId = z.object({ namespace: nameParam("namespace"), id: nameParam("id") });
const JobParam = z.object({ job: nameParam("job") });
const TokenBody = z.strictObject({ token: Token }).openapi("TokenRequest");
const leaseMs = duration("leaseMs", "Claim lease, ms (default 30000)").optional();
const retentionMs = (fallback: string) =>
  duration("retentionMs", `How long the result is kept, ms (default ${fallback})`).optional();

const ClaimBody = z.strictObject({
  fingerprint: z.string().max(128).optional().openapi({ description: "Identifies the payload" }),
  leaseMs,
  retentionMs: retentionMs("86400000"),
  token: Token.optional().openapi({ description: "Choose it to make retries safe" }),
}).openapi("IdempotencyClaimRequest");
const StoredResponse = z.strictObject({
  status: z.number().int().min(100).max(599),
  headers: z.record(z.string(), z.string()).optional(),
  body: z.unknown().optional(),
}).openapi("StoredResponse");
const CompleteBody = z.strictObject({
  token: Token,
  response: StoredResponse.refine(
    (response) => new TextEncoder().encode(JSON.stringify(response)).length <= MAX_RESPONSE_BYTES,
    { message: `response must be at most ${MAX_RESPONSE_BYTES} bytes as JSON` },
  ),
}).openapi("IdempotencyCompleteRequest");
const Claimed = z.object({
  state: z.literal("claimed"),
  token: Token,
  fence: z.number().int(),
  leaseExpiresAt: z.number().int(),
});
const DedupeClaimBody = z.strictObject({
  leaseMs,
  retentionMs: retentionMs("604800000, 7 days"),
  token: Token.optional(),
}).openapi("DedupeClaimRequest");
const StartBody = z.strictObject({
  atMostMs: duration("atMostMs", "The crash safety net, ms"),
  atLeastMs: duration("atLeastMs", "Minimum time between starts, ms (≤ atMostMs)").optional(),
  tick: z.union([z.string().regex(/^[A-Za-z0-9._:-]{1,200}$/), z.number().int().nonnegative()])
    .optional().openapi({ description: "Each tick runs at most once, e.g. the scheduled time" }),
  token: Token.optional(),
}).openapi("JobStartRequest");

const secured = (tag: string) => ({ security: [{ bearer: [] }], tags: [tag] });
const post = <P extends z.ZodType, B extends z.ZodType>(
  tag: string,
  operationId: string,
  path: string,
  params: P,
  schema: B,
) => ({
  ...secured(tag),
  method: "post" as const,
  path,
  operationId,
  request: { params, body: body(schema) },
});

export function registerUseRoutes(app: OpenAPIHono<AppEnv>): void {
  // ---- idempotency ----
  const idem = "/v1/idempotency/{scope}/{key}";
  app.openapi(
    createRoute({
      ...post("idempotency", "claimIdempotencyKey", `${idem}/claim`, ScopeKey, ClaimBody),
      summary: "Claim a key for the first request, or get the stored response to replay",
      responses: {
        201: json(Claimed, "Claimed: run the request, then complete or release"),
        200: json(z.object({ state: z.literal("completed"), response: StoredResponse }), "Replay"),
        409: problemDoc("in_progress, with retryAfterMs"),
        422: problemDoc("fingerprint_mismatch"),
        ...common,
      },
    }),
    async (c) => {
      const { scope, key } = c.req.valid("param");
      const claim = await c.var.store.claim(
        "idempotency",
        recordId(scope, key),
        c.req.valid("json"),
      );
      if (claim.state === "claimed") return c.json(claim, 201);
      if (claim.state === "completed") {
        const response = claim.response as z.infer<typeof StoredResponse>;
        return c.json({ state: "completed" as const, response }, 200);
      }
      if (claim.state === "mismatch") {
        throw new EdgelockError(
          "fingerprint_mismatch",
          "The key was claimed with another fingerprint",
        );
      }
      throw new EdgelockError("in_progress", "The first request with this key is in flight", {
        retryAfterMs: claim.retryAfterMs,
      });
    },
  );
  app.openapi(
    createRoute({
      ...post("idempotency", "completeIdempotencyKey", `${idem}/complete`, ScopeKey, CompleteBody),
      summary: "Store the response for replays (only the claim's token can)",
      responses: {
        200: json(z.object({ state: z.literal("completed") }), "Stored"),
        409: problemDoc("lease_lost"),
        ...common,
      },
    }),
    async (c) => {
      const { scope, key } = c.req.valid("param");
      const { token, response } = c.req.valid("json");
      const id = recordId(scope, key);
      if (!(await c.var.store.complete("idempotency", id, token, response))) {
        throw new EdgelockError("lease_lost", "The claim is no longer held by this token");
      }
      return c.json({ state: "completed" as const }, 200);
    },
  );
  app.openapi(
    createRoute({
      ...post("idempotency", "releaseIdempotencyKey", `${idem}/release`, ScopeKey, TokenBody),
      summary: "Give the key back: the work failed cleanly and a retry may redo it",
      responses: { 200: json(z.object({ released: z.boolean() }), "Done"), ...common },
    }),
    async (c) => {
      const { scope, key } = c.req.valid("param");
      const id = recordId(scope, key);
      const released = await c.var.store.release("idempotency", id, c.req.valid("json").token);
      return c.json({ released }, 200);
    },
  );
  app.openapi(
    createRoute({
      ...secured("idempotency"),
      method: "get",
      path: idem,
      operationId: "getIdempotencyKey",
      summary: "The key's state: absent, in_progress or completed (with the response)",
      request: { params: ScopeKey },
      responses: { 200: json(z.object({ state: z.string() }).passthrough(), "State"), ...common },
    }),
    async (c) => {
      const { scope, key } = c.req.valid("param");
      return c.json(await c.var.store.get("idempotency", recordId(scope, key)), 200);
    },
  );

  // ---- webhook deduplication ----
  const dedupe = "/v1/dedupe/{namespace}/{id}";
  app.openapi(
    createRoute({
      ...post("dedupe", "claimDedupe", `${dedupe}/claim`, NamespaceId, DedupeClaimBody),
      summary: "Claim an event id; exactly one delivery gets claimed",
      responses: {
        201: json(Claimed, "Claimed: process it, then done or release"),
        200: json(z.object({ state: z.literal("done") }), "Already processed"),
        409: problemDoc("in_progress, with retryAfterMs"),
        ...common,
      },
    }),
    async (c) => {
      const { namespace, id } = c.req.valid("param");
      const { retentionMs = DEDUPE_RETENTION_MS, ...rest } = c.req.valid("json");
      const claim = await c.var.store.claim("dedupe", recordId(namespace, id), {
        ...rest,
        retentionMs,
      });
      if (claim.state === "claimed") return c.json(claim, 201);
      if (claim.state === "in_progress") {
        throw new EdgelockError("in_progress", "Another delivery of this id is in flight", {
          retryAfterMs: claim.retryAfterMs,
        });
      }
      return c.json({ state: "done" as const }, 200);
    },
  );
  app.openapi(
    createRoute({
      ...post("dedupe", "markDedupeDone", `${dedupe}/done`, NamespaceId, TokenBody),
      summary: "Mark the id processed, for the retention",
      responses: {
        200: json(z.object({ state: z.literal("done") }), "Done"),
        409: problemDoc("lease_lost"),
        ...common,
      },
    }),
    async (c) => {
      const { namespace, id } = c.req.valid("param");
      const done = await c.var.store.complete(
        "dedupe",
        recordId(namespace, id),
        c.req.valid("json").token,
      );
      if (!done) throw new EdgelockError("lease_lost", "The claim is no longer held by this token");
      return c.json({ state: "done" as const }, 200);
    },
  );
  app.openapi(
    createRoute({
      ...post("dedupe", "releaseDedupe", `${dedupe}/release`, NamespaceId, TokenBody),
      summary: "Give the id back so a redelivery can process it",
      responses: { 200: json(z.object({ released: z.boolean() }), "Done"), ...common },
    }),
    async (c) => {
      const { namespace, id } = c.req.valid("param");
      const rid = recordId(namespace, id);
      const released = await c.var.store.release("dedupe", rid, c.req.valid("json").token);
      return c.json({ released }, 200);
    },
  );
  app.openapi(
    createRoute({
      ...secured("dedupe"),
      method: "get",
      path: dedupe,
      operationId: "getDedupe",
      summary: "The id's state: absent, in_progress or done",
      request: { params: NamespaceId },
      responses: { 200: json(z.object({ state: z.string() }).passthrough(), "State"), ...common },
    }),
    async (c) => {
      const { namespace, id } = c.req.valid("param");
      const record = await c.var.store.get("dedupe", recordId(namespace, id));
      if (record.state !== "completed") return c.json(record, 200);
      return c.json({ state: "done", expiresAt: record.expiresAt }, 200);
    },
  );

  // ---- cron jobs ----
  app.openapi(
    createRoute({
      ...post("jobs", "startJob", "/v1/jobs/{job}/start", JobParam, StartBody),
      summary: "Start a run unless it runs elsewhere, ran too recently, or ran for this tick",
      responses: {
        200: json(
          z.union([
            z.object({
              run: z.literal(true),
              token: Token,
              fence: z.number().int(),
              expiresAt: z.number().int(),
            }),
            z.object({
              run: z.literal(false),
              reason: z.enum(["running", "too_soon", "tick_done"]),
              retryAfterMs: z.number().int(),
            }),
          ]),
          "Whether to run",
        ),
        ...common,
      },
    }),
    async (c) => {
      const { job } = c.req.valid("param");
      return c.json(await c.var.store.startJob(job, c.req.valid("json")), 200);
    },
  );
  app.openapi(
    createRoute({
      ...post("jobs", "finishJob", "/v1/jobs/{job}/finish", JobParam, TokenBody),
      summary: "Finish a run; the lock stays until atLeastMs after its start",
      responses: { 200: json(z.object({ finished: z.boolean() }), "Done"), ...common },
    }),
    async (c) => {
      const { job } = c.req.valid("param");
      const finished = await c.var.store.finishJob(job, c.req.valid("json").token);
      return c.json({ finished }, 200);
    },
  );
}
