// Webhook deduplication over HTTP: claim an event id, mark it done, or release it.
import { createRoute, type OpenAPIHono, z } from "@hono/zod-openapi";
import { EdgelockError } from "../../core/errors.ts";
import { recordId } from "../../uses/records.ts";
import { DEDUPE_RETENTION_MS } from "../../uses/dedupe.ts";
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

const NamespaceId = z.object({ namespace: nameParam("namespace"), id: nameParam("id") });
const DedupeClaimBody = z.strictObject({
  leaseMs,
  retentionMs: retentionMs("604800000, 7 days"),
  token: Token.optional(),
}).openapi("DedupeClaimRequest");

/** Registers the deduplication routes on `app`. */
export function dedupeRoutes(app: OpenAPIHono<AppEnv>): void {
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
      const claim = await c.var.records.claim("dedupe", recordId(namespace, id), {
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
      const done = await c.var.records.complete(
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
      const released = await c.var.records.release("dedupe", rid, c.req.valid("json").token);
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
      const record = await c.var.records.get("dedupe", recordId(namespace, id));
      if (record.state !== "completed") return c.json(record, 200);
      return c.json({ state: "done", expiresAt: record.expiresAt }, 200);
    },
  );
}
