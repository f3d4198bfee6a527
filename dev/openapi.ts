/**
 * `deno task openapi`: builds the service's OpenAPI 3.1 document from its route table and writes
 * it to `src/service/openapi.json`, which `/openapi.json` serves as it is: no isolate generates it,
 * and the generator stays out of the Worker. `test/openapi_test.ts` fails when the file is stale.
 *
 * @module
 */
import * as z from "zod/mini";
import type { Hono } from "hono";
import type { AppEnv } from "../src/service/_env.ts";
import { DOCS, routesOf, type RouteSpec } from "../src/service/_route.ts";
import { createApp } from "../src/service/mod.ts";

const DOCUMENT = {
  openapi: "3.1.0",
  servers: [{ url: "/", description: "This service" }],
  info: {
    title: "edgelock",
    version: "1",
    description: "Distributed locks with fencing tokens for edge runtimes",
    license: { name: "MIT", url: "https://opensource.org/license/mit" },
  },
};

type Json = Record<string, unknown>;

/** The service's OpenAPI document, generated from the routes mounted on `app`. */
export function openApiDocument(app: Hono<AppEnv>): object {
  const components: Json = {};
  // Each schema as JSON Schema; the named ones it uses go to components.schemas.
  const toSchema = (schema: z.ZodMiniType): Json => {
    const out = z.toJSONSchema(schema, { metadata: DOCS, io: "input", unrepresentable: "any" });
    const { $schema: _, $defs = {}, ...rest } = JSON.parse(
      JSON.stringify(out).replaceAll('"#/$defs/', '"#/components/schemas/'),
    ) as Json & { $defs?: Json };
    Object.assign(components, $defs);
    return rest;
  };
  const paths: Record<string, Json> = {};
  for (const spec of routesOf(app)) {
    (paths[spec.path] ??= {})[spec.method] = operation(spec, toSchema);
  }
  return {
    ...DOCUMENT,
    paths,
    components: {
      schemas: Object.fromEntries(Object.entries(components).sort(([a], [b]) => (a < b ? -1 : 1))),
      securitySchemes: {
        bearer: {
          type: "http",
          scheme: "bearer",
          description: "A tenant's secret from LOCK_API_KEYS",
        },
      },
    },
  };
}

function operation(spec: RouteSpec, toSchema: (schema: z.ZodMiniType) => Json): Json {
  const parameters = [
    ...parametersOf(spec.params, "path", toSchema),
    ...parametersOf(spec.query, "query", toSchema),
  ];
  const responses = Object.fromEntries(
    Object.entries(spec.responses).map(([status, reply]) => [status, {
      description: reply.description,
      ...(reply.schema && {
        content: { [reply.type ?? "application/json"]: { schema: toSchema(reply.schema) } },
      }),
    }]),
  );
  return {
    operationId: spec.operationId,
    summary: spec.summary,
    tags: spec.tags,
    security: spec.secured === false ? [] : [{ bearer: [] }],
    ...(parameters.length > 0 && { parameters }),
    ...(spec.body && {
      requestBody: {
        required: !spec.bodyOptional,
        content: { "application/json": { schema: toSchema(spec.body) } },
      },
    }),
    responses,
  };
}

// An object schema's fields as OpenAPI parameters.
function parametersOf(
  schema: z.ZodMiniType | undefined,
  where: "path" | "query",
  toSchema: (schema: z.ZodMiniType) => Json,
): Json[] {
  if (!schema) return [];
  const { properties = {}, required = [] } = toSchema(schema) as {
    properties?: Record<string, Json>;
    required?: string[];
  };
  return Object.entries(properties).map(([name, { description, ...schema }]) => ({
    name,
    in: where,
    required: where === "path" || required.includes(name),
    ...(description !== undefined && { description }),
    schema,
  }));
}

/** The document as the routes generate it, as the file holds it. */
export function generatedDocument(): string {
  // The document comes from the routes alone; this client is never called.
  const redis = {
    evalsha: () => Promise.reject(new Error("not for requests")),
    eval: () => Promise.reject(new Error("not for requests")),
  };
  const app = createApp({
    redis,
    apiKeys: [{ tenant: "doc", secret: "openapi-document-only-0123456789" }],
    log: () => {},
  });
  return `${JSON.stringify(openApiDocument(app), null, 2)}\n`;
}

/** Where the prebuilt document lives. */
export const DOCUMENT_PATH = new URL("../src/service/openapi.json", import.meta.url);

if (import.meta.main) {
  await Deno.writeTextFile(DOCUMENT_PATH, generatedDocument());
  console.log(`wrote ${DOCUMENT_PATH.pathname}`);
}
