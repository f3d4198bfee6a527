// The library against a real Redis Cluster (3 primaries, 3 replicas) through the REST bridge in
// cluster mode, with the unmodified @upstash/redis client, in the cluster key layout (stats on).
import assert from "node:assert/strict";
import { Redis } from "@upstash/redis";
import { LockOps, Locks } from "@edgelock/edgelock";
import { Jobs, recordId, Records } from "@edgelock/edgelock/uses";
import { startBridge } from "../bridge/mod.ts";
import { Redis as IORedis } from "ioredis";
import { slotOf, startRedisCluster } from "../dev/redis_cluster.ts";
import { acquired, keygen, shared } from "./_backend.ts";
import { bucketOf, KeySpace } from "../src/core/_keys.ts";
import { Miniflare } from "miniflare";
import { bundleWorker } from "./_process.ts";

const fixture = shared(async () => {
  const cluster = await startRedisCluster();
  const token = crypto.randomUUID();
  const bridge = await startBridge({ redisUrl: "", clusterUrls: cluster.urls, token, port: 0 })
    .catch(async (error) => {
      await cluster.stop();
      throw error;
    });
  const redis = new Redis({ url: bridge.url, token, enableTelemetry: false, retry: false });
  const locks = new Locks(redis, { cluster: true });
  return { cluster, token, bridge, redis, locks };
}, async ({ cluster, bridge }) => {
  await bridge.close();
  await cluster.stop();
});

Deno.test("exclusive leases on names spread over every primary", async () => {
  const { cluster, locks } = await fixture();
  const names = Array.from({ length: 12 }, () => keygen("c"));
  const leases = await Promise.all(
    names.map(async (name) => acquired(await locks.acquire(name))),
  );
  for (const name of names) assert.equal((await locks.acquire(name)).acquired, false);
  const sizes = await Promise.all(
    cluster.nodes.slice(0, 3).map(async (node) => {
      const out = await new Deno.Command("redis-cli", {
        args: ["-p", String(node.port), "dbsize"],
      })
        .output();
      return Number(new TextDecoder().decode(out.stdout));
    }),
  );
  assert.ok(sizes.filter((n) => n > 0).length >= 2, `keys per primary: ${sizes}`);
  // One pipeline of scripts whose keys live in different slots and nodes.
  const renewed = await locks.renewMany(leases);
  assert.ok(renewed.every((r) => r.renewed));
  for (const lease of leases) assert.equal(await locks.release(lease), true);
  const again = acquired(await locks.acquire(names[0]!));
  assert.ok(again.fence > leases[0]!.fence);
  await locks.release(again);
});

Deno.test("a waiter is granted the lock in turn", async () => {
  const { locks } = await fixture();
  const name = keygen("c");
  const holder = acquired(await locks.acquire(name, { ttlMs: 5000 }));
  const waiter = locks.acquire(name, { waitMs: 5000 });
  await new Promise((resolve) => setTimeout(resolve, 100));
  await locks.release(holder);
  const next = acquired(await waiter);
  assert.ok(next.fence > holder.fence);
  await locks.release(next);
});

Deno.test("readers, a writer and a semaphore", async () => {
  const { locks } = await fixture();
  const name = keygen("c");
  const readers = await Promise.all(
    [1, 2].map(async () => acquired(await locks.acquire(name, { mode: "shared" }))),
  );
  assert.equal((await locks.acquire(name)).acquired, false);
  for (const reader of readers) await locks.release(reader);
  const writer = acquired(await locks.acquire(name));
  assert.ok(readers.every((r) => r.fence < writer.fence));
  await locks.release(writer);
  const sem = keygen("c");
  const two = acquired(await locks.acquire(sem, { limit: 2, permits: 2 }));
  assert.equal((await locks.acquire(sem, { limit: 2 })).acquired, false);
  await locks.release(two);
});

Deno.test("a multi-name lock over names of one {group}: one slot", async () => {
  const { locks } = await fixture();
  const tag = `{${keygen("g")}}`;
  const got = await locks.acquireAll([`${tag}a`, `${tag}b`, `${tag}c`]);
  assert.ok(got.acquired);
  assert.equal((await locks.acquire(`${tag}b`)).acquired, false);
  for (const lease of got.leases) await locks.release(lease);
});

