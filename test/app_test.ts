import assert from "node:assert/strict";
import fc from "fast-check";
import { createApp, type RequestLog } from "../src/service/mod.ts";
import { parseApiKeys } from "../src/service/auth.ts";
import { createClient } from "../src/client/client.ts";
import { DEFAULT_MAX_WAITERS, Locks } from "../src/core/locks.ts";
import { toEdgelockError } from "../src/service/_errors.ts";
import { tenantLimiter, type TenantLimits } from "../src/service/_limits.ts";
import { keygen, lockKeys, shared, startBackend, takeTicket, until } from "./_backend.ts";
import { sendRaw } from "./_process.ts";

const A = "tenant-a-secret-0123456789";
const B = "tenant-b-secret-0123456789";
const apiKeys = parseApiKeys(`a:${A},b:${B}`);

type Json = Record<string, unknown>;

const fixture = shared(async () => {
  const backend = await startBackend();
  const logs: RequestLog[] = [];
  const app = createApp({ redis: backend.redis, apiKeys, log: (entry) => logs.push(entry) });
  const call = async (
    path: string,
    { secret = A, body, method, headers = {} }: {
      secret?: string | null;
      body?: unknown;
      method?: string;
      headers?: Record<string, string>;
    } = {},
  ) => {
    const res = await app.request(path, {
      method: method ?? (body === undefined ? "GET" : "POST"),
      headers: {
        ...(secret !== null && { authorization: `Bearer ${secret}` }),
        ...(body !== undefined && { "content-type": "application/json" }),
        ...headers,
      },
      body: body === undefined ? undefined : typeof body === "string" ? body : JSON.stringify(body),
    });
    const text = await res.text();
    return { res, status: res.status, body: (text ? JSON.parse(text) : {}) as Json };
  };
  const acquire = (name: string, body: Json = {}, secret = A) =>
    call(`/v1/locks/${name}/acquire`, { body, secret });
  const assertProblem = (
    r: { res: Response; status: number; body: Json },
    status: number,
    code: string,
  ) => {
    assert.equal(r.status, status, JSON.stringify(r.body));
    assert.equal(r.res.headers.get("content-type"), "application/problem+json");
    assert.equal(r.body.status, status);
    assert.equal(r.body.code, code);
    assert.equal(r.body.type, `urn:edgelock:problem:${code}`);
    assert.equal(typeof r.body.title, "string");
    assert.equal(typeof r.body.detail, "string");
  };
  // For the limits and deadlines: an app of tenant "l" with the given limits.
  const secret = "limits-secret-0123456789";
  const make = (limits: TenantLimits) =>
    createApp({
      redis: backend.redis,
      apiKeys: [{ tenant: "l", secret }],
      redisTimeoutMs: 300,
      limits,
      log: () => {},
    });
  const post = (app: ReturnType<typeof make>, path: string, body: unknown = {}) =>
    app.request(path, {
      method: "POST",
      headers: { authorization: `Bearer ${secret}`, "content-type": "application/json" },
      body: JSON.stringify(body),
    });
  const problemOf = async (res: Response): Promise<Json> => ({
    ...(await res.json() as Json),
    status: res.status,
    retryAfter: res.headers.get("retry-after"),
  });
  return { backend, logs, app, call, acquire, assertProblem, secret, make, post, problemOf };
}, ({ backend }) => backend.stop());

Deno.test("POST acquire returns 200 with the lease and no-store caching", async () => {
  const { acquire } = await fixture();
  const name = keygen();
  const r = await acquire(name, { ttlMs: 2000, meta: { by: "test" } });
  assert.equal(r.status, 200);
  assert.equal(r.res.headers.get("cache-control"), "no-store");
  assert.deepEqual(Object.keys(r.body).sort(), [
    "expiresAt",
    "fence",
    "name",
    "serverTime",
    "token",
    "ttlMs",
    "waitedMs",
  ]);
  assert.equal(r.body.name, name);
  assert.equal(r.body.ttlMs, 2000);
  assert.equal(r.body.expiresAt, Number(r.body.serverTime) + 2000);
});

Deno.test("acquire defaults ttlMs to 10000 ms", async () => {
  const { acquire } = await fixture();
  const r = await acquire(keygen());
  assert.equal(r.body.ttlMs, 10000);
});

Deno.test("a busy lock gets 409 lock_busy with retryAfterMs and Retry-After", async () => {
  const { acquire, assertProblem } = await fixture();
  const name = keygen();
  const held = await acquire(name, { ttlMs: 3000 });
  const r = await acquire(name, { ttlMs: 3000 });
  assertProblem(r, 409, "lock_busy");
  assert.ok(Number(r.body.retryAfterMs) > 0 && Number(r.body.retryAfterMs) <= 3000);
  const seconds = Math.ceil(Number(r.body.retryAfterMs) / 1000);
  assert.equal(r.res.headers.get("retry-after"), String(seconds));
  assert.equal(r.res.headers.get("cache-control"), "no-store");
  assert.ok(
    !JSON.stringify(r.body).includes(String(held.body.token)),
    "a busy reply never names the holder's token",
  );
  // retryAfterMs is a poll hint; lockExpiresAt is when the holder's lease ends unrenewed.
  assert.equal(typeof r.body.lockExpiresAt, "number");
  assert.ok(Math.abs(Number(r.body.lockExpiresAt) - Number(held.body.expiresAt)) <= 5);
});

Deno.test("acquire with waitMs waits server-side until the holder releases", async () => {
  const { call, acquire } = await fixture();
  const name = keygen();
  const held = await acquire(name, { ttlMs: 5000 });
  const waiting = acquire(name, { ttlMs: 5000, waitMs: 3000 });
  setTimeout(
    () => call(`/v1/locks/${name}/release`, { body: { token: held.body.token } }),
    150,
  );
  const r = await waiting;
  assert.equal(r.status, 200);
  assert.ok(Number(r.body.fence) > Number(held.body.fence));
});

