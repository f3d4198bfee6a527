// Schema pieces shared by the route modules: they check requests and describe /openapi.json.
import * as z from "zod/mini";
import {
  HOLD_ID_PATTERN,
  LIMITS,
  LOCK_NAME_PATTERN,
  MAX_META_BYTES,
  NAME_PATTERN,
  TOKEN_PATTERN,
} from "../core/_validate.ts";
import { doc, type Reply } from "./_route.ts";

export { doc };

// Each rule once: the OpenAPI description states it, and a request that breaks it is told it.
const NAME_CHARS = "1–200 characters of A-Z a-z 0-9 . _ : -";
const NAME_RULE = `${NAME_CHARS}, not . or ..`;
const LOCK_NAME_RULE = `${NAME_CHARS} { }, not . or .., not starting with }`;
const TOKEN_RULE = "16–128 characters of A-Z a-z 0-9 _ -";
const HOLD_ID_RULE = "8–32 characters of A-Z a-z 0-9 _ -";
/** A name (a job's, a segment of a record's). */
export const name = (description = NAME_RULE) =>
  doc(z.string().check(z.regex(NAME_PATTERN, `must be ${NAME_RULE}`)), {
    description,
    example: "invoice:42",
  });
/** A lock's name: a name, and `{` `}` for a Redis Cluster hash tag. */
export const lockName = (
  description = `${LOCK_NAME_RULE}; names that agree up to their first } share a Redis Cluster ` +
    "slot (start them with the same {group})",
) =>
  doc(z.string().check(z.regex(LOCK_NAME_PATTERN, `must be ${LOCK_NAME_RULE}`)), {
    description,
    example: "invoice:42",
  });
export const LockName = lockName();
/** An owner token. */
export const token = (description = `Owner token: ${TOKEN_RULE}`) =>
  doc(z.string().check(z.regex(TOKEN_PATTERN, `must be ${TOKEN_RULE}`)), {
    description,
    example: "b3JkZXItNDItd29ya2VyLTE",
  });
export const Token = token();
/** A reentrant hold's id, or a break's: chosen by the client so a retry counts once. */
export const holdId = (description = `${HOLD_ID_RULE}, chosen before the first attempt`) =>
  doc(z.string().check(z.regex(HOLD_ID_PATTERN, `must be ${HOLD_ID_RULE}`)), {
    description,
    example: "h0ld-1d-x9Qz",
  });
/** An integer, described. */
export const int = (description?: string) =>
  description === undefined
    ? z.number().check(z.int())
    : doc(z.number().check(z.int()), { description });
/** A duration setting, within the library's limits for `field`. */
export const duration = (field: keyof typeof LIMITS, description: string) =>
  doc(z.number().check(z.int(), z.minimum(LIMITS[field].min), z.maximum(LIMITS[field].max)), {
    description,
  });
/** A JSON object of at most `max` bytes. */
export const jsonObject = (
  field: string,
  max: number,
  meta: { id?: string; description: string },
) =>
  doc(
    z.record(z.string(), z.unknown()).check(z.refine(
      (value) => new TextEncoder().encode(JSON.stringify(value)).length <= max,
      `${field} must be at most ${max} bytes as JSON`,
    )),
    meta,
  );
export const Meta = jsonObject("meta", MAX_META_BYTES, {
  description: "A JSON object of at most 1 KiB, shown by GET",
});
/** The path parameter `{name}` of the lock routes. */
export const NameParams = z.object({ name: LockName });

export const Problem = doc(
  z.object({
    type: z.string(),
    title: z.string(),
    status: int(),
    detail: z.string(),
    code: z.string(),
    retryAfterMs: z.optional(int()),
    lockExpiresAt: z.optional(int("A busy lock's lease end, epoch ms on the Redis server's clock")),
    requestId: z.optional(z.string()),
    errors: z.optional(z.array(z.object({ path: z.string(), message: z.string() }))),
  }),
  { id: "Problem" },
);

export const problemDoc = (description: string): Reply => ({
  description,
  schema: Problem,
  type: "application/problem+json",
});
export const json = (schema: z.ZodMiniType, description: string): Reply => ({
  description,
  schema,
});
export const common = {
  400: problemDoc("invalid_request"),
  401: problemDoc("unauthorized"),
  413: problemDoc("payload_too_large"),
  429: problemDoc("too_many_requests: this tenant's concurrent waits or request rate"),
  503: problemDoc("backend_unavailable"),
};

/** `{ token }`: the body of the routes that end a claim or a run. */
export const TokenBody = doc(z.strictObject({ token: Token }), { id: "TokenRequest" });
/** A claim's lease, ms. */
export const leaseMs = z.optional(duration("leaseMs", "Claim lease, ms (default 30000)"));
/** How long a completed record is kept, ms. */
export const retentionMs = (fallback: string) =>
  z.optional(duration("retentionMs", `How long the result is kept, ms (default ${fallback})`));
/** A granted claim. */
export const Claimed = z.object({
  state: z.literal("claimed"),
  token: Token,
  fence: int(),
  leaseExpiresAt: int(),
});
/** A POST route with path params and a JSON body. */
export const post = <P, B>(
  tag: string,
  operationId: string,
  path: string,
  params: P,
  body: B,
) => ({ tags: [tag], method: "post" as const, path, operationId, params, body });

/** How a held lock is held: what `GET /v1/locks/{name}` and `GET /v1/locks` tell. */
export const holding = {
  mode: z.optional(z.enum(["exclusive", "shared", "semaphore"])),
  holders: z.optional(int("How many hold it")),
  permits: z.optional(int("A semaphore's permits held; an exclusive lease's hold count")),
  limit: z.optional(int("A semaphore's permits in all")),
};
