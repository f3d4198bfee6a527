// The service's routes as data: each is mounted on the app with its request checked against its
// schemas (zod/mini), and the same table is the OpenAPI document (see ./openapi.ts).
import * as z from "zod/mini";
import type { Context, Hono } from "hono";
import { EdgelockError } from "../core/errors.ts";
import { nearest } from "../core/_validate.ts";
import type { AppEnv } from "./_env.ts";

// Each issue in a few words ("at most 300000", "unknown field: ttl"), where zod/mini alone says
// "Invalid input"; a schema's own message (a refine's, a regex's) wins.
z.config({ localeError: describeIssue });

function describeIssue(issue: z.core.$ZodRawIssue): string {
  const { code } = issue;
  const bound = (word: string, n: unknown, origin: unknown, inclusive: unknown) => {
    const unit = origin === "string" ? " character" : origin === "array" ? " item" : "";
    const plural = unit && n !== 1 ? "s" : "";
    return `${word} ${n}${unit}${plural}${inclusive === false ? " (exclusive)" : ""}`;
  };
  if (code === "invalid_type") {
    const expected = ({ int: "a whole number", record: "an object" } as Record<string, string>)[
      issue.expected
    ] ?? issue.expected;
    return issue.input === undefined ? "required" : `expected ${expected}`;
  }
  if (code === "too_big") return bound("at most", issue.maximum, issue.origin, issue.inclusive);
  if (code === "too_small") return bound("at least", issue.minimum, issue.origin, issue.inclusive);
  if (code === "invalid_format") return `does not match ${issue.pattern ?? issue.format}`;
  if (code === "unrecognized_keys") {
    const shape = (issue.inst as { _zod?: { def?: { shape?: object } } } | undefined)?._zod?.def
      ?.shape;
    const fields = Object.keys(shape ?? {});
    const named = issue.keys.map((key) => {
      const near = nearest(key, fields);
      return near ? `${key} (did you mean ${near}?)` : key;
    });
    return `unknown field${named.length > 1 ? "s" : ""}: ${named.join(", ")}`;
  }
  if (code === "invalid_value") return `one of ${issue.values.join(", ")}`;
  return "invalid";
}

/** Descriptions and component names for the document; validation never reads them. */
export const DOCS = z.registry<{ id?: string; description?: string; example?: unknown }>();

/** `schema`, described in the OpenAPI document (an `id` makes it a named component). */
export function doc<T extends z.ZodMiniType>(
  schema: T,
  meta: { id?: string; description?: string; example?: unknown },
): T {
  DOCS.add(schema, meta);
  return schema;
}

/** One reply of a route, as the document lists it. */
export interface Reply {
  description: string;
  /** The body's schema; `type` says its media type. @default none */
  schema?: z.ZodMiniType;
  /** @default "application/json" */
  type?: string;
}

type Obj = z.ZodMiniType<Record<string, unknown>>;

/** A route: what it takes, what it answers, and what the document says of it. */
export interface RouteSpec<
  P extends Obj = Obj,
  Q extends Obj = Obj,
  B extends z.ZodMiniType = z.ZodMiniType,
> {
  method: "get" | "post";
  /** In the document's form: `/v1/locks/{name}/acquire`. */
  path: string;
  operationId: string;
  summary: string;
  tags: string[];
  /** Whether the route takes the API key. @default true */
  secured?: boolean;
  params?: P;
  query?: Q;
  body?: B;
  /** Whether the document calls the body optional (any empty body reads as `{}`). @default false */
  bodyOptional?: boolean;
  responses: Record<number, Reply>;
}

/** What a route's handler gets: its checked path params, query and body. */
export interface Input<P, Q, B> {
  params: P;
  query: Q;
  body: B;
}

type Out<T> = T extends z.ZodMiniType ? z.output<T> : undefined;

const tables = new WeakMap<object, RouteSpec[]>();

/** The routes mounted on `app` with {@linkcode route}, in order. */
export function routesOf(app: Hono<AppEnv>): readonly RouteSpec[] {
  return tables.get(app) ?? [];
}