Deno.test("a lease's next lets another instance's release hand over in place, in one request", async () => {
  const { backend, call, acquire, assertProblem } = await fixture();
  // Another Worker isolate: the same service on the same Redis, with nothing in memory.
  const other = createApp({ redis: backend.redis, apiKeys, log: () => {} });
  const releaseThere = async (name: string, body: unknown) => {
    const res = await other.request(`/v1/locks/${name}/release`, {
      method: "POST",
      headers: { authorization: `Bearer ${A}`, "content-type": "application/json" },
      body: JSON.stringify(body),
    });
    return { res, status: res.status, body: await res.json() as Json };
  };
  const name = keygen();
  const queueKey = lockKeys(name, "edgelock:a")[1];
  const held = await acquire(name, { ttlMs: 10_000 });
  const first = acquire(name, { ttlMs: 10_000, waitMs: 20_000 });
  await until("one waiter", async () => await backend.redis.zcard(queueKey) === 1);
  const second = acquire(name, { ttlMs: 10_000, waitMs: 20_000 });
  await until("two waiters", async () => await backend.redis.zcard(queueKey) === 2);
  const { token, fence } = held.body;
  assert.deepEqual((await releaseThere(name, { token, fence })).body, { released: true });
  const lease = await first;
  assert.equal(lease.status, 200);
  assert.equal(typeof lease.body.next, "string", "the second waited at its grant");
  for (const next of ["", "w:1", 7, "x".repeat(65)]) {
    const bad = await releaseThere(name, { token: lease.body.token, next });
    assertProblem(bad, 400, "invalid_request");
    assert.ok(!JSON.stringify(bad.body).includes(String(lease.body.next)));
  }
  // A renewal keeps it when sent; one or many.
  const renewBody = { token: lease.body.token, ttlMs: 10_000, next: lease.body.next };
  const renewed = await call(`/v1/locks/${name}/renew`, { body: renewBody });
  assert.equal(renewed.body.next, lease.body.next);
  const { token: mine, next: kept } = lease.body;
  const many = await call("/v1/locks/renew", {
    body: { ttlMs: 10_000, leases: [{ name, token: mine, next: kept }] },
  });
  assert.equal((many.body.results as Json[])[0]!.next, lease.body.next);
  assertProblem(
    await call(`/v1/locks/${name}/renew`, { body: { ...renewBody, next: "w:1" } }),
    400,
    "invalid_request",
  );
  const before = backend.requests();
  const { token: t, fence: f, next } = lease.body;
  assert.deepEqual((await releaseThere(name, { token: t, fence: f, next })).body, {
    released: true,
  });
  const last = await second;
  assert.equal(last.status, 200);
  assert.equal(backend.requests() - before, 1, "the release alone");
  assert.equal(last.body.next, undefined);
  await call(`/v1/locks/${name}/release`, { body: { token: last.body.token } });
});

Deno.test("a retried acquire with the holder's token returns the same fence", async () => {
  const { acquire } = await fixture();
  const name = keygen();
  const token = "retry-token-000000000001";
  const first = await acquire(name, { token, ttlMs: 1000 });
  const again = await acquire(name, { token, ttlMs: 3000 });
  assert.equal(again.status, 200);
  assert.equal(again.body.fence, first.body.fence);
  assert.equal(again.body.ttlMs, 3000);
});

Deno.test("renew keeps the fence; a foreign token gets 409 lock_lost", async () => {
  const { call, acquire, assertProblem } = await fixture();
  const name = keygen();
  const { body: lease } = await acquire(name, { ttlMs: 1000 });
  const r = await call(`/v1/locks/${name}/renew`, {
    body: { token: lease.token, ttlMs: 5000 },
  });
  assert.equal(r.status, 200);
  assert.equal(r.body.fence, lease.fence);
  assert.equal(r.body.ttlMs, 5000);
  const lost = await call(`/v1/locks/${name}/renew`, {
    body: { token: "not-the-holder-000001", ttlMs: 5000 },
  });
  assertProblem(lost, 409, "lock_lost");
});

Deno.test("a renewal's reply tells the lease's kind as the acquire's did: mode, limit, permits, holds", async () => {
  const { call, acquire } = await fixture();
  const kinds: Json[] = [
    { mode: "shared" },
    { limit: 3, permits: 2 },
    { reentrant: true, hold: "the-hold-01" },
    {},
  ];
  for (const kind of kinds) {
    const name = keygen();
    const { body: lease } = await acquire(name, { ttlMs: 5000, ...kind });
    const told = { mode: lease.mode, limit: lease.limit, permits: lease.permits };
    const renewed = await call(`/v1/locks/${name}/renew`, {
      body: { token: lease.token, fence: lease.fence, ttlMs: 5000 },
    });
    assert.equal(renewed.status, 200, JSON.stringify(renewed.body));
    assert.deepEqual(
      { mode: renewed.body.mode, limit: renewed.body.limit, permits: renewed.body.permits },
      told,
    );
    assert.equal(renewed.body.holdCount, lease.holdCount);
    const many = await call("/v1/locks/renew", {
      body: { leases: [{ name, token: lease.token, fence: lease.fence }] },
    });
    const [result] = many.body.results as Json[];
    assert.equal(result!.mode, lease.mode);
    assert.equal(result!.holdCount, lease.holdCount);
  }
});

Deno.test("release answers released true, also when retried; false for another token", async () => {
  const { call, acquire } = await fixture();
  const name = keygen();
  const { body: lease } = await acquire(name);
  const path = `/v1/locks/${name}/release`;
  const release = async (token: unknown) => (await call(path, { body: { token } })).body;
  assert.deepEqual(await release(lease.token), { released: true });
  assert.deepEqual(await release(lease.token), { released: true });
  assert.deepEqual(await release("never-held-this-0000001"), { released: false });
});

