// The record routes, for both kinds: idempotency keys (/v1/idempotency/{scope}/{key}) and
// deduplicated event ids (/v1/dedupe/{namespace}/{id}). Each kind can claim, renew its claim,
// complete it (dedupe: "done"), release it, and read its state; one script each.
import * as z from "zod/mini";
import type { Hono } from "hono";
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
import { route } from "../_route.ts";
import {
  Claimed,
  common,
  doc,
  duration,
  int,
  json,
  jsonObject,
  leaseMs,
  post,
  problemDoc,
  retentionMs,
  Token,
  token,
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

const segment = () =>
  doc(
    z.string().check(
      z.regex(
        SEGMENT_PATTERN,
        "must be 1–200 characters of A-Z a-z 0-9 . _ : -, or # and a SHA-256 in lowercase hex",
      ),
    ),
    {
      description: "A name (1–200 characters of A-Z a-z 0-9 . _ : -) or # and a SHA-256 in hex",
    },
  );
const StoredResponse = jsonObject("response", MAX_RESPONSE_BYTES, {
  id: "StoredResponse",
  description: "Any JSON object, e.g. { status, headers, body }, replayed as stored",
});
const CompleteBody = doc(
  z.strictObject({ token: Token, response: z.optional(StoredResponse) }),
  { id: "CompleteRequest" },
);
const RenewBody = doc(
  z.strictObject({
    token: Token,
    leaseMs: z.optional(duration("leaseMs", "New claim lease from now, ms (default 30000)")),
  }),
  { id: "RenewClaimRequest" },
);
const Renewed = doc(
  z.union([
    z.object({ renewed: z.literal(true), leaseExpiresAt: int() }),
    z.object({ renewed: z.literal(false) }),
  ]),
  { id: "ClaimRenewal" },
);

/** Registers the idempotency and deduplication routes on `app`. */
export function recordRoutes(app: Hono<AppEnv>): void {
  for (const spec of KINDS) register(app, spec);
}

// One kind's names and schemas, for its routes.
function kindOf(spec: (typeof KINDS)[number]) {
  const { kind, params: [a, b], doneState } = spec;
  const doneShape = { state: z.literal(doneState), response: z.optional(StoredResponse) };
  return {
    ...spec,
    b,
    recordKind: kind as RecordKind,
    base: `/v1/${kind}/{${a}}/{${b}}`,
    Params: z.object({ [a]: segment(), [b]: segment() }),
    idOf: (param: Record<string, string>) => recordId(param[a]!, param[b]!),
    doneShape,
  };
}

type Kind = ReturnType<typeof kindOf>;

function register(app: Hono<AppEnv>, spec: (typeof KINDS)[number]): void {
  const kind = kindOf(spec);
  claimRoute(app, kind);
  renewRoute(app, kind);
  completeRoute(app, kind);
  releaseRoute(app, kind);
  stateRoute(app, kind);
}

// Claim: the first caller gets the work; later ones learn it is done, in flight, or mismatched.
function claimRoute(app: Hono<AppEnv>, kind: Kind): void {
  const { tag, name, base, Params, idOf, recordKind, done, doneState, retention, b } = kind;
  const ClaimBody = doc(
    z.strictObject({
      leaseMs,
      retentionMs: retentionMs(String(retention)),
      token: z.optional(token("Choose it to make retries safe")),
      fingerprint: z.optional(doc(z.string().check(z.maxLength(128)), {
        description: "Identifies the payload",
      })),
    }),
    { id: `${name}ClaimRequest` },
  );
  route(app, {
    ...post(tag, `claim${name}`, `${base}/claim`, Params, ClaimBody),
    summary: `Claim the ${b} for one worker, or learn that it is ${doneState}`,
    responses: {
      201: json(Claimed, `Claimed: do the work, then ${done} or release`),
      200: json(z.object(kind.doneShape), `Already ${doneState}, with the stored response`),
      409: problemDoc("in_progress, with retryAfterMs"),
      422: problemDoc("fingerprint_mismatch"),
      ...common,
    },
  }, async (c, { params, body: { retentionMs = retention, ...rest } }) => {
    const claim = await c.var.records.claim(recordKind, idOf(params), { ...rest, retentionMs });
    if (claim.state === "claimed") return c.json(claim, 201);
    if (claim.state === "completed") {
      return c.json({ state: doneState, ...(claim.response && { response: claim.response }) }, 200);
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
  });
}

function renewRoute(app: Hono<AppEnv>, { tag, name, base, Params, idOf, recordKind }: Kind) {
  route(
    app,
    {
      ...post(tag, `renew${name}`, `${base}/renew`, Params, RenewBody),
      summary: "Extend a claim still held by this token (long work)",
      responses: { 200: json(Renewed, "Whether the claim was still held"), ...common },
    },
    async (c, { params, body: { token, leaseMs } }) =>
      c.json(await c.var.records.renew(recordKind, idOf(params), token, leaseMs), 200),
  );
}

function completeRoute(app: Hono<AppEnv>, kind: Kind): void {
  const { tag, name, base, Params, idOf, recordKind, done, doneState } = kind;
  route(app, {
    ...post(tag, `${done}${name}`, `${base}/${done}`, Params, CompleteBody),
    summary: "Mark it done, keeping the response for the retention (only the claim's token can)",
    responses: {
      200: json(z.object({ state: z.literal(doneState) }), "Stored"),
      409: problemDoc("lease_lost"),
      ...common,
    },
  }, async (c, { params, body: { token, response } }) => {
    if (!(await c.var.records.complete(recordKind, idOf(params), token, response))) {
      throw new EdgelockError("lease_lost", "The claim is no longer held by this token");
    }
    return c.json({ state: doneState }, 200);
  });
}

function releaseRoute(app: Hono<AppEnv>, { tag, name, base, Params, idOf, recordKind }: Kind) {
  route(
    app,
    {
      ...post(tag, `release${name}`, `${base}/release`, Params, TokenBody),
      summary: "Give it back: the work failed cleanly and a retry may redo it",
      responses: { 200: json(z.object({ released: z.boolean() }), "Done"), ...common },
    },
    async (c, { params, body: { token } }) =>
      c.json({ released: await c.var.records.release(recordKind, idOf(params), token) }, 200),
  );
}

function stateRoute(app: Hono<AppEnv>, kind: Kind): void {
  const { tag, name, base, Params, idOf, recordKind, doneState, doneShape } = kind;
  route(app, {
    tags: [tag],
    method: "get",
    path: base,
    operationId: `get${name}`,
    summary: `The state: absent, in_progress or ${doneState} (with the response); never the token`,
    params: Params,
    responses: {
      200: json(
        doc(
          z.union([
            z.object({ state: z.literal("absent") }),
            z.object({ state: z.literal("in_progress"), fence: int(), leaseExpiresAt: int() }),
            z.object({ ...doneShape, expiresAt: int() }),
          ]),
          { id: `${name}State` },
        ),
        "State",
      ),
      ...common,
    },
  }, async (c, { params }) => {
    const record = await c.var.records.get(recordKind, idOf(params));
    if (record.state !== "completed") return c.json(record, 200);
    return c.json({ ...record, state: doneState }, 200);
  });
}
