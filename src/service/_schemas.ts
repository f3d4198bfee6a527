// Schema pieces shared by the route modules: they validate requests and generate /openapi.json.
import { z } from "@hono/zod-openapi";
import {
  HOLD_ID_PATTERN,
  LIMITS,
  LOCK_NAME_PATTERN,
  MAX_META_BYTES,
  NAME_PATTERN,
  TOKEN_PATTERN,
} from "../core/_validate.ts";

export const Name = z.string().regex(NAME_PATTERN).openapi({
  description: "1–200 characters of A-Z a-z 0-9 . _ : -, not . or ..",
  example: "invoice:42",
});
/** A lock's name: a name, and `{` `}` for a Redis Cluster hash tag. */
export const LockName = z.string().regex(LOCK_NAME_PATTERN).openapi({
  description: "1–200 characters of A-Z a-z 0-9 . _ : - { }, not . or .., not starting with }; " +
    "names that agree up " +
    "to their first } share a Redis Cluster slot (start them with the same {group})",
  example: "invoice:42",
});
export const Token = z.string().regex(TOKEN_PATTERN).openapi({
  description: "Owner token: 16–128 characters of A-Z a-z 0-9 _ -",
  example: "b3JkZXItNDItd29ya2VyLTE",
});
/** A reentrant hold's id, or a break's: chosen by the client so a retry counts once. */
export const HoldId = z.string().regex(HOLD_ID_PATTERN).openapi({
  description: "8–32 characters of A-Z a-z 0-9 _ -, chosen before the first attempt",
  example: "h0ld-1d-x9Qz",
});
export const duration = (field: keyof typeof LIMITS, description: string) =>
  z.number().int().min(LIMITS[field].min).max(LIMITS[field].max).openapi({ description });
export const Meta = z.record(z.string(), z.unknown()).refine(
  (meta) => new TextEncoder().encode(JSON.stringify(meta)).length <= MAX_META_BYTES,
  { message: `meta must be at most ${MAX_META_BYTES} bytes as JSON` },
).openapi({ description: "A JSON object of at most 1 KiB, shown by GET" });

export const Problem = z.object({
  type: z.string(),
  title: z.string(),
  status: z.number().int(),
  detail: z.string(),
  code: z.string(),
  retryAfterMs: z.number().int().optional(),
  errors: z.array(z.object({ path: z.string(), message: z.string() })).optional(),
}).openapi("Problem");

export const problemDoc = (description: string) => ({
  description,
  content: { "application/problem+json": { schema: Problem } },
});
export const json = <T extends z.ZodType>(schema: T, description: string) => ({
  description,
  content: { "application/json": { schema } },
});
export const body = <T extends z.ZodType>(schema: T) => ({
  required: true,
  content: { "application/json": { schema } },
});
export const common = {
  400: problemDoc("invalid_request"),
  401: problemDoc("unauthorized"),
  413: problemDoc("payload_too_large"),
  503: problemDoc("backend_unavailable"),
};

/** A path parameter that is a name. */
export const nameParam = (name: string) =>
  Name.openapi({
    param: { name, in: "path" },
    description: "1–200 characters of A-Z a-z 0-9 . _ : -",
  });

/** `{ token }`: the body of the routes that end a claim or a run. */
export const TokenBody = z.strictObject({ token: Token }).openapi("TokenRequest");
/** A claim's lease, ms. */
export const leaseMs = duration("leaseMs", "Claim lease, ms (default 30000)").optional();
/** How long a completed record is kept, ms. */
export const retentionMs = (fallback: string) =>
  duration("retentionMs", `How long the result is kept, ms (default ${fallback})`).optional();
/** A granted claim. */
export const Claimed = z.object({
  state: z.literal("claimed"),
  token: Token,
  fence: z.number().int(),
  leaseExpiresAt: z.number().int(),
});
/** What every route behind the API key declares. */
export const secured = (tag: string) => ({ security: [{ bearer: [] }], tags: [tag] });
/** A POST route with path params and a JSON body. */
export const post = <P extends z.ZodType, B extends z.ZodType>(
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

/** How a held lock is held: what `GET /v1/locks/{name}` and `GET /v1/locks` tell. */
export const Holding = z.object({
  mode: z.enum(["exclusive", "shared", "semaphore"]).optional(),
  holders: z.number().int().optional().openapi({ description: "How many hold it" }),
  permits: z.number().int().optional().openapi({
    description: "A semaphore's permits held; an exclusive lease's hold count",
  }),
  limit: z.number().int().optional().openapi({ description: "A semaphore's permits in all" }),
});