Deno.test("GET shows the lock's state and meta but never its token", async () => {
  const { call, acquire } = await fixture();
  const name = keygen();
  assert.deepEqual((await call(`/v1/locks/${name}`)).body, { name, held: false });
  const { body: lease } = await acquire(name, { meta: { job: "sync" } });
  const r = await call(`/v1/locks/${name}`);
  assert.equal(r.status, 200);
  assert.equal(r.body.held, true);
  assert.equal(r.body.fence, lease.fence);
  assert.deepEqual(r.body.meta, { job: "sync" });
  assert.ok(!JSON.stringify(r.body).includes(String(lease.token)));
});

Deno.test("each invalid field is a 400 invalid_request naming the field", async () => {
  const { call, acquire, assertProblem } = await fixture();
  const name = keygen();
  const cases: [Json, string][] = [
    [{ ttlMs: 99 }, "ttlMs"],
    [{ ttlMs: 300001 }, "ttlMs"],
    [{ ttlMs: 1.5 }, "ttlMs"],
    [{ ttlMs: "1000" }, "ttlMs"],
    [{ waitMs: -1 }, "waitMs"],
    [{ waitMs: 30001 }, "waitMs"],
    [{ token: "short" }, "token"],
    [{ token: "x".repeat(129) }, "token"],
    [{ token: "has spaces in it 0123" }, "token"],
    [{ meta: "text" }, "meta"],
    [{ meta: { big: "x".repeat(1100) } }, "meta"],
    [{ unknown: 1 }, "(body)"],
  ];
  for (const [body, field] of cases) {
    const r = await acquire(name, body);
    assertProblem(r, 400, "invalid_request");
    const errors = r.body.errors as { path: string }[];
    assert.ok(errors.some((e) => e.path === field), `${JSON.stringify(body)} → ${field}`);
  }
  const renew = await call(`/v1/locks/${name}/renew`, { body: { token: "x".repeat(20) } });
  assertProblem(renew, 400, "invalid_request");
  const release = await call(`/v1/locks/${name}/release`, { body: {} });
  assertProblem(release, 400, "invalid_request");
  // A fence past the safe integers, either way: its rule once.
  for (
    const [fence, message] of [[2 ** 60, "at most 9007199254740991"], [-(2 ** 60), "at least 1"]]
  ) {
    const huge = await call(`/v1/locks/${name}/release`, {
      body: { token: "x".repeat(20), fence },
    });
    assertProblem(huge, 400, "invalid_request");
    assert.deepEqual(huge.body.errors, [{ path: "fence", message }], String(fence));
  }
  const ttl = await acquire(name, { ttlMs: 2 ** 60 });
  assert.deepEqual(ttl.body.errors, [{ path: "ttlMs", message: "at most 300000" }]);
  assert.deepEqual((await call(`/v1/locks/${name}`)).body, { name, held: false });
});

Deno.test("names outside the character set or over 200 characters are 400", async () => {
  const { acquire, assertProblem } = await fixture();
  for (const name of ["a%20b", "a*b", "%7Bx%5D", "caf%C3%A9", "..%2F..", "x".repeat(201)]) {
    const r = await acquire(name);
    assertProblem(r, 400, "invalid_request");
    // the rule in words, never the pattern
    const [error] = r.body.errors as { path: string; message: string }[];
    assert.match(error!.message, /^(must be 1–200 characters of A-Z a-z 0-9|at most 200)/);
  }
  const token = await acquire(keygen(), { token: "short" });
  const [tokenError] = token.body.errors as { message: string }[];
  assert.equal(tokenError!.message, "must be 16–128 characters of A-Z a-z 0-9 _ -");
  assert.equal((await acquire("x".repeat(200))).status, 200);
  // Braces are a lock name's Redis Cluster hash tag, sent encoded as URLs need them.
  const tagged = await acquire("%7Bbank%7Dacct:1");
  assert.equal(tagged.status, 200);
  assert.equal(tagged.body.name, "{bank}acct:1");
});

Deno.test("malformed JSON, a wrong content type and a body over 64 KiB are refused", async () => {
  const { call, assertProblem } = await fixture();
  const path = `/v1/locks/${keygen()}/acquire`;
  const bad = await call(path, { body: "{nope" });
  assertProblem(bad, 400, "invalid_request");
  assert.equal(bad.body.detail, "The body is not valid JSON");
  // Valid JSON nested deeper than the parser's reviver can go (within the 64 KiB limit).
  const deep = await call(path, { body: `{"meta":${"[".repeat(30_000)}${"]".repeat(30_000)}}` });
  assertProblem(deep, 400, "invalid_request");
  assert.equal(deep.body.detail, "The body nests too deeply");
  assertProblem(await call(path, { body: "[]" }), 400, "invalid_request");
  assertProblem(
    await call(path, { body: "{}", headers: { "content-type": "text/plain" } }),
    400,
    "invalid_request",
  );
  const big = JSON.stringify({ meta: { x: "y".repeat(70 * 1024) } });
  assertProblem(await call(path, { body: big }), 413, "payload_too_large");
});

Deno.test("a missing or unknown API key gets 401 unauthorized, which says which it was", async () => {
  const { call, assertProblem } = await fixture();
  const path = `/v1/locks/${keygen()}`;
  const missing = "Send Authorization: Bearer <api key>";
  const refused =
    "The API key was refused: it is none of this service's keys (LOCK_API_KEYS, OPERATOR_API_KEYS)";
  for (
    const [request, detail] of [
      [{ secret: null }, missing],
      [{ headers: { authorization: A } }, missing],
      [{ secret: "wrong-secret-0123456789" }, refused],
      [{ secret: A.slice(0, -1) }, refused],
    ] as const
  ) {
    const reply = await call(path, request);
    assertProblem(reply, 401, "unauthorized");
    assert.equal(reply.body.detail, detail);
  }
});

