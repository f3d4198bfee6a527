// The record routes, for both kinds: idempotency keys (/v1/idempotency/{scope}/{key}) and
// deduplicated event ids (/v1/dedupe/{namespace}/{id}). Each kind can claim, renew its claim,
// complete it (dedupe: "done"), release it, and read its state; one script each.
import { createRoute, type OpenAPIHono, z } from "@hono/zod-openapi";
import { EdgelockError } from "../../core/errors.ts";
import { DEFAULT_RETENTION_MS } from "../../core/_validate.ts";
import { DEDUPE_RETENTION_MS } from "../../uses/dedupe.ts";
import {
  MAX_RESPONSE_BYTES,
  recordId,
  type RecordKind,
  SEGMENT_PATTERN,
} from "../../uses/records.ts";
import type { AppEnv } from "../_env.ts";
import {
  Claimed,
  common,
  duration,
  json,
  leaseMs,
  post,
  problemDoc,
  retentionMs,
  secured,
  Token,
  TokenBody,
} from "../_schemas.ts";

/** How each kind of record looks over HTTP. */
const KINDS = [
  {
    kind: "idempotency",
    tag: "idempotency",
    params: ["scope", "key"],
    done: "complete",
    doneState: "completed",
    name: "IdempotencyKey",
    retention: DEFAULT_RETENTION_MS,
  },
  {
    kind: "dedupe",
    tag: "dedupe",
    params: ["namespace", "id"],
    done: "done",
    doneState: "done",
    name: "Dedupe",
    retention: DEDUPE_RETENTION_MS,
  },
] as const;

const segment = (name: string) =>
  z.string().regex(SEGMENT_PATTERN).openapi({
    param: { name, in: "path" },
    description: "A name (1–200 characters of A-Z a-z 0-9 . _ : -) or # and a SHA-256 in hex",
  });
const StoredResponse = z.record(z.string(), z.unknown()).refine(
  (response) => new TextEncoder().encode(JSON.stringify(response)).length <= MAX_RESPONSE_BYTES,
  { message: `response must be at most ${MAX_RESPONSE_BYTES} bytes as JSON` },
).openapi("StoredResponse", {
  description: "Any JSON object, e.g. { status, headers, body }, replayed as stored",
});
const CompleteBody = z.strictObject({ token: Token, response: StoredResponse.optional() })
  .openapi("CompleteRequest");
const RenewBody = z.strictObject({
  token: Token,
  leaseMs: duration("leaseMs", "New claim lease from now, ms (default 30000)").optional(),
}).openapi("RenewClaimRequest");
const Renewed = z.union([
  z.object({ renewed: z.literal(true), leaseExpiresAt: z.number().int() }),
  z.object({ renewed: z.literal(false) }),
]).openapi("ClaimRenewal");

/** Registers the idempotency and deduplication routes on `app`. */
export function recordRoutes(app: OpenAPIHono<AppEnv>): void {
  for (const spec of KINDS) register(app, spec);
}

// One kind's names and schemas, for its routes.
function kindOf(spec: (typeof KINDS)[number]) {
  const { kind, params: [a, b], doneState } = spec;
  const Done = z.object({ state: z.literal(doneState), response: StoredResponse.optional() });
  return {
    ...spec,
    b,
    recordKind: kind as RecordKind,
    base: `/v1/${kind}/{${a}}/{${b}}`,
    Params: z.object({ [a]: segment(a), [b]: segment(b) }),
    idOf: (param: Record<string, string>) => recordId(param[a]!, param[b]!),
    Done,
  };
}

type Kind = ReturnType<typeof kindOf>;

function register(app: OpenAPIHono<AppEnv>, spec: (typeof KINDS)[number]): void {
  const kind = kindOf(spec);
  claimRoute(app, kind);
  renewRoute(app, kind);
  completeRoute(app, kind);
  releaseRoute(app, kind);
  stateRoute(app, kind);
}

