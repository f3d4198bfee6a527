// The library against a real Redis Cluster (3 primaries, 3 replicas) through the REST bridge in
// cluster mode, with the unmodified @upstash/redis client. Stats and the held index live in keys
// of their own per prefix, outside a lock's slot, so they are off here (see the README).
import assert from "node:assert/strict";
import { Redis } from "@upstash/redis";
import { Locks } from "@edgelock/edgelock";
import { Jobs, recordId, Records } from "@edgelock/edgelock/uses";
import { startBridge } from "../dev/bridge.ts";
import { Redis as IORedis } from "ioredis";
import { slotOf, startRedisCluster } from "../dev/redis_cluster.ts";
import { acquired, keygen } from "./_backend.ts";

Deno.test("every primitive and use on a Redis Cluster", async (t) => {
  const cluster = await startRedisCluster();
  const token = crypto.randomUUID();
  const bridge = await startBridge({ redisUrl: "", clusterUrls: cluster.urls, token, port: 0 })
    .catch(async (error) => {
      await cluster.stop();
      throw error;
    });
  const redis = new Redis({ url: bridge.url, token, enableTelemetry: false, retry: false });
  const locks = new Locks(redis, { stats: false });

  try {
    await t.step("exclusive leases on names spread over every primary", async () => {
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

    await t.step("a waiter is granted the lock in turn", async () => {
      const name = keygen("c");
      const holder = acquired(await locks.acquire(name, { ttlMs: 5000 }));
      const waiter = locks.acquire(name, { waitMs: 5000 });
      await new Promise((resolve) => setTimeout(resolve, 100));
      await locks.release(holder);
      const next = acquired(await waiter);
      assert.ok(next.fence > holder.fence);
      await locks.release(next);
    });

    await t.step("readers, a writer and a semaphore", async () => {
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

    await t.step("a multi-name lock over names of one {group}: one slot", async () => {
      const tag = `{${keygen("g")}}`;
      const got = await locks.acquireAll([`${tag}a`, `${tag}b`, `${tag}c`]);
      assert.ok(got.acquired);
      assert.equal((await locks.acquire(`${tag}b`)).acquired, false);
      for (const lease of got.leases) await locks.release(lease);
    });

    await t.step("records and cron jobs", async () => {
      const records = new Records(redis, { stats: false });
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
      const jobs = new Jobs(redis, { stats: false });
      const job = keygen("job");
      const run = await jobs.start(job, { atMostMs: 2000, tick: 1 });
      assert.ok(run.run);
      assert.equal((await jobs.start(job, { atMostMs: 2000, tick: 1 })).run, false);
    });
    await t.step(
      "a primary stopped mid-run: its replica takes over, the lease and fences survive",
      async () => {
        // A name whose slot the first primary serves.
        const admin = new IORedis(cluster.urls[0]!);
        const slots = await admin.call("CLUSTER", "SLOTS") as [number, number, [string, number]][];
        admin.disconnect();
        const owner = cluster.nodes[0]!.port;
        const served = slots.filter(([, , [, port]]) => port === owner);
        const mine = (name: string) => {
          const slot = slotOf(`edgelock:lock:{${name}}`);
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
      },
    );

    await t.step(
      "with stats on, a cluster is a config_error that says what to change",
      async () => {
        const withStats = new Locks(redis);
        await assert.rejects(withStats.acquire(keygen("c")), (error: unknown) => {
          const { code, message } = error as { code?: string; message: string };
          return code === "config_error" && /pass \{ stats: false \}/.test(message);
        });
      },
    );
  } finally {
    await bridge.close();
    await cluster.stop();
  }
});
