// The OpenAPI document: prebuilt for the deployable entries, and what the routes generate.
import assert from "node:assert/strict";
import { createApp, openApiDocument } from "../src/service/app.ts";
import { DOCUMENT_PATH, generatedDocument } from "../dev/openapi.ts";

const redis = {
  evalsha: () => Promise.reject(new Error("no Redis in these tests")),
  eval: () => Promise.reject(new Error("no Redis in these tests")),
};
const apiKeys = [{ tenant: "t", secret: "openapi-test-secret-0123456789" }];

Deno.test("worker/openapi.json is the document the routes generate (deno task openapi)", async () => {
  const file = await Deno.readTextFile(DOCUMENT_PATH);
  assert.equal(file, generatedDocument(), "run `deno task openapi` and commit the file");
});

Deno.test("/openapi.json serves the prebuilt document as it was given", async () => {
  const prebuilt = { openapi: "3.1.0", info: { title: "prebuilt", version: "1" }, paths: {} };
  const app = createApp({ redis, apiKeys, log: () => {}, openapi: prebuilt });
  const response = await app.request("/openapi.json");
  assert.equal(response.status, 200);
  assert.deepEqual(await response.json(), prebuilt);
});

Deno.test("without a prebuilt document, /openapi.json serves the generated one, each time", async () => {
  const app = createApp({ redis, apiKeys, log: () => {} });
  const expected = JSON.parse(JSON.stringify(openApiDocument(app)));
  for (let i = 0; i < 2; i++) {
    const response = await app.request("/openapi.json");
    assert.deepEqual(await response.json(), expected);
  }
});