// Claim: the first caller gets the work; later ones learn it is done, in flight, or mismatched.
function claimRoute(app: OpenAPIHono<AppEnv>, kind: Kind): void {
  const { tag, name, base, Params, idOf, recordKind, done, doneState, retention, b, Done } = kind;
  const ClaimBody = z.strictObject({
    leaseMs,
    retentionMs: retentionMs(String(retention)),
    token: Token.optional().openapi({ description: "Choose it to make retries safe" }),
    fingerprint: z.string().max(128).optional().openapi({ description: "Identifies the payload" }),
  }).openapi(`${name}ClaimRequest`);
  app.openapi(
    createRoute({
      ...post(tag, `claim${name}`, `${base}/claim`, Params, ClaimBody),
      summary: `Claim the ${b} for one worker, or learn that it is ${doneState}`,
      responses: {
        201: json(Claimed, `Claimed: do the work, then ${done} or release`),
        200: json(Done, `Already ${doneState}, with the stored response`),
        409: problemDoc("in_progress, with retryAfterMs"),
        422: problemDoc("fingerprint_mismatch"),
        ...common,
      },
    }),
    async (c) => {
      const { retentionMs = retention, ...rest } = c.req.valid("json");
      const claim = await c.var.records.claim(recordKind, idOf(c.req.valid("param")), {
        ...rest,
        retentionMs,
      });
      if (claim.state === "claimed") return c.json(claim, 201);
      if (claim.state === "completed") {
        return c.json(
          { state: doneState, ...(claim.response && { response: claim.response }) },
          200,
        );
      }
      if (claim.state === "mismatch") {
        throw new EdgelockError(
          "fingerprint_mismatch",
          `The ${b} was claimed with another fingerprint`,
        );
      }
      throw new EdgelockError("in_progress", `The first claim of this ${b} is in flight`, {
        retryAfterMs: claim.retryAfterMs,
      });
    },
  );
}

function renewRoute(app: OpenAPIHono<AppEnv>, { tag, name, base, Params, idOf, recordKind }: Kind) {
  app.openapi(
    createRoute({
      ...post(tag, `renew${name}`, `${base}/renew`, Params, RenewBody),
      summary: "Extend a claim still held by this token (long work)",
      responses: { 200: json(Renewed, "Whether the claim was still held"), ...common },
    }),
    async (c) => {
      const { token, leaseMs } = c.req.valid("json");
      const id = idOf(c.req.valid("param"));
      return c.json(await c.var.records.renew(recordKind, id, token, leaseMs), 200);
    },
  );
}

function completeRoute(app: OpenAPIHono<AppEnv>, kind: Kind): void {
  const { tag, name, base, Params, idOf, recordKind, done, doneState } = kind;
  app.openapi(
    createRoute({
      ...post(tag, `${done}${name}`, `${base}/${done}`, Params, CompleteBody),
      summary: "Mark it done, keeping the response for the retention (only the claim's token can)",
      responses: {
        200: json(z.object({ state: z.literal(doneState) }), "Stored"),
        409: problemDoc("lease_lost"),
        ...common,
      },
    }),
    async (c) => {
      const { token, response } = c.req.valid("json");
      if (
        !(await c.var.records.complete(recordKind, idOf(c.req.valid("param")), token, response))
      ) {
        throw new EdgelockError("lease_lost", "The claim is no longer held by this token");
      }
      return c.json({ state: doneState }, 200);
    },
  );
}

function releaseRoute(
  app: OpenAPIHono<AppEnv>,
  { tag, name, base, Params, idOf, recordKind }: Kind,
) {
  app.openapi(
    createRoute({
      ...post(tag, `release${name}`, `${base}/release`, Params, TokenBody),
      summary: "Give it back: the work failed cleanly and a retry may redo it",
      responses: { 200: json(z.object({ released: z.boolean() }), "Done"), ...common },
    }),
    async (c) => {
      const id = idOf(c.req.valid("param"));
      const released = await c.var.records.release(recordKind, id, c.req.valid("json").token);
      return c.json({ released }, 200);
    },
  );
}

function stateRoute(app: OpenAPIHono<AppEnv>, kind: Kind): void {
  const { tag, name, base, Params, idOf, recordKind, doneState, Done } = kind;
  app.openapi(
    createRoute({
      ...secured(tag),
      method: "get",
      path: base,
      operationId: `get${name}`,
      summary:
        `The state: absent, in_progress or ${doneState} (with the response); never the token`,
      request: { params: Params },
      responses: {
        200: json(
          z.union([
            z.object({ state: z.literal("absent") }),
            z.object({
              state: z.literal("in_progress"),
              fence: z.number().int(),
              leaseExpiresAt: z.number().int(),
            }),
            Done.extend({ expiresAt: z.number().int() }),
          ]).openapi(`${name}State`),
          "State",
        ),
        ...common,
      },
    }),
    async (c) => {
      const record = await c.var.records.get(recordKind, idOf(c.req.valid("param")));
      if (record.state !== "completed") return c.json(record, 200);
      return c.json({ ...record, state: doneState }, 200);
    },
  );
}
