// Operating the service: /v1/stats, /metrics, GET /v1/locks, break and audit, tenant and operator
// keys. The counts are compared exactly with what the clients did.
import assert from "node:assert/strict";
import { createApp } from "../src/service/mod.ts";
import { parseApiKeys, parseOperatorKeys } from "../src/service/auth.ts";
import { createClient } from "../src/client/client.ts";
import { keygen, shared, startBackend } from "./_backend.ts";
import { Locks } from "../src/core/locks.ts";
import { LockOps } from "../src/core/ops.ts";

const A = "tenant-a-secret-0123456789";
const B = "tenant-b-secret-0123456789";
const OPS = "operator-secret-0123456789";
const apiKeys = parseApiKeys(`a:${A},b:${B}`);
const operatorKeys = parseOperatorKeys(`ops:${OPS}`, apiKeys);

type Json = Record<string, unknown>;

// One line of the Prometheus text format: a comment, or name{labels} value.
const EXPOSITION_LINE =
  /^(# (HELP|TYPE) [a-z_]+ .+|[a-z_]+\{([a-z_]+="[^"\\\n]*",?)*\} -?[0-9.e+]+|[a-z_]+\{([a-z_]+="[^"\\\n]*",?)*\} \+Inf)$/;

const fixture = shared(async () => {
  const backend = await startBackend();
  const keyPrefix = keygen("ops");
  const app = createApp({
    redis: backend.redis,
    apiKeys,
    operatorKeys,
    keyPrefix,
    log: () => {},
  });
  const call = async (
    path: string,
    { secret = A, body, method }: { secret?: string; body?: unknown; method?: string } = {},
  ) => {
    const res = await app.request(path, {
      method: method ?? (body === undefined ? "GET" : "POST"),
      headers: {
        authorization: `Bearer ${secret}`,
        ...(body !== undefined && { "content-type": "application/json" }),
      },
      body: body === undefined ? undefined : typeof body === "string" ? body : JSON.stringify(body),
    });
    const text = await res.text();
    const json = res.headers.get("content-type")?.includes("json") ? JSON.parse(text) : {};
    return { res, status: res.status, body: json as Json, text };
  };
  const client = createClient({
    baseUrl: "http://edgelock.test",
    apiKey: A,
    fetch: (input, init) => Promise.resolve(app.fetch(new Request(input, init))),
  });
  return { backend, keyPrefix, app, call, client };
}, ({ backend }) => backend.stop());

Deno.test("stats and /metrics count exactly what a tenant's clients did, and only that tenant's", async () => {
  const { call, client } = await fixture();
  const leases = [];
  for (const name of ["x", "y", "z"]) {
    const r = await client.acquire(name, { ttlMs: 10_000 });
    assert.ok(r.acquired);
    leases.push(r.lease);
  }
  assert.equal((await client.acquire("x")).acquired, false);
  assert.equal((await client.acquire("x", { waitMs: 120 })).acquired, false);
  assert.equal((await client.renew(leases[0]!)).renewed, true);
  assert.equal(await client.release(leases[2]!), true);
  const stats = await call("/v1/stats");
  assert.equal(stats.status, 200);
  const total = stats.body.total as Record<string, Record<string, number>>;
  assert.deepEqual(total.acquire, {
    granted: 3,
    busy: 1,
    timeout: 1,
    queue_full: 0,
    aborted: 0,
  });
  assert.deepEqual(total.renew, { renewed: 1, lost: 0 });
  assert.deepEqual(total.release, { released: 1, lost: 0 });
  assert.equal(stats.body.locks_held, 2);
  assert.equal(stats.body.tenant, "a");
  const other = await call("/v1/stats", { secret: B });
  assert.equal((other.body.total as { acquire: { granted: number } }).acquire.granted, 0);

  const metrics = await call("/metrics");
  assert.equal(metrics.status, 200);
  assert.match(metrics.res.headers.get("content-type")!, /^text\/plain; version=0\.0\.4/);
  const lines = metrics.text.trimEnd().split("\n");
  for (const line of lines) assert.match(line, EXPOSITION_LINE);
  for (
    const expected of [
      'edgelock_acquire_total{tenant="a",outcome="granted"} 3',
      'edgelock_acquire_total{tenant="a",outcome="busy"} 1',
      'edgelock_acquire_total{tenant="a",outcome="timeout"} 1',
      'edgelock_renew_total{tenant="a",outcome="renewed"} 1',
      'edgelock_release_total{tenant="a",outcome="released"} 1',
      'edgelock_lease_lost_total{tenant="a"} 0',
      'edgelock_locks_held{tenant="a"} 2',
      'edgelock_wait_seconds_bucket{tenant="a",le="+Inf"} 3',
      'edgelock_wait_seconds_count{tenant="a"} 3',
      'edgelock_hold_seconds_count{tenant="a"} 1',
      "# TYPE edgelock_wait_seconds histogram",
      "# TYPE edgelock_acquire_total counter",
      "# TYPE edgelock_locks_held gauge",
    ]
  ) assert.ok(lines.includes(expected), `missing ${expected}`);
  assert.ok(!lines.some((l) => l.includes('tenant="b"')), "a tenant reads only its own");
  assert.ok(!/"[xyz]"/.test(metrics.text), "no lock name is a label");
  const buckets = lines.filter((l) => l.startsWith("edgelock_wait_seconds_bucket"))
    .map((l) => Number(l.split(" ")[1]));
  assert.deepEqual(buckets, [...buckets].sort((p, q) => p - q), "buckets are cumulative");

  const all = await call("/metrics", { secret: OPS });
  assert.ok(all.text.includes('edgelock_acquire_total{tenant="b",outcome="granted"} 0'));
  assert.ok(all.text.includes('edgelock_acquire_total{tenant="a",outcome="granted"} 3'));
  for (const lease of leases.slice(0, 2)) await client.release(lease);
});

Deno.test("GET /v1/locks lists exactly the tenant's held locks, a page at a time", async () => {
  const { call, client } = await fixture();
  const names = ["job:1", "job:2", "job:3", "other"];
  const leases = [];
  for (const name of names) {
    const r = await client.acquire(name, { ttlMs: 10_000, meta: { n: name } });
    assert.ok(r.acquired);
    leases.push(r.lease);
  }
  const first = await call("/v1/locks?prefix=job:&limit=2");
  assert.equal(first.status, 200);
  const page = first.body as { locks: Json[]; cursor?: string };
  assert.deepEqual(page.locks.map((l) => l.name), ["job:1", "job:2"]);
  assert.equal(page.locks[0]!.fence, leases[0]!.fence);
  assert.equal(page.locks[0]!.waiters, 0);
  assert.ok(!("token" in page.locks[0]!), "never a token");
  const second = await call(`/v1/locks?prefix=job:&limit=2&cursor=${page.cursor}`);
  assert.deepEqual((second.body.locks as Json[]).map((l) => l.name), ["job:3"]);
  assert.equal(second.body.cursor, undefined);
  assert.deepEqual((await call("/v1/locks", { secret: B })).body.locks as Json[], []);
  const asOperator = await call("/v1/locks?tenant=a&prefix=job:", { secret: OPS });
  assert.equal((asOperator.body.locks as Json[]).length, 3);
  for (const lease of leases) await client.release(lease);
  assert.deepEqual((await call("/v1/locks")).body.locks as Json[], []);
});

Deno.test("only an operator breaks a lock: the holder then loses it, and the audit names who", async () => {
  const { call, client } = await fixture();
  const name = keygen("stuck");
  const r = await client.acquire(name, { ttlMs: 10_000 });
  assert.ok(r.acquired);
  const byTenant = await call(`/v1/locks/${name}/break`, { body: {} });
  assert.equal(byTenant.status, 403);
  assert.equal(byTenant.body.code, "forbidden");
  // A fence that is no lease's is refused before anything is broken, named, never a 5xx.
  for (const fence of [0, -1, 1.5, "7", 2 ** 60]) {
    const bad = await call(`/v1/locks/${name}/break?tenant=a`, { secret: OPS, body: { fence } });
    assert.equal(bad.status, 400, `${fence}: ${bad.text}`);
    assert.equal(bad.res.headers.get("content-type"), "application/problem+json");
    assert.deepEqual((bad.body.errors as Json[]).map((e) => e.path), ["fence"], bad.text);
  }
  const broken = await call(`/v1/locks/${name}/break?tenant=a`, {
    secret: OPS,
    body: { reason: "holder crashed" },
  });
  assert.equal(broken.status, 200);
  assert.deepEqual(broken.body, { broken: true, fence: r.lease.fence });
  assert.equal((await client.renew(r.lease)).renewed, false, "the holder lost it");
  const again = await call(`/v1/locks/${name}/break?tenant=a`, {
    secret: OPS,
    method: "POST",
  });
  assert.deepEqual(again.body, { broken: false });
  const audit = await call("/v1/audit");
  const entries = audit.body.entries as Json[];
  assert.equal(entries.length, 1);
  assert.equal(entries[0]!.by, "ops");
  assert.equal(entries[0]!.name, name);
  assert.equal(entries[0]!.reason, "holder crashed");
  assert.equal(entries[0]!.fence, r.lease.fence);
  const stats = await call("/v1/stats?tenant=a", { secret: OPS });
  const total = stats.body.total as { break: { broken: number }; lease_lost: number };
  assert.equal(total.break.broken, 1);
  assert.equal(total.lease_lost, 1);
});

Deno.test("the typed client reads the same list, stats and audit, and breaks with an operator key", async () => {
  const { app, call, client } = await fixture();
  const held = await client.acquire("client:1", { ttlMs: 10_000 });
  assert.ok(held.acquired);
  const page = await client.list({ prefix: "client:" });
  assert.deepEqual(page.locks.map((l) => [l.name, l.fence]), [[
    "client:1",
    held.lease.fence,
  ]]);
  const before = await client.stats();
  assert.equal(before.tenant, "a");
  assert.deepEqual(before.total, (await call("/v1/stats")).body.total);
  const operator = createClient({
    baseUrl: "http://edgelock.test",
    apiKey: OPS,
    tenant: "a",
    fetch: (input, init) => Promise.resolve(app.fetch(new Request(input, init))),
  });
  await assert.rejects(client.break("client:1"), { code: "forbidden" });
  // Another lease's fence (one granted since the operator looked, say) breaks nothing.
  const other = held.lease.fence + 1;
  assert.deepEqual(await operator.break("client:1", { fence: other }), { broken: false });
  assert.deepEqual(await operator.break("client:1", { reason: "test", fence: held.lease.fence }), {
    broken: true,
    fence: held.lease.fence,
  });
  const [latest] = await operator.audit({ limit: 1 });
  assert.equal(latest!.name, "client:1");
  assert.equal((await operator.stats()).total.break.broken, before.total.break.broken + 1);
  await assert.rejects(operator.acquire("x"), { code: "forbidden" });
});

Deno.test("keys are kept to their roles, and bad queries are 400s, never 5xx", async () => {
  const { keyPrefix, call } = await fixture();
  const me = await call("/v1/me");
  assert.deepEqual(me.body, { role: "tenant", name: "a", tenants: ["a"] });
  const op = await call("/v1/me", { secret: OPS });
  assert.deepEqual(op.body, { role: "operator", name: "ops", tenants: ["a", "b"] });
  const cases: [
    string,
    { secret?: string; body?: unknown; method?: string },
    number,
    string,
  ][] = [
    ["/v1/locks/x/acquire", { secret: OPS, body: {} }, 403, "forbidden"],
    ["/v1/stats?tenant=b", {}, 403, "forbidden"],
    ["/v1/stats", { secret: OPS }, 400, "invalid_request"],
    ["/v1/stats?tenant=nobody", { secret: OPS }, 404, "not_found"],
    ["/v1/locks?limit=0", {}, 400, "invalid_request"],
    ["/v1/locks?limit=abc", {}, 400, "invalid_request"],
    ["/v1/locks?prefix=a%20b", {}, 400, "invalid_request"],
    ["/v1/locks?cursor=..", {}, 400, "invalid_request"],
    ["/v1/audit?limit=1001", {}, 400, "invalid_request"],
    ["/v1/locks/x/break?tenant=a", { secret: OPS, body: "{oops" }, 400, "invalid_request"],
    ["/v1/locks/x/break?tenant=a", { secret: OPS, body: { by: "me" } }, 400, "invalid_request"],
    [
      "/v1/locks/x/break?tenant=a",
      { secret: OPS, body: { reason: "a\nb" } },
      400,
      "invalid_request",
    ],
    ["/metrics", { secret: "not-a-key-0123456789" }, 401, "unauthorized"],
  ];
  for (const [path, options, status, code] of cases) {
    const r = await call(path, options);
    assert.equal(r.status, status, `${path}: ${JSON.stringify(r.body)}`);
    assert.equal(r.body.code, code, path);
    assert.ok(!JSON.stringify(r.body).includes(keyPrefix), "no key names in replies");
  }
});

Deno.test("a tenant's key may not break a lock, whatever body it sends", async () => {
  const { call } = await fixture();
  for (const body of [undefined, { reason: 42 }, "{nope"]) {
    const r = await call("/v1/locks/x/break", { method: "POST", body });
    assert.equal(r.status, 403, JSON.stringify(r.body));
    assert.equal(r.body.code, "forbidden");
  }
});

Deno.test("without stats, the stats routes are 404 and say the service keeps none", async () => {
  const { backend } = await fixture();
  const app = createApp({ redis: backend.redis, apiKeys, stats: false, log: () => {} });
  for (const path of ["/v1/stats", "/v1/locks", "/metrics"]) {
    const res = await app.request(path, { headers: { authorization: `Bearer ${A}` } });
    const body = await res.json();
    assert.equal(res.status, 404, path);
    assert.equal(body.code, "not_found");
    assert.match(body.detail, /keeps no stats/);
    assert.doesNotMatch(body.detail, /createApp/);
  }
});

Deno.test("names and reasons that read as JSON are listed and audited as they were given", async () => {
  const { backend } = await fixture();
  // @upstash/redis parses every reply text that reads as JSON (automaticDeserialization).
  const prefix = keygen("json");
  const locks = new Locks(backend.redis, { prefix });
  const ops = new LockOps(backend.redis, { prefix });
  const names = ["{}", "1.50", "123", "null", "true", "-0", "1e5", "a"];
  for (const name of names) await locks.acquire(name, { ttlMs: 20_000 });
  const listed: string[] = [];
  let cursor: string | undefined;
  do {
    const page = await ops.list({ limit: 2, ...(cursor && { cursor }) });
    listed.push(...page.locks.map((lock) => lock.name));
    cursor = page.cursor;
  } while (cursor);
  assert.deepEqual(listed, [...names].sort());
  const reasons = ['{"a":1}', "[1,2]", '"quoted"', "true ", " 7", "null"];
  for (const reason of reasons) {
    await ops.break("{}", { by: "ops", reason });
    await locks.acquire("{}", { ttlMs: 20_000 });
  }
  const audit = await ops.audit({ limit: reasons.length });
  assert.deepEqual(audit.map((entry) => entry.reason), [...reasons].reverse());
  assert.ok(audit.every((entry) => entry.name === "{}"));
});