Deno.test("GET / points to the API, its OpenAPI document, the dashboard and the health check", async () => {
  const { app } = await fixture();
  const res = await app.request("/");
  assert.equal(res.status, 200);
  const links = await res.json() as Json;
  assert.equal(links.openapi, "/openapi.json");
  assert.equal(links.dashboard, "/dashboard");
  for (const path of [links.openapi, links.dashboard, links.health] as string[]) {
    const linked = await app.request(path);
    await linked.body?.cancel();
    assert.notEqual(linked.status, 404, path);
  }
});

Deno.test("one tenant cannot see, renew, release or take another tenant's lock", async () => {
  const { call, acquire, assertProblem } = await fixture();
  const name = keygen();
  const { body: lease } = await acquire(name, { ttlMs: 5000 }, A);
  assert.deepEqual((await call(`/v1/locks/${name}`, { secret: B })).body, {
    name,
    held: false,
  });
  const renew = await call(`/v1/locks/${name}/renew`, {
    secret: B,
    body: { token: lease.token, ttlMs: 60000 },
  });
  assertProblem(renew, 409, "lock_lost");
  const release = await call(`/v1/locks/${name}/release`, {
    secret: B,
    body: { token: lease.token },
  });
  assert.deepEqual(release.body, { released: false });
  assert.equal((await acquire(name, {}, B)).status, 200, "B has its own namespace");
  const info = await call(`/v1/locks/${name}`, { secret: A });
  assert.equal(info.body.held, true);
  assert.equal(info.body.fence, lease.fence);
});

Deno.test("unknown routes are 404 problem+json", async () => {
  const { call, assertProblem } = await fixture();
  assertProblem(await call("/v1/nothing"), 404, "not_found");
  assertProblem(await call("/v1/locks/x/steal", { body: {} }), 404, "not_found");
  assertProblem(await call("/elsewhere", { secret: null }), 404, "not_found");
});

Deno.test("a known path with the wrong method is 405 with Allow", async () => {
  const { call, assertProblem } = await fixture();
  const wrong = await call("/v1/locks/x/acquire");
  assertProblem(wrong, 405, "method_not_allowed");
  assert.equal(wrong.res.headers.get("allow"), "POST");
  const inspect = await call("/v1/locks/x", { method: "DELETE" });
  assertProblem(inspect, 405, "method_not_allowed");
  assert.equal(inspect.res.headers.get("allow"), "GET, HEAD");
  assert.equal((await call("/healthz", { secret: null, method: "POST" })).status, 405);
});

Deno.test("the Bearer scheme is case-insensitive (RFC 9110 §11.1)", async () => {
  const { call, assertProblem } = await fixture();
  for (const scheme of ["bearer", "BEARER", "Bearer ", "bEaReR"]) {
    const r = await call(`/v1/locks/${keygen()}`, {
      secret: null,
      headers: { authorization: `${scheme} ${A}` },
    });
    assert.equal(r.status, 200, scheme);
  }
  const basic = await call("/v1/locks/x", {
    secret: null,
    headers: { authorization: `Basic ${A}` },
  });
  assertProblem(basic, 401, "unauthorized");
});

Deno.test("every reply carries x-request-id (the caller's if well-formed) and no-store", async () => {
  const { call } = await fixture();
  const replies = [
    await call(`/v1/locks/${keygen()}`),
    await call("/v1/nothing"),
    await call("/healthz", { secret: null }),
    await call("/openapi.json", { secret: null }),
    await call("/elsewhere", { secret: null }),
    await call("/v1/locks/x", { secret: "wrong-secret-0123456789" }),
    await call("/v1/locks/x/acquire", { body: "{not json" }),
  ];
  const ids = new Set<string>();
  for (const { res } of replies) {
    assert.equal(res.headers.get("cache-control"), "no-store", res.url);
    assert.match(res.headers.get("x-request-id") ?? "", /^[0-9a-f-]{36}$/);
    ids.add(res.headers.get("x-request-id")!);
  }
  assert.equal(ids.size, replies.length, "a new id for each request");
  const echoed = await call("/v1/nothing", { headers: { "x-request-id": "req-42.a:b" } });
  assert.equal(echoed.res.headers.get("x-request-id"), "req-42.a:b");
  assert.equal(echoed.body.requestId, "req-42.a:b", "problems name the request id");
  const junk = await call("/v1/nothing", { headers: { "x-request-id": "a b\u00e9" } });
  assert.notEqual(junk.res.headers.get("x-request-id"), "a b\u00e9");
});

Deno.test("each request logs one JSON line: route template, status, tenant, id, code", async () => {
  const { logs, call, acquire } = await fixture();
  const name = keygen();
  logs.length = 0;
  const ok = await acquire(name, { ttlMs: 2000 });
  const busy = await acquire(name, { ttlMs: 2000 }, B);
  const held = await acquire(name, { ttlMs: 2000 });
  await call("/v1/nothing", { secret: "wrong-secret-0123456789" });
  assert.equal(logs.length, 4, JSON.stringify(logs));
  const [first, second, third, fourth] = logs as [
    RequestLog,
    RequestLog,
    RequestLog,
    RequestLog,
  ];
  assert.deepEqual(
    { ...first, durationMs: 0 },
    {
      level: "info",
      msg: "request",
      requestId: ok.res.headers.get("x-request-id"),
      method: "POST",
      route: "/v1/locks/:name/acquire",
      status: 200,
      durationMs: 0,
      tenant: "a",
    },
  );
  assert.ok(first.durationMs >= 0);
  assert.equal(busy.status, 200, "tenants have their own locks");
  assert.deepEqual(
    [second.tenant, third.level, third.status, third.code],
    ["b", "warn", 409, "lock_busy"],
  );
  assert.equal(held.status, 409);
  assert.deepEqual([fourth.status, fourth.code, fourth.tenant], [
    401,
    "unauthorized",
    undefined,
  ]);
  assert.equal(fourth.route, "(none)");
  for (const line of logs) assert.ok(!JSON.stringify(line).includes(name), "no lock names");
});

