// Idempotent submissions over HTTP: claim a key, complete it with the response, or release it.
import { createRoute, type OpenAPIHono, z } from "@hono/zod-openapi";
import { EdgelockError } from "../../core/errors.ts";
import { MAX_RESPONSE_BYTES, recordId } from "../../uses/records.ts";
import type { AppEnv } from "../_env.ts";
import {
  Claimed,
  common,
  json,
  leaseMs,
  nameParam,
  post,
  problemDoc,
  retentionMs,
  secured,
  Token,
  TokenBody,
} from "../_schemas.ts";

const ScopeKey = z.object({ scope: nameParam("scope"), key: nameParam("key") });
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

/** Registers the idempotency routes on `app`. */
export function idempotencyRoutes(app: OpenAPIHono<AppEnv>): void {
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
      const claim = await c.var.records.claim(
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
      if (!(await c.var.records.complete("idempotency", id, token, response))) {
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
      const released = await c.var.records.release("idempotency", id, c.req.valid("json").token);
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
      return c.json(await c.var.records.get("idempotency", recordId(scope, key)), 200);
    },
  );
}
