// Every operation of the library once, for the tests that sweep all the scripts.
import assert from "node:assert/strict";
import type { Redis } from "@upstash/redis";
import { Locks } from "../src/core/locks.ts";
import { LockOps } from "../src/core/ops.ts";
import type { Lease } from "../src/core/types.ts";
import { Jobs } from "../src/uses/jobs.ts";
import { recordId, Records } from "../src/uses/records.ts";
import { KeySpace } from "../src/core/_keys.ts";
import { type Backend, keygen } from "./_backend.ts";

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * Drives every operation of the library once, including the paths that repair bad state, in the
 * single key layout or the cluster one; through `redis` (the backend's client by default).
 */
export async function everyOperation(
  backend: Backend,
  cluster = false,
  { keyLocking, redis = backend.redis }: { keyLocking?: boolean; redis?: Redis } = {},
) {
  const locks = new Locks(redis, { cluster, keyLocking });
  const ops = new LockOps(redis, { cluster, keyLocking });
  const records = new Records(redis, { cluster, keyLocking });
  const jobs = new Jobs(redis, { cluster, keyLocking });
  const space = new KeySpace("edgelock", true, cluster);
  const recordKey = (name: string) => `${space.base(name)}:lock:{${name}}`;
  const name = keygen();
  const held = await locks.acquire(name, { ttlMs: 2000, meta: { by: "a" } });
  assert.ok(held.acquired);
  await locks.acquire(name, { ttlMs: 2000, token: held.lease.token }); // a retry
  await locks.acquire(name); // busy
  await locks.acquire(name, { waitMs: 120 }); // queues, then leaves the queue
  await locks.renew(held.lease);
  await locks.renewMany([held.lease, { name: keygen(), token: "other-token-0000000001" }]);
  await locks.inspect(name);
  await redis.persist(recordKey(name)); // a lock without a TTL
  await locks.acquire(name);
  await locks.inspect(name);
  await locks.release(held.lease);
  await locks.release(held.lease); // a retry
  await redis.del(recordKey(name)); // the released record was evicted
  const again = await locks.acquire(name);
  assert.ok(again.acquired);
  await locks.renew(again.lease);
  await locks.release(again.lease);
  await redis.set(recordKey(name), "not a lock record"); // a value this code did not write
  await locks.acquire(name);
  await locks.inspect(name);
  await locks.release(again.lease);
  await redis.del(recordKey(name));

  // Shared, semaphore, reentrant and multi-name leases, and their mismatches.
  const readers = await Promise.all([1, 2].map(() => locks.acquire(name, { mode: "shared" })));
  await locks.acquire(name, {
    mode: "shared",
    token: (readers[0] as { lease: Lease }).lease.token,
  });
  const writer = locks.acquire(name, { waitMs: 1000 }); // queues behind the readers
  await sleep(50);
  await locks.acquire(name, { mode: "shared" }); // busy behind the writer
  await locks.acquire(name, { limit: 2 }).catch(() => {}); // mode_mismatch
  await locks.inspect(name);
  for (const reader of readers) if (reader.acquired) await locks.renew(reader.lease);
  for (const reader of readers) if (reader.acquired) await locks.release(reader.lease);
  if (readers[0]!.acquired) await locks.release(readers[0]!.lease); // a retry
  const wrote = await writer;
  assert.ok(wrote.acquired);
  await locks.release(wrote.lease);
  const permits = await locks.acquire(name, { limit: 3, permits: 2, reentrant: true });
  await locks.acquire(name, { limit: 4 }).catch(() => {}); // limit_mismatch
  await locks.acquire(name, { limit: 3, permits: 2, waitMs: 120 }); // queues, leaves
  if (permits.acquired) {
    const inner = await locks.acquire(name, {
      limit: 3,
      permits: 2,
      reentrant: true,
      token: permits.lease.token,
    });
    await locks.release(permits.lease);
    if (inner.acquired) await locks.release(inner.lease);
  }
  await ops.break(name, { by: "ops" });
  const twice = await locks.acquire(name, { reentrant: true });
  if (twice.acquired) {
    const inner = await locks.acquire(name, { reentrant: true, token: twice.lease.token });
    await locks.release(twice.lease);
    await locks.release(twice.lease); // a retry: no hold more
    if (inner.acquired) await locks.release(inner.lease);
  }
  const group = [`{${name}}a`, `{${name}}b`];
  const both = await locks.acquireAll(group, { ttlMs: 2000 });
  await locks.acquireAll(group, { waitMs: 120 }); // queues in both, then leaves both
  // Blocks in both queues; the first release hands over in a second step (no hint), which finds
  // the other name held; the second one hands it both.
  const handed = locks.acquireAll(group, { waitMs: 2000 });
  await sleep(50);
  if (both.acquired) { for (const lease of both.leases) await locks.release(lease); }
  const all = await handed;
  assert.ok(all.acquired);
  // A writer, then a multi-name waiter, wait behind the holder of both. The writer is handed its
  // name, and its grant names the multi-name waiter, so its release hands that one both names
  // in the same request (a second script after the release).
  const behind = locks.acquire(group[0]!, { waitMs: 2000 });
  await sleep(50);
  const last = locks.acquireAll(group, { waitMs: 2000 });
  await sleep(50);
  for (const lease of all.leases) await locks.release(lease);
  const one = await behind;
  assert.ok(one.acquired);
  await locks.release(one.lease);
  const got = await last;
  assert.ok(got.acquired);
  if (got.acquired) { for (const lease of got.leases) await locks.release(lease); }

  const id = recordId("user-1", keygen("k"));
  const claim = await records.claim("idempotency", id, { fingerprint: "f1" });
  assert.equal(claim.state, "claimed");
  await records.claim("idempotency", id); // in progress
  await records.claim("idempotency", id, { fingerprint: "f2" }); // mismatch
  await records.renew("idempotency", id, claim.token);
  await records.get("idempotency", id);
  await records.complete("idempotency", id, claim.token, { status: 201 });
  await records.claim("idempotency", id); // replay
  await records.get("idempotency", id);
  const other = recordId("user-1", keygen("k"));
  const second = await records.claim("dedupe", other);
  assert.equal(second.state, "claimed");
  await records.release("dedupe", other, second.token);

  const job = keygen("job");
  const start = await jobs.start(job, { atMostMs: 2000, atLeastMs: 500, tick: 1 });
  assert.ok(start.run);
  await jobs.start(job, { atMostMs: 2000, tick: 1 }); // tick done
  await jobs.start(job, { atMostMs: 2000 }); // running
  await jobs.extend(job, start.token, 2000);
  await jobs.finish(job, start.token);
  await jobs.start(job, { atMostMs: 2000 }); // too soon
  await locks.withLock(keygen(), { ttlMs: 1000 }, () => "ran");
  const broken = await locks.acquire(name, { ttlMs: 2000 });
  assert.ok(broken.acquired);
  await ops.list({ limit: 10 });
  await ops.break(name, { by: "ops" });
  await ops.audit();
  await ops.stats();
}