Deno.test("healthz answers 200 while Redis runs", async () => {
  const { call } = await fixture();
  const r = await call("/healthz", { secret: null });
  assert.deepEqual([r.status, r.body], [200, { ok: true }]);
});

Deno.test("/openapi.json is OpenAPI 3.1 and lists every route", async () => {
  const { call } = await fixture();
  const r = await call("/openapi.json", { secret: null });
  assert.equal(r.body.openapi, "3.1.0");
  const paths = r.body.paths as Record<string, Json>;
  assert.deepEqual(Object.keys(paths).sort(), [
    "/healthz",
    "/metrics",
    "/v1/audit",
    "/v1/dedupe/{namespace}/{id}",
    "/v1/dedupe/{namespace}/{id}/claim",
    "/v1/dedupe/{namespace}/{id}/done",
    "/v1/dedupe/{namespace}/{id}/release",
    "/v1/dedupe/{namespace}/{id}/renew",
    "/v1/idempotency/{scope}/{key}",
    "/v1/idempotency/{scope}/{key}/claim",
    "/v1/idempotency/{scope}/{key}/complete",
    "/v1/idempotency/{scope}/{key}/release",
    "/v1/idempotency/{scope}/{key}/renew",
    "/v1/jobs/{job}/extend",
    "/v1/jobs/{job}/finish",
    "/v1/jobs/{job}/start",
    "/v1/locks",
    "/v1/locks/acquire",
    "/v1/locks/renew",
    "/v1/locks/{name}",
    "/v1/locks/{name}/acquire",
    "/v1/locks/{name}/break",
    "/v1/locks/{name}/release",
    "/v1/locks/{name}/renew",
    "/v1/me",
    "/v1/stats",
  ]);
  const file = await Deno.makeTempFile({ suffix: ".json" });
  try {
    await Deno.writeTextFile(file, JSON.stringify(r.body));
    const lint = await new Deno.Command(Deno.execPath(), {
      // --cached-only: `deno install` (part of `deno task test`) fetched it; tests stay offline.
      args: [
        "run",
        "-A",
        "--cached-only",
        "npm:@redocly/cli",
        "lint",
        file,
        "--format=summary",
      ],
      env: { NO_COLOR: "1", REDOCLY_TELEMETRY: "off", REDOCLY_SUPPRESS_UPDATE_NOTICE: "true" },
      stdout: "piped",
      stderr: "piped",
    }).output();
    const report = new TextDecoder().decode(lint.stdout) +
      new TextDecoder().decode(lint.stderr);
    assert.ok(lint.success, `redocly lint failed:\n${report}`);
    assert.match(report, /valid/);
    assert.doesNotMatch(report, /warning/i, report);
  } finally {
    await Deno.remove(file);
  }
});

Deno.test("2,000 random requests never get a 5xx and leave existing locks intact", async () => {
  const { app, call, acquire } = await fixture();
  const name = keygen();
  const { body: lease } = await acquire(name, { ttlMs: 60000 });
  const segment = fc.oneof(
    fc.constantFrom(
      "v1",
      "locks",
      "acquire",
      "renew",
      "release",
      name,
      "..",
      "%2e%2e",
      "%00",
    ),
    fc.string({ maxLength: 12 }).map(encodeURIComponent),
  );
  const value = fc.oneof(
    fc.integer(),
    fc.double(),
    fc.string({ maxLength: 40 }),
    fc.constant(null),
    fc.boolean(),
    fc.constant(String(lease.token).slice(0, -1) + "x"),
    fc.array(fc.integer(), { maxLength: 3 }),
    fc.dictionary(fc.string({ maxLength: 5 }), fc.string({ maxLength: 5 }), { maxKeys: 3 }),
  );
  const body = fc.oneof(
    fc.dictionary(
      fc.constantFrom("ttlMs", "waitMs", "token", "meta", "x", "__proto__"),
      value,
      { maxKeys: 4 },
    ).map((o) => JSON.stringify(o)),
    fc.string({ maxLength: 60 }),
    fc.constant(undefined),
  );
  const request = fc.record({
    method: fc.constantFrom("GET", "POST", "PUT", "DELETE", "PATCH"),
    path: fc.array(segment, { minLength: 1, maxLength: 5 }).map((s) => `/${s.join("/")}`),
    secret: fc.constantFrom(A, B, "wrong", ""),
    contentType: fc.constantFrom(
      "application/json",
      "text/plain",
      "",
      "application/json; charset=utf-8",
    ),
    body,
  });
  let count = 0;
  await fc.assert(
    fc.asyncProperty(request, async ({ method, path, secret, contentType, body }) => {
      count++;
      const res = await app.request(path, {
        method,
        headers: {
          authorization: `Bearer ${secret}`,
          ...(contentType && { "content-type": contentType }),
        },
        body: method === "GET" ? undefined : body,
      });
      const text = await res.text();
      assert.ok(res.status < 500, `${method} ${path} ${body} → ${res.status} ${text}`);
      if (res.status >= 400) {
        assert.equal(res.headers.get("content-type"), "application/problem+json");
        assert.equal(JSON.parse(text).status, res.status);
      }
      assert.ok(!text.includes(String(lease.token)), "no reply leaks the holder's token");
    }),
    { numRuns: 2000 },
  );
  assert.equal(count, 2000);
  const info = await call(`/v1/locks/${name}`);
  assert.equal(info.body.held, true);
  assert.equal(info.body.fence, lease.fence);
});