Deno.test("records and cron jobs", async () => {
  const { redis } = await fixture();
  const records = new Records(redis, { cluster: true });
  const id = recordId("user-1", keygen("k"));
  const claim = await records.claim("idempotency", id, { fingerprint: "f" });
  assert.equal(claim.state, "claimed");
  if (claim.state === "claimed") {
    assert.equal(await records.complete("idempotency", id, claim.token, { status: 201 }), true);
  }
  assert.equal(
    (await records.claim("idempotency", id, { fingerprint: "f" })).state,
    "completed",
  );
  const jobs = new Jobs(redis, { cluster: true });
  const job = keygen("job");
  const run = await jobs.start(job, { atMostMs: 2000, tick: 1 });
  assert.ok(run.run);
  assert.equal((await jobs.start(job, { atMostMs: 2000, tick: 1 })).run, false);
});

Deno.test("a primary stopped mid-run: its replica takes over, the lease and fences survive", async () => {
  const { cluster, locks } = await fixture();
  // A name whose slot the first primary serves.
  const admin = new IORedis(cluster.urls[0]!);
  const slots = await admin.call("CLUSTER", "SLOTS") as [number, number, [string, number]][];
  admin.disconnect();
  const owner = cluster.nodes[0]!.port;
  const served = slots.filter(([, , [, port]]) => port === owner);
  const mine = (name: string) => {
    const slot = slotOf(`${new KeySpace("edgelock", true, true).base(name)}:lock:{${name}}`);
    return served.some(([lo, hi]) => slot >= lo && slot <= hi);
  };
  let name = keygen("f");
  while (!mine(name)) name = keygen("f");
  const lease = acquired(await locks.acquire(name, { ttlMs: 30_000 }));
  await cluster.nodes[0]!.stop({ remove: false });
  const stoppedAt = performance.now();
  let failed = 0;
  for (;;) {
    try {
      await locks.inspect(name);
      break;
    } catch {
      failed++;
      assert.ok(performance.now() - stoppedAt < 20_000, "the cluster recovers within 20 s");
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  }
  const recoveredMs = Math.round(performance.now() - stoppedAt);
  console.log(
    `failover: the name answered again after ${recoveredMs} ms (${failed} failed calls)`,
  );
  // Replication is asynchronous, but the grant went out well before the stop: it was kept.
  const info = await locks.inspect(name);
  assert.ok(info.held && info.fence === lease.fence, JSON.stringify(info));
  assert.equal(
    (await locks.acquire(name)).acquired,
    false,
    "no second holder after failover",
  );
  const renewed = await locks.renew(lease);
  assert.ok(renewed.renewed, "its holder renews on the new primary");
  assert.equal(await locks.release(lease), true);
  const next = acquired(await locks.acquire(name));
  assert.ok(next.fence > lease.fence, "fences keep increasing");
  await locks.release(next);
});

Deno.test("stats, lists and the audit add up over the 64 buckets", async () => {
  const { redis } = await fixture();
  const options = { prefix: "ops", cluster: true };
  const locks = new Locks(redis, options);
  const ops = new LockOps(redis, options);
  const names = Array.from({ length: 80 }, (_, i) => `job:${String(i).padStart(2, "0")}`);
  assert.ok(new Set(names.map(bucketOf)).size > 30, "the names spread over the buckets");
  // The scripts loaded on every primary first (the tests before do it too): 80 first calls side by
  // side all fall back to EVAL, auto-pipelined into one request over the bridge's body limit.
  const warm = new Locks(redis, { prefix: "warm", cluster: true });
  for (const name of names) await warm.release(acquired(await warm.acquire(name)));
  const leases = await Promise.all(
    names.map(async (name) => acquired(await locks.acquire(name))),
  );
  const listed: string[] = [];
  let cursor: string | undefined;
  do {
    const page = await ops.list({ limit: 7, ...(cursor && { cursor }) });
    assert.ok(page.locks.length <= 7);
    listed.push(...page.locks.map((lock) => lock.name));
    cursor = page.cursor;
  } while (cursor);
  assert.deepEqual(listed, names, "every held name once, in order, page by page");
  const tens = (await ops.list({ prefix: "job:1" })).locks.map((lock) => lock.name);
  assert.deepEqual(tens, names.slice(10, 20));
  let stats = await ops.stats();
  assert.equal(stats.locks_held, 80);
  assert.equal(stats.total.acquire.granted, 80);
  assert.equal(stats.last_hour.acquire.granted, 80);
  for (const name of ["job:03", "job:41", "job:77"]) {
    assert.deepEqual(await ops.break(name, { by: "ops" }), {
      broken: true,
      fence: leases[names.indexOf(name)]!.fence,
    });
  }
  assert.deepEqual((await ops.audit()).map((entry) => entry.name), [
    "job:77",
    "job:41",
    "job:03",
  ]);
  assert.deepEqual((await ops.audit({ limit: 2 })).map((entry) => entry.name), [
    "job:77",
    "job:41",
  ]);
  const released = await Promise.all(leases.map((lease) => locks.release(lease)));
  assert.equal(released.filter(Boolean).length, 77);
  const records = new Records(redis, options);
  const claim = await records.claim("idempotency", recordId("user-1", "k1"));
  assert.equal(claim.state, "claimed");
  await records.noteSignatureFailure();
  assert.ok((await new Jobs(redis, options).start("nightly", { atMostMs: 2000 })).run);
  stats = await ops.stats();
  assert.equal(stats.locks_held, 0);
  assert.equal(stats.total.release.released, 77);
  assert.equal(stats.total.release.lost, 3);
  assert.equal(stats.total.break.broken, 3);
  assert.equal(stats.total.idempotency.first, 1);
  assert.equal(stats.total.dedupe.signature_failed, 1);
  assert.equal(stats.total.cron.run, 1);
  assert.equal(stats.total.hold.count, 77);
  assert.deepEqual((await ops.list()).locks, []);
});

Deno.test("the bundled Worker in workerd, LOCK_KEY_LAYOUT=cluster: locks, stats and lists", async () => {
  const { token, bridge } = await fixture();
  const secret = "cluster-worker-secret-0123";
  const bundled = await bundleWorker();
  const script = await Deno.readTextFile(bundled);
  await Deno.remove(bundled.replace(/\/worker\.js$/, ""), { recursive: true });
  const mf = new Miniflare({
    modules: true,
    script,
    compatibilityDate: "2026-08-01",
    bindings: {
      UPSTASH_REDIS_REST_URL: bridge.url,
      UPSTASH_REDIS_REST_TOKEN: token,
      LOCK_API_KEYS: `w:${secret}`,
      LOCK_KEY_LAYOUT: "cluster",
    },
  });
  const call = async (path: string, body?: unknown) => {
    const res = await mf.dispatchFetch(`http://edgelock.test${path}`, {
      method: body === undefined ? "GET" : "POST",
      headers: { authorization: `Bearer ${secret}`, "content-type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    return { status: res.status, body: await res.json() as Record<string, unknown> };
  };
  try {
    const names = ["a", "b", "c", "d"].map((n) => `w-${n}`);
    const held = await Promise.all(names.map((n) => call(`/v1/locks/${n}/acquire`, {})));
    assert.deepEqual(held.map((r) => r.status), [200, 200, 200, 200]);
    const group = await call("/v1/locks/acquire", { names: ["{g}x", "{g}y"] });
    assert.equal(group.status, 200, JSON.stringify(group.body));
    const listed = await call("/v1/locks?limit=2");
    assert.equal(listed.status, 200);
    const stats = await call("/v1/stats");
    assert.equal(stats.status, 200);
    assert.equal(stats.body.locks_held, 6);
    assert.equal((stats.body.total as { acquire: { granted: number } }).acquire.granted, 5);
    const released = await call(`/v1/locks/w-a/release`, { token: held[0]!.body.token });
    assert.deepEqual(released.body, { released: true });
  } finally {
    await mf.dispose();
  }
});

Deno.test("the single layout runs with stats off, and with them on is a config_error saying what to change", async () => {
  const { redis } = await fixture();
  const single = new Locks(redis, { prefix: "single", stats: false });
  const lease = acquired(await single.acquire(keygen("c")));
  assert.equal(await single.release(lease), true);
  // Every valid name, braces anywhere but first, works in both layouts; one starting with }
  // (an empty hash tag) is refused everywhere.
  const cluster = new Locks(redis, { prefix: "both", cluster: true });
  for (const name of ["a}", "a}b", "{", "{}", "{}x", "x{y}z", "{{a}}", "a{b"]) {
    for (const locks of [single, cluster]) {
      const held = acquired(await locks.acquire(name, { mode: "shared" }));
      assert.equal(await locks.release(held), true, name);
    }
  }
  for (const name of ["}", "}x", "}}"]) {
    for (const locks of [single, cluster]) {
      await assert.rejects(locks.acquire(name), RangeError, name);
    }
  }
  const withStats = new Locks(redis, { prefix: "single" });
  await assert.rejects(withStats.acquire(keygen("c")), (error: unknown) => {
    const { code, message } = error as { code?: string; message: string };
    return code === "config_error" && /pass \{ cluster: true \}/.test(message) &&
      !message.includes("single:");
  });
});
