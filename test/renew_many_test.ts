import assert from "node:assert/strict";
import { createApp } from "@edgelock/edgelock/service";
import { createClient } from "@edgelock/edgelock/client";
import { type Lease, Locks } from "@edgelock/edgelock";
import { keygen, shared, startBackend } from "./_backend.ts";

const fixture = shared(async () => {
  const backend = await startBackend();
  const locks = new Locks(backend.redis);
  const held = async (n: number) => {
    const leases: Lease[] = [];
    for (let i = 0; i < n; i++) {
      const r = await locks.acquire(keygen("b"), { ttlMs: 1000 });
      assert.ok(r.acquired);
      leases.push(r.lease);
    }
    return leases;
  };
  return { backend, locks, held };
}, ({ backend }) => backend.stop());

Deno.test("renewMany() renews every held lease in one request and reports the lost ones", async () => {
  const { backend, locks, held } = await fixture();
  const leases = await held(50);
  const lost = { ...leases[7]!, token: "not-the-holder-00000001" };
  const batch = [...leases, lost];
  await locks.renewMany([leases[0]!]); // loads the script: EVALSHA, NOSCRIPT, EVAL
  const before = backend.requests();
  const results = await locks.renewMany(batch, { ttlMs: 20_000 });
  assert.equal(backend.requests() - before, 1, "one REST request for 51 leases");
  assert.equal(results.length, 51);
  results.slice(0, 50).forEach((r, i) => {
    assert.ok(r.renewed);
    assert.equal(r.lease.fence, leases[i]!.fence);
    assert.equal(r.lease.name, leases[i]!.name);
    assert.equal(r.lease.expiresAt, r.lease.serverTime + 20_000);
  });
  assert.deepEqual(results[50], { renewed: false });
  const pttl = await backend.redis.pttl(`edgelock:lock:{${leases[3]!.name}}`);
  assert.ok(pttl > 19_000, `pttl ${pttl}`);
});

Deno.test("renewMany() takes 1 to 1000 leases", async () => {
  const { locks } = await fixture();
  await assert.rejects(locks.renewMany([]), RangeError);
  const fake = { name: "x", token: "t".repeat(16) };
  await assert.rejects(locks.renewMany(Array(1001).fill(fake)), RangeError);
  await assert.rejects(locks.renewMany([{ name: "a b", token: "t".repeat(16) }]), RangeError);
});

Deno.test("POST /v1/locks/renew and the typed client renew in one request", async () => {
  const { backend } = await fixture();
  const secret = "batch-secret-0123456789";
  const app = createApp({
    redis: backend.redis,
    apiKeys: [{ tenant: "t", secret }],
    log: () => {},
  });
  const client = createClient({
    baseUrl: "http://edgelock.test",
    apiKey: secret,
    fetch: ((input: string | URL | Request, init?: RequestInit) =>
      app.request(String(input), init)) as typeof fetch,
  });
  const leases: Lease[] = [];
  for (let i = 0; i < 5; i++) {
    const r = await client.acquire(keygen("b"), { ttlMs: 1000 });
    assert.ok(r.acquired);
    leases.push(r.lease);
  }
  await client.release(leases[2]!);
  // The batch script loaded first, also when this test runs alone: the count is of a warm call.
  const warm = await client.acquire(keygen("b"), { ttlMs: 1000 });
  assert.ok(warm.acquired);
  await client.renewMany([warm.lease]);
  await client.release(warm.lease);
  const before = backend.requests();
  const results = await client.renewMany(leases, { ttlMs: 5000 });
  assert.equal(backend.requests() - before, 1);
  assert.deepEqual(results.map((r) => r.renewed), [true, true, false, true, true]);
  assert.ok(results[0]!.renewed && results[0]!.lease.fence === leases[0]!.fence);
  const bad = await app.request("/v1/locks/renew", {
    method: "POST",
    headers: { authorization: `Bearer ${secret}`, "content-type": "application/json" },
    body: JSON.stringify({ leases: [] }),
  });
  assert.equal(bad.status, 400);
  await bad.body?.cancel();
});