Deno.test("Redis unreachable gives 503 backend_unavailable with Retry-After, then recovers", async () => {
  const { backend, logs, call, acquire, assertProblem } = await fixture();
  const port = backend.server.port;
  const dir = backend.server.dir;
  await backend.server.stop({ remove: false });
  logs.length = 0;
  const name = keygen();
  const down = await acquire(name);
  assertProblem(down, 503, "backend_unavailable");
  assert.ok(Number(down.res.headers.get("retry-after")) >= 1);
  // None of the internals: key names or layout, script names or SHAs, upstream text.
  const text = JSON.stringify(down.body);
  for (const secret of [`edgelock:a`, name, "acquire", "script", "Redis did not run"]) {
    assert.ok(!text.includes(secret), `the reply names ${secret}: ${text}`);
  }
  assert.doesNotMatch(text, /[0-9a-f]{40}|ECONNREFUSED|refused|fetch|Error|at /);
  // The detail is in the log line of the same request id.
  const line = logs.find((entry) => entry.requestId === down.body.requestId);
  assert.equal(line?.level, "error");
  assert.equal(line?.code, "backend_unavailable");
  assert.match(line?.error ?? "", /The acquire script failed or its reply was lost/);
  assertProblem(await call("/healthz", { secret: null }), 503, "backend_unavailable");
  const { startRedisServer } = await import("../dev/redis_server.ts");
  const restarted = await startRedisServer({ port, dir });
  // It runs in the first server's temp dir: stopping it removes the dir too.
  backend.server = { ...restarted, stop: (o) => restarted.stop({ remove: true, ...o }) };
  let healthy = false;
  for (let i = 0; i < 100 && !healthy; i++) {
    healthy = (await call("/healthz", { secret: null })).status === 200;
    if (!healthy) await new Promise((resolve) => setTimeout(resolve, 50));
  }
  assert.ok(healthy, "healthz recovers once Redis is back");
  // Each of the bridge's pooled connections reconnects on its own: an acquire may meet one that
  // has not yet, under load.
  let status = 0;
  for (let i = 0; i < 100 && status !== 200; i++) {
    status = (await acquire(keygen())).status;
    if (status !== 200) await new Promise((resolve) => setTimeout(resolve, 50));
  }
  assert.equal(status, 200, "locks are granted again once Redis is back");
});

Deno.test("a tenant's concurrent waits beyond maxWaits get 429, and free up again", async () => {
  const { backend, make, post, problemOf } = await fixture();
  const app = make({ maxWaits: 2, requestsPerSecond: 0 });
  const name = keygen();
  const held = await post(app, `/v1/locks/${name}/acquire`, { ttlMs: 5000 });
  const { token } = await held.json() as Json;
  const waits = [1, 2].map(() =>
    post(app, `/v1/locks/${name}/acquire`, { ttlMs: 5000, waitMs: 3000 })
  );
  const queue = lockKeys(name, "edgelock:l")[1];
  await until("both waits are in flight", async () => await backend.redis.zcard(queue) === 2);
  const third = await problemOf(
    await post(app, `/v1/locks/${name}/acquire`, { waitMs: 800 }),
  );
  assert.equal(third.status, 429);
  assert.equal(third.code, "too_many_requests");
  assert.equal(third.retryAfter, "1");
  const noWait = await problemOf(await post(app, `/v1/locks/${name}/acquire`, {}));
  assert.equal(noWait.code, "lock_busy", "an acquire that does not wait is not counted");
  for (const res of await Promise.all(waits)) assert.equal(res.status, 409);
  await post(app, `/v1/locks/${name}/release`, { token });
  const again = await post(app, `/v1/locks/${name}/acquire`, { waitMs: 800 });
  assert.equal(again.status, 200, "the finished waits no longer count");
  await again.body?.cancel();
});

Deno.test("a tenant over requestsPerSecond gets 429 with Retry-After", async () => {
  const { make, post, problemOf } = await fixture();
  const app = make({ requestsPerSecond: 5 });
  // A burst of 20 at once: 5 fit the bucket, a few more may refill while it runs.
  const replies = await Promise.all(
    Array.from({ length: 20 }, () => post(app, `/v1/locks/${keygen()}/acquire`, {})),
  );
  const limited = replies.filter((res) => res.status === 429);
  assert.ok(limited.length >= 10, `${limited.length} of 20 limited`);
  for (const res of replies) {
    if (res.status !== 429) {
      assert.equal(res.status, 200);
      await res.body?.cancel();
      continue;
    }
    const problem = await problemOf(res);
    assert.equal(problem.code, "too_many_requests");
    assert.ok(Number(problem.retryAfter) >= 1 && Number(problem.retryAfterMs) > 0);
  }
  assert.throws(() => make({ maxWaits: 0 }), /maxWaits must be/);
  assert.throws(() => make({ requestsPerSecond: -1 }), /requestsPerSecond must be/);
});

Deno.test("a list page counts as its limit against the rate, so no request makes unbounded work", async () => {
  const { secret, make } = await fixture();
  const get = (app: ReturnType<typeof make>, path: string) =>
    app.request(path, { headers: { authorization: `Bearer ${secret}` } });
  for (const limit of [2, 1000]) {
    const page = await get(make({ requestsPerSecond: 5 }), `/v1/locks?limit=${limit}`);
    assert.equal(page.status, 200, "any page passes a full bucket: at most a second's worth");
    await page.body?.cancel();
  }
  let now = 0;
  const limiter = tenantLimiter({ requestsPerSecond: 100 }, () => now);
  limiter.admit("a");
  limiter.charge("a", 59); // a page of 60
  limiter.admit("a");
  assert.throws(() => limiter.charge("a", 59), /Over 100 requests per second/);
  now = 200; // 20 more tokens: a page of 60 again
  limiter.charge("a", 59);
  limiter.admit("b");
  limiter.charge("b", 1000); // a page of 1000 costs one second's worth
  assert.throws(() => limiter.admit("b"), /Over 100 requests per second/);
});

