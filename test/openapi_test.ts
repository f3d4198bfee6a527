// The OpenAPI document: built from the route table ahead of time, and served as it was built.
import assert from "node:assert/strict";
import { createApp } from "../src/service/mod.ts";
import { DOCUMENT_PATH, generatedDocument } from "../dev/openapi.ts";

Deno.test("src/service/openapi.json is the document the routes generate (deno task openapi)", async () => {
  const file = await Deno.readTextFile(DOCUMENT_PATH);
  assert.equal(file, generatedDocument(), "run `deno task openapi` and commit the file");
});

Deno.test("/openapi.json serves the prebuilt document, without the API key", async () => {
  const redis = {
    evalsha: () => Promise.reject(new Error("no Redis in these tests")),
    eval: () => Promise.reject(new Error("no Redis in these tests")),
  };
  const apiKeys = [{ tenant: "t", secret: "openapi-test-secret-0123456789" }];
  const app = createApp({ redis, apiKeys, log: () => {} });
  const response = await app.request("/openapi.json");
  assert.equal(response.status, 200);
  assert.deepEqual(await response.json(), JSON.parse(await Deno.readTextFile(DOCUMENT_PATH)));
});
