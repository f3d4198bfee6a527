/**
 * `deno task openapi`: writes the service's OpenAPI document to `worker/openapi.json`, which the
 * Worker and Deno Deploy entries serve at `/openapi.json` without generating it in each isolate.
 * `test/openapi_test.ts` fails when the file is not what the routes generate.
 *
 * @module
 */
import { createApp, openApiDocument } from "../src/service/app.ts";

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
export const DOCUMENT_PATH = new URL("../worker/openapi.json", import.meta.url);

if (import.meta.main) {
  await Deno.writeTextFile(DOCUMENT_PATH, generatedDocument());
  console.log(`wrote ${DOCUMENT_PATH.pathname}`);
}