/** Mounts `spec` on `app`: a request that does not match its schemas is 400 invalid_request. */
export function route<P extends Obj, Q extends Obj, B extends z.ZodMiniType>(
  app: Hono<AppEnv>,
  spec: RouteSpec<P, Q, B>,
  handler: (
    c: Context<AppEnv>,
    input: Input<Out<P>, Out<Q>, Out<B>>,
  ) => Response | Promise<Response>,
): void {
  if (!tables.has(app)) tables.set(app, []);
  tables.get(app)!.push(spec as unknown as RouteSpec);
  const path = spec.path.replace(/\{([A-Za-z]+)\}/g, ":$1");
  app.on(spec.method.toUpperCase(), path, async (c) => {
    const params = spec.params && check(spec.params, c.req.param());
    const query = spec.query && check(spec.query, singleValued(c));
    const body = spec.body && check(spec.body, await readJson(c));
    return await handler(c, { params, query, body } as Input<Out<P>, Out<Q>, Out<B>>);
  });
}

function check<T extends z.ZodMiniType>(schema: T, value: unknown): z.output<T> {
  const result = schema.safeParse(value);
  if (result.success) return result.data;
  // A whole number's safe range goes unsaid where the field states a bound of its own: a fence of
  // -2^60 is "at least 1", not that and "at least -9007199254740991" too.
  const { issues } = result.error;
  const pathOf = (issue: z.core.$ZodIssue) => issue.path.map(String).join(".");
  const safeRange = (issue: z.core.$ZodIssue) => (issue as { origin?: unknown }).origin === "int";
  const bounded = new Set(
    issues.filter((issue) =>
      !safeRange(issue) && (issue.code === "too_small" || issue.code === "too_big")
    ).map(pathOf),
  );
  const said = issues.filter((issue) => !(safeRange(issue) && bounded.has(pathOf(issue))));
  throw new EdgelockError("invalid_request", "The request does not match the schema", {
    cause: said.map((issue) => ({
      path: issue.path.map(String).join(".") || "(body)",
      message: issue.message,
    })),
  });
}

// The query, each parameter once: a repeated one is refused rather than read one way or another.
function singleValued(c: Context<AppEnv>): Record<string, string> {
  const repeated = Object.entries(c.req.queries()).find(([, values]) => values.length > 1);
  if (repeated) {
    throw new EdgelockError("invalid_request", `The query gives ?${repeated[0]}= more than once`);
  }
  return c.req.query();
}

/**
 * A failure to read a request's body as the client's: the connection ended first (before the
 * Content-Length or the last chunk; Deno also fails a whole body when the client half-closes), or
 * a chunk was malformed (the runtime's own error, kept as the cause for the log).
 * An `EdgelockError` (a body over the limit) stays as it is.
 */
export function unreadable(error: unknown): EdgelockError {
  if (error instanceof EdgelockError) return error;
  return new EdgelockError(
    "invalid_request",
    "The request body could not be read: the connection ended or the body was malformed",
    { cause: error },
  );
}

// application/json, or a +json type, with any parameters.
const JSON_TYPE = /^application\/([a-z0-9.-]+\+)?json$/;

// The body as JSON: an empty body is `{}` (every field left to its default, or named missing).
async function readJson(c: Context<AppEnv>): Promise<unknown> {
  const text = await c.req.text().catch((error) => Promise.reject(unreadable(error)));
  if (text === "") return {};
  const type = (c.req.header("content-type") ?? "").split(";")[0]!.trim().toLowerCase();
  if (!JSON_TYPE.test(type)) {
    throw new EdgelockError("invalid_request", "Send the body as Content-Type: application/json");
  }
  let proto = false;
  let body: unknown;
  try {
    body = JSON.parse(text, (key, value) => {
      proto ||= key === "__proto__";
      return value;
    });
  } catch (error) {
    const deep = error instanceof RangeError; // the reviver's stack, in JSON nested 10,000s deep
    throw new EdgelockError(
      "invalid_request",
      `The body ${deep ? "nests too deeply" : "is not valid JSON"}`,
    );
  }
  // An own __proto__ key would be dropped on the way to Redis, silently: refused instead.
  if (proto) throw new EdgelockError("invalid_request", "The body has a __proto__ key");
  return body;
}