Deno.test("the rate limit refills continuously, per tenant (a stepped clock)", () => {
  let now = 0;
  const limiter = tenantLimiter({ requestsPerSecond: 5 }, () => now);
  const admitted = (tenant: string) => {
    try {
      limiter.admit(tenant);
      return true;
    } catch (error) {
      assert.equal((error as { code?: string }).code, "too_many_requests");
      return false;
    }
  };
  assert.deepEqual(Array.from({ length: 6 }, () => admitted("a")), [
    true,
    true,
    true,
    true,
    true,
    false,
  ]);
  assert.equal(admitted("b"), true, "another tenant has its own bucket");
  now = 199;
  assert.equal(admitted("a"), false, "one token takes 200 ms");
  now = 200;
  assert.equal(admitted("a"), true);
  now = 10_000;
  assert.equal(
    Array.from({ length: 7 }, () => admitted("a")).filter(Boolean).length,
    5,
    "at most one second's worth after a long pause",
  );
});

Deno.test("a full wait queue is 409 queue_full with Retry-After", async () => {
  const { backend, make, post, problemOf } = await fixture();
  const app = make({});
  const name = keygen();
  (await post(app, `/v1/locks/${name}/acquire`, { ttlMs: 5000 })).body?.cancel();
  for (let i = 0; i < DEFAULT_MAX_WAITERS; i++) {
    const token = `waiter-${String(i).padStart(12, "0")}`;
    await takeTicket(backend.redis, name, token, 10_000, { prefix: "edgelock:l" });
  }
  const full = await problemOf(await post(app, `/v1/locks/${name}/acquire`, { waitMs: 1000 }));
  assert.equal(full.status, 409);
  assert.equal(full.code, "queue_full");
  assert.ok(Number(full.retryAfterMs) > 0 && Number(full.retryAfter) >= 1);
});

Deno.test("a paused Redis gives 503 within the deadline, with nothing internal in the reply", async () => {
  const { backend, make, post } = await fixture();
  const app = make({});
  const { Redis: IORedis } = await import("ioredis");
  const direct = new IORedis(backend.server.url);
  const info = await direct.info("server").finally(() => direct.disconnect());
  const pid = Number(/process_id:(\d+)/.exec(info)![1]);
  Deno.kill(pid, "SIGSTOP");
  let res: Response;
  const started = performance.now();
  try {
    res = await post(app, `/v1/locks/${keygen()}/acquire`, {});
  } finally {
    Deno.kill(pid, "SIGCONT");
  }
  assert.ok(performance.now() - started < 1500);
  const text = await res.text();
  assert.equal(res.status, 503);
  assert.equal(JSON.parse(text).code, "backend_unavailable");
  assert.ok(Number(res.headers.get("retry-after")) >= 1);
  for (const secretText of ["acquire script", "300 ms", "edgelock:l:", backend.token]) {
    assert.ok(!text.includes(secretText), `the reply names ${secretText}: ${text}`);
  }
});

Deno.test("the library, the service and the typed client accept exactly the same names", async () => {
  const { backend, secret, make } = await fixture();
  const app = make({ requestsPerSecond: 0 });
  const locks = new Locks(backend.redis, { prefix: "edgelock:l" });
  const remote = createClient({
    baseUrl: "http://edgelock.test",
    apiKey: secret,
    fetch: async (input, init) => await app.fetch(new Request(input, init)),
  });
  await fc.assert(
    fc.asyncProperty(
      fc.oneof(
        fc.constantFrom(".", "..", "...", "./a", "a/.", "%2e", ".%2e", "a b", ""),
        fc.stringMatching(/^[A-Za-z0-9._:\-/%]{1,6}$/),
      ),
      async (name) => {
        // Busy or acquired, it was taken as a name; a RangeError means it was refused.
        const outcome = (r: Promise<unknown>) => r.then(() => "taken", (e) => e.name);
        const embedded = await outcome(locks.acquire(name, { ttlMs: 100 }));
        const overHttp = await outcome(remote.acquire(name, { ttlMs: 100 }));
        assert.ok(["taken", "RangeError", "TypeError"].includes(embedded), embedded);
        assert.equal(overHttp, embedded, JSON.stringify(name));
      },
    ),
    { numRuns: 300 },
  );
});

Deno.test("a body is read as JSON whatever the media type's spelling, and empty is {}", async () => {
  const { call, assertProblem } = await fixture();
  const name = keygen();
  // An empty POST takes every default (curl -X POST without -d).
  const bare = await call(`/v1/locks/${name}/acquire`, { method: "POST" });
  assert.equal(bare.status, 200, JSON.stringify(bare.body));
  const token = bare.body.token as string;
  // An empty body where a field is required names the field.
  const renew = await call(`/v1/locks/${name}/renew`, { method: "POST" });
  assertProblem(renew, 400, "invalid_request");
  assert.ok((renew.body.errors as { path: string }[]).some((e) => e.path === "token"));
  for (
    const type of ["application/json ; charset=utf-8", "APPLICATION/JSON", "application/x+json"]
  ) {
    const r = await call(`/v1/locks/${name}/release`, {
      body: { token },
      headers: { "content-type": type },
    });
    assert.equal(r.status, 200, `${type}: ${JSON.stringify(r.body)}`);
  }
});

Deno.test("a __proto__ key in a body is refused, not dropped on the way to Redis", async () => {
  const { call, assertProblem } = await fixture();
  const body = '{"meta":{"__proto__":{"admin":true},"a":1}}';
  const r = await call(`/v1/locks/${keygen()}/acquire`, { body });
  assertProblem(r, 400, "invalid_request");
  assert.match(r.body.detail as string, /__proto__/);
});

