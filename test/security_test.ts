import assert from "node:assert/strict";
import { createApp } from "../src/service/mod.ts";
import { findTenant, parseApiKeys } from "../src/service/auth.ts";
import { sha256 } from "../src/core/_crypto.ts";
import { keygen, shared, startBackend } from "./_backend.ts";
import { LISTENING, spawnDeno } from "./_process.ts";

const A = "security-secret-a-0123456789";
const B = "security-secret-b-0123456789";

const fixture = shared(async () => {
  const backend = await startBackend();
  const app = createApp({
    redis: backend.redis,
    apiKeys: parseApiKeys(`a:${A},b:${B}`),
    log: () => {},
  });
  const call = async (path: string, secret: string, body?: unknown) => {
    const res = await app.request(path, {
      method: body === undefined ? "GET" : "POST",
      headers: { authorization: `Bearer ${secret}`, "content-type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    return { status: res.status, text, body: JSON.parse(text) as Record<string, unknown> };
  };
  return { backend, app, call };
}, ({ backend }) => backend.stop());

Deno.test("tenant isolation holds on every route", async () => {
  const { call } = await fixture();
  const n = keygen("sec");
  const lock = await call(`/v1/locks/${n}/acquire`, A, { ttlMs: 30000 });
  const idem = await call(`/v1/idempotency/u/${n}/claim`, A, {});
  const hook = await call(`/v1/dedupe/ns/${n}/claim`, A, {});
  const job = await call(`/v1/jobs/${n}/start`, A, { atMostMs: 30000 });
  const tokens = [lock, idem, hook, job].map((r) => String(r.body.token));

  // B sees nothing of A's state …
  assert.deepEqual((await call(`/v1/locks/${n}`, B)).body, { name: n, held: false });
  assert.deepEqual((await call(`/v1/idempotency/u/${n}`, B)).body, { state: "absent" });
  assert.deepEqual((await call(`/v1/dedupe/ns/${n}`, B)).body, { state: "absent" });
  // … cannot act on it with A's tokens …
  assert.equal(
    (await call(`/v1/locks/${n}/renew`, B, { token: tokens[0], ttlMs: 60000 })).status,
    409,
  );
  assert.deepEqual((await call(`/v1/locks/${n}/release`, B, { token: tokens[0] })).body, {
    released: false,
  });
  const response = { status: 200, body: "forged" };
  assert.equal(
    (await call(`/v1/idempotency/u/${n}/complete`, B, { token: tokens[1], response })).status,
    409,
  );
  assert.deepEqual(
    (await call(`/v1/idempotency/u/${n}/release`, B, { token: tokens[1] })).body,
    { released: false },
  );
  assert.equal((await call(`/v1/dedupe/ns/${n}/done`, B, { token: tokens[2] })).status, 409);
  assert.deepEqual((await call(`/v1/jobs/${n}/finish`, B, { token: tokens[3] })).body, {
    finished: false,
  });
  // … and its own claims on the same names succeed in its own key space.
  assert.equal((await call(`/v1/locks/${n}/acquire`, B, {})).status, 200);
  assert.equal((await call(`/v1/idempotency/u/${n}/claim`, B, {})).status, 201);
  assert.equal((await call(`/v1/dedupe/ns/${n}/claim`, B, {})).status, 201);
  assert.equal((await call(`/v1/jobs/${n}/start`, B, { atMostMs: 30000 })).body.run, true);
  // A's state is untouched.
  const info = await call(`/v1/locks/${n}`, A);
  assert.equal(info.body.fence, lock.body.fence);
  assert.equal((await call(`/v1/idempotency/u/${n}`, A)).body.state, "in_progress");
});

Deno.test("names that try to escape the key prefix are refused or stay inside it", async () => {
  const { backend, call } = await fixture();
  const hostile = [
    "..",
    "../b",
    "a*",
    "{a}",
    "a}b",
    "%7Bb%7D",
    "caf%C3%A9",
    "%E2%80%AE",
    "a%00b",
    "*",
    "b:lock:x",
  ];
  for (const name of hostile) {
    const res = await call(`/v1/locks/${name}/acquire`, A, {});
    assert.ok(
      res.status === 200 || res.status === 400 || res.status === 404,
      `${name} → ${res.status}`,
    );
  }
  assert.equal((await call(`/v1/locks/${"x".repeat(201)}/acquire`, A, {})).status, 400);
  const keys = await backend.redis.keys("*");
  const outside = keys.filter((k) => !k.startsWith("edgelock:a:") && !k.startsWith("edgelock:b:"));
  assert.deepEqual(outside, [], "every key lives under a tenant prefix");
  const bKeysFromA = keys.filter((k) => k.startsWith("edgelock:b:") && k.includes("b:lock:x"));
  assert.deepEqual(bKeysFromA, [], "a name with ':' does not reach another tenant");
});

Deno.test("no reply leaks a token the caller did not present or receive", async () => {
  const { call } = await fixture();
  const n = keygen("leak");
  const held = await call(`/v1/locks/${n}/acquire`, A, { ttlMs: 30000 });
  const token = String(held.body.token);
  const replies = [
    await call(`/v1/locks/${n}`, A),
    await call(`/v1/locks/${n}/acquire`, A, {}),
    await call(`/v1/locks/${n}/renew`, A, { token: "wrong-token-00000000001", ttlMs: 1000 }),
    await call(`/v1/locks/${n}/release`, A, { token: "wrong-token-00000000001" }),
    await call(`/v1/locks/${n}`, B),
  ];
  for (const reply of replies) assert.ok(!reply.text.includes(token), reply.text);
});

Deno.test("the body limit holds at 64 KiB and oversized Authorization headers are refused", async () => {
  const { app } = await fixture();
  const n = keygen("size");
  const justUnder = JSON.stringify({ meta: { a: "x".repeat(900) } });
  assert.equal(
    (await app.request(`/v1/locks/${n}/acquire`, {
      method: "POST",
      headers: { authorization: `Bearer ${A}`, "content-type": "application/json" },
      body: justUnder,
    })).status,
    200,
  );
  const huge = await app.request(`/v1/locks/${n}/acquire`, {
    method: "POST",
    headers: { authorization: `Bearer ${A}`, "content-type": "application/json" },
    body: " ".repeat(64 * 1024 + 1),
  });
  assert.equal(huge.status, 413);
  await huge.body?.cancel();
  const longAuth = await app.request(`/v1/locks/${n}`, {
    headers: { authorization: `Bearer ${"k".repeat(10_000)}` },
  });
  assert.equal(longAuth.status, 401);
  await longAuth.body?.cancel();
});

Deno.test("the API key comparison reads every key, wherever the match is", async () => {
  const keys = await Promise.all(
    ["k1-0123456789abcdef", "k2-0123456789abcdef", "k3-0123456789abcdef"].map(async (
      secret,
      i,
    ) => ({
      tenant: `t${i}`,
      digest: await sha256(secret),
    })),
  );
  for (
    const [presented, expected] of [["k1-0123456789abcdef", "t0"], [
      "k3-0123456789abcdef",
      "t2",
    ], ["nope", undefined]]
  ) {
    let reads = 0;
    const counted = keys.map((key) => ({
      tenant: key.tenant,
      get digest() {
        reads++;
        return key.digest;
      },
    }));
    assert.equal(await findTenant(counted, presented!), expected);
    assert.ok(reads >= keys.length, `read ${reads} of ${keys.length} keys for ${presented}`);
  }
});

Deno.test("secrets never appear in the service's logs", async () => {
  const { backend } = await fixture();
  const service = await spawnDeno(["run", "-A", "worker/deno.ts"], {
    PORT: "0",
    UPSTASH_REDIS_REST_URL: backend.bridge.url,
    UPSTASH_REDIS_REST_TOKEN: backend.token,
    LOCK_API_KEYS: `a:${A}`,
  }, LISTENING);
  const url = `http://127.0.0.1:${service.ready[1]}`;
  try {
    const requests = [
      fetch(`${url}/v1/locks/x/acquire`, {
        method: "POST",
        headers: { authorization: `Bearer ${A}` },
        body: "{",
      }),
      fetch(`${url}/v1/locks/x`, { headers: { authorization: `Bearer ${A.slice(0, -1)}` } }),
      fetch(`${url}/v1/locks/x/acquire`, {
        method: "POST",
        headers: { authorization: `Bearer ${A}`, "content-type": "application/json" },
        body: "{}",
      }),
    ];
    for (const res of await Promise.all(requests)) await res.body?.cancel();
    await backend.bridge.close(); // Redis unreachable: errors get handled (and maybe logged)
    const down = await fetch(`${url}/v1/locks/y/acquire`, {
      method: "POST",
      headers: { authorization: `Bearer ${A}`, "content-type": "application/json" },
      body: "{}",
    });
    assert.equal(down.status, 503);
    await down.body?.cancel();
  } finally {
    await service.stop();
  }
  const output = service.output();
  for (const secret of [A, backend.token]) {
    assert.ok(!output.includes(secret), "a secret was logged");
  }
});