Deno.test("a repeated or loosely written query parameter is refused, naming it", async () => {
  const { call, assertProblem } = await fixture();
  const twice = await call("/v1/locks?limit=5&limit=abc");
  assertProblem(twice, 400, "invalid_request");
  assert.match(twice.body.detail as string, /\?limit= more than once/);
  for (const limit of ["0x10", "%205", "1e3", "5.0", "", "0", "1001"]) {
    const r = await call(`/v1/locks?limit=${limit}`);
    assertProblem(r, 400, "invalid_request");
    const errors = r.body.errors as { path: string; message: string }[];
    assert.deepEqual(errors.map((e) => e.path), ["limit"], limit);
    assert.match(errors[0]!.message, /whole number from 1 to 1000/);
  }
  assert.equal((await call("/v1/locks?limit=1000")).status, 200);
});

Deno.test("a path that only looks like a route's is 404, not 405", async () => {
  const { call, assertProblem } = await fixture();
  assertProblem(await call("/openapiXjson", { secret: null }), 404, "not_found");
  assertProblem(await call("/dashboard/appXjs", { secret: null }), 404, "not_found");
});

Deno.test("a job's tick that is neither a name nor a whole number is named in the error", async () => {
  const { call, assertProblem } = await fixture();
  for (const tick of [1.5, {}, -1, ""]) {
    const r = await call(`/v1/jobs/${keygen("j")}/start`, { body: { atMostMs: 1000, tick } });
    assertProblem(r, 400, "invalid_request");
    const errors = r.body.errors as { path: string; message: string }[];
    assert.ok(
      errors.some((e) => e.path === "tick" && /tick must be/.test(e.message)),
      `${tick}`,
    );
  }
});

Deno.test("whatever Redis answers, no reply is a 400 or carries the engine's words", async () => {
  const { backend } = await fixture();
  // Scripts that answer what no edgelock script does: reading such a reply may throw the
  // engine's own TypeError ("Cannot read properties of null"), which is edgelock's failure.
  let answer: unknown = null;
  const broken = new Proxy(backend.redis, {
    get: (target, key, receiver) =>
      key === "evalsha" || key === "eval"
        ? () => Promise.resolve(answer)
        : Reflect.get(target, key, receiver),
  });
  const app = createApp({ redis: broken, apiKeys, log: () => {} });
  const reply = fc.oneof(
    fc.constantFrom(null, 0, 1, -1, "", "x", [], {}),
    fc.array(
      fc.oneof(
        fc.integer({ min: -2, max: 3 }),
        fc.constant(null),
        // texts a reply may carry (a hint, a stream id, JSON-looking), none the words looked for
        fc.constantFrom("", "x", "wAbCdEfGh12345678", "1-0", "{}", "null", "1.5"),
        fc.constant([]),
      ),
      { maxLength: 12 },
    ),
  );
  const route = fc.constantFrom(
    ["acquire", {}],
    ["acquire", { mode: "shared" }],
    ["acquire", { limit: 3 }],
    ["acquire", { waitMs: 200 }],
    ["renew", { token: "a-token-of-16-chars-or-more", ttlMs: 5000 }],
    ["release", { token: "a-token-of-16-chars-or-more" }],
    ["break", {}],
  );
  await fc.assert(
    fc.asyncProperty(reply, route, async (value, [path, body]) => {
      answer = value;
      const res = await app.request(`/v1/locks/${keygen()}/${path}`, {
        method: "POST",
        headers: { authorization: `Bearer ${A}`, "content-type": "application/json" },
        body: JSON.stringify(body),
      });
      const text = await res.text();
      assert.notEqual(res.status, 400, `${path} ${JSON.stringify(value)}: ${text}`);
      assert.doesNotMatch(
        text,
        /Cannot read|properties of|is not (a function|iterable|defined)|undefined|NaN/,
      );
    }),
    { numRuns: 300 },
  );
});

Deno.test("only edgelock's own checks are a 400 with their message; a bug's TypeError is a 500", async () => {
  const { backend } = await fixture();
  const locks = new Locks(backend.redis);
  const own = await locks.acquire("a name", { ttlMs: -1 }).catch((error) => error);
  assert.ok(own instanceof RangeError, "the library's check is a RangeError to its callers");
  assert.equal(own.name, "RangeError");
  const mapped = toEdgelockError(own);
  assert.equal(mapped.code, "invalid_request");
  assert.equal(mapped.message, own.message);
  // What a bug in edgelock raises: the engine's TypeError, and a RangeError of its own.
  const bug = (() => {
    try {
      return (null as unknown as { x: number }).x;
    } catch (error) {
      return error;
    }
  })();
  for (
    const error of [bug, new RangeError("Invalid time value"), new TypeError("x is not a function")]
  ) {
    const { code, message } = toEdgelockError(error);
    assert.equal(code, "internal_error");
    assert.equal(message, "The service failed unexpectedly");
  }
});

Deno.test("a body cut short is a 400 in edgelock's words, through Deno.serve", async () => {
  const { backend } = await fixture();
  const logs: RequestLog[] = [];
  const app = createApp({ redis: backend.redis, apiKeys, log: (entry) => logs.push(entry) });
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, app.fetch);
  try {
    const head = (extra: string) =>
      `POST /v1/locks/${keygen()}/acquire HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${A}\r\n` +
      `Content-Type: application/json\r\n${extra}Connection: close\r\n\r\n`;
    for (
      const request of [
        head("Content-Length: 100\r\n") + "{}", // fewer bytes than it said
        head("Transfer-Encoding: chunked\r\n") + "2\r\n{}\r\n", // no last chunk
      ]
    ) {
      const { status, body } = await sendRaw(server.addr.port, request);
      assert.equal(status, 400, body);
      assert.equal(JSON.parse(body).code, "invalid_request");
      assert.match(JSON.parse(body).detail, /could not be read: the connection ended/);
    }
    // A GET with a body is served: no GET route reads one.
    const got = await sendRaw(
      server.addr.port,
      `GET /v1/me HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${A}\r\n` +
        "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    );
    assert.equal(got.status, 200, got.body);
    assert.ok(logs.every((entry) => entry.level !== "error"), JSON.stringify(logs));
  } finally {
    await server.shutdown();
  }
});
