import assert from "node:assert/strict";
import { EdgelockError, type Lease, LockManager, LockOps, Locks } from "@edgelock/edgelock";
import { Redis } from "@upstash/redis";
import { freePort } from "../dev/redis_server.ts";
import { base64url, FENCE_GRACE_MS } from "../src/core/_validate.ts";
import { redacted } from "../src/core/_failure.ts";
import { closedOrNotHttp } from "../src/core/_runner.ts";
import { RELEASE_MEMORY_MS, RELEASED_MARKS, TRIM_EVERY } from "../src/core/lua/lib.ts";
import { acquired, holderOf, keygen, shared, startBackend, until } from "./_backend.ts";
import { createApp } from "../src/service/mod.ts";

const lockKey = (name: string) => `edgelock:lock:{${name}}`;

// The redis-server's process id, to pause it with SIGSTOP.
async function redisPid(url: string): Promise<number> {
  const { Redis } = await import("ioredis");
  const client = new Redis(url, { retryStrategy: () => null });
  try {
    const info = await client.info("server");
    return Number(/process_id:(\d+)/.exec(info)![1]);
  } finally {
    client.disconnect();
  }
}

const fixture = shared(async () => {
  const backend = await startBackend();
  const { redis } = backend;
  const locks = new Locks(redis);
  const leaseLeft = async (name: string) => {
    const info = await locks.inspect(name);
    return info.held ? info.ttlMs : 0;
  };
  return { backend, redis, locks, leaseLeft };
}, ({ backend }) => backend.stop());

Deno.test("acquire() returns a lease with a fence and server-clock times", async () => {
  const { redis, locks, leaseLeft } = await fixture();
  const name = keygen();
  const before = Date.now();
  const lease = acquired(await locks.acquire(name, { ttlMs: 2000 }));
  assert.equal(lease.name, name);
  assert.match(lease.token, /^[A-Za-z0-9_-]{22}$/);
  assert.ok(Number.isSafeInteger(lease.fence) && lease.fence > 1e15);
  assert.equal(lease.ttlMs, 2000);
  assert.equal(lease.expiresAt, lease.serverTime + 2000);
  assert.ok(Math.abs(lease.serverTime - before) < 5000);
  const left = await leaseLeft(name);
  assert.ok(left > 1800 && left <= 2000, `lease left ${left}`);
  // The record outlives the lease by the fence window, and no longer.
  const pttl = await redis.pttl(lockKey(name));
  assert.ok(pttl > FENCE_GRACE_MS && pttl <= FENCE_GRACE_MS + 2000, `pttl ${pttl}`);
});

Deno.test("exactly one of 20 concurrent acquirers of one name acquires", async () => {
  const { locks } = await fixture();
  const name = keygen();
  const results = await Promise.all(
    Array.from({ length: 20 }, () => locks.acquire(name, { ttlMs: 5000 })),
  );
  const winners = results.filter((r) => r.acquired);
  assert.equal(winners.length, 1);
  for (const r of results) {
    if (!r.acquired) assert.ok(r.retryAfterMs > 0 && r.retryAfterMs <= 5000);
  }
});

Deno.test("acquire() returns busy with retryAfterMs while another token holds it", async () => {
  const { locks } = await fixture();
  const name = keygen();
  acquired(await locks.acquire(name, { ttlMs: 3000 }));
  const busy = await locks.acquire(name, { ttlMs: 3000 });
  assert.equal(busy.acquired, false);
  // When to look again: estimated from recent hold times, never past the holder's TTL.
  assert.ok(!busy.acquired && busy.retryAfterMs > 0 && busy.retryAfterMs <= 3000);
});

Deno.test("expiry frees the name for the next acquirer", async () => {
  const { locks } = await fixture();
  const name = keygen();
  const first = acquired(await locks.acquire(name, { ttlMs: 100 }));
  await until("the lease expired", async () => (await locks.acquire(name)).acquired);
  const info = await locks.inspect(name);
  assert.ok(info.held && info.fence > first.fence);
});

Deno.test("renew and release with a foreign token do nothing", async () => {
  const { redis, locks, leaseLeft } = await fixture();
  const name = keygen();
  const lease = acquired(await locks.acquire(name, { ttlMs: 3000 }));
  const foreign: Lease = { ...lease, token: "someone-else-token-0001" };
  assert.deepEqual(await locks.renew(foreign, { ttlMs: 60000 }), { renewed: false });
  assert.equal(await locks.release(foreign), false);
  const left = await leaseLeft(name);
  assert.ok(left <= 3000, `the foreign renew must not extend the lease (${left} ms left)`);
  assert.equal(await holderOf(redis, name), lease.token);
  assert.equal(await locks.release(lease), true);
  assert.equal(await locks.release(lease), true, "a retried release answers the same");
  const next = acquired(await locks.acquire(name));
  assert.equal(await locks.release(lease), true, "still true: this token's release freed it");
  assert.equal(await holderOf(redis, name), next.token, "and it frees nothing else");
});

Deno.test("acquire() retried with the holder's token keeps the fence and refreshes the TTL", async () => {
  const { locks, leaseLeft } = await fixture();
  const name = keygen();
  const token = "my-own-token-000000001";
  const first = acquired(await locks.acquire(name, { token, ttlMs: 1000 }));
  const again = acquired(await locks.acquire(name, { token, ttlMs: 4000 }));
  assert.equal(again.fence, first.fence);
  assert.equal(again.token, token);
  const left = await leaseLeft(name);
  assert.ok(left > 3500, `lease left ${left}`);
});

Deno.test("fences strictly increase across 100 acquisitions with expiries between", async () => {
  const { redis, locks } = await fixture();
  const name = keygen();
  let last = 0;
  for (let i = 0; i < 100; i++) {
    const lease = acquired(await locks.acquire(name, { ttlMs: 100 }));
    assert.ok(lease.fence > last, `fence ${lease.fence} after ${last}`);
    last = lease.fence;
    // Expire the record for real, the lease and its fence floor: the worst case.
    await redis.pexpire(lockKey(name), 1);
    await until("the keys expired", async () => (await redis.exists(lockKey(name))) === 0);
  }
});

Deno.test("a released name leaves a small record for fenceWindowMs and its release mark, then nothing", async () => {
  const { backend, redis } = await fixture();
  const short = new Locks(redis, { fenceWindowMs: 1000 });
  const name = keygen();
  const lease = acquired(await short.acquire(name, { ttlMs: 5000 }));
  assert.equal(await short.release(lease), true);
  const marks = `${lockKey(name)}:released`;
  const { Redis: IORedis } = await import("ioredis");
  const tcp = new IORedis(backend.server.url);
  try {
    // The README's bound: the record about 100 bytes plus the name, the mark (for retried
    // releases) about 100 bytes plus the name and the token.
    const keys = await tcp.keys(`*{${name}}*`);
    assert.deepEqual(keys.sort(), [lockKey(name), marks]);
    const record = Number(await tcp.memory("USAGE", lockKey(name)));
    assert.ok(record <= 100 + name.length + 16, `the record is ${record} bytes`);
    const mark = Number(await tcp.memory("USAGE", marks));
    assert.ok(mark <= 120 + name.length + lease.token.length, `the mark is ${mark} bytes`);
    const markTtl = await tcp.pttl(marks);
    assert.ok(markTtl > 0 && markTtl <= RELEASE_MEMORY_MS, `the mark lives ${markTtl} ms`);
  } finally {
    tcp.disconnect();
  }
  const pttl = await redis.pttl(lockKey(name));
  assert.ok(pttl > 0 && pttl <= 1000, `kept ${pttl} ms`);
  await until("the window passed", async () => (await redis.exists(lockKey(name))) === 0);
  const next = acquired(await short.acquire(name));
  assert.ok(next.fence > lease.fence, "still above the old fence (the clock is ahead)");
  assert.throws(() => new Locks(redis, { fenceWindowMs: 999 }), /fenceWindowMs/);
});

// `count` earlier releases of `name` by other tokens, the oldest first; the marks' key.
async function seedMarks(redis: Redis, name: string, count: number): Promise<string> {
  const marks = `${lockKey(name)}:released`;
  const old = Array.from({ length: count }, (_, i) => ({ score: i + 1, member: `old-token-${i}` }));
  for (let i = 0; i < old.length; i += 500) {
    await redis.zadd(marks, old[i]!, ...old.slice(i + 1, i + 500));
  }
  await redis.pexpire(marks, 60_000);
  return marks;
}

Deno.test("a name keeps its last RELEASED_MARKS releases for retries, trimmed back to them now and then", async () => {
  const { redis, locks } = await fixture();
  const name = keygen();
  const marks = await seedMarks(redis, name, 1500);
  // About one release in TRIM_EVERY trims; the chance that 400 in a row do not is about 10^-11.
  let trimmed = false;
  for (let i = 0; i < 400 && !trimmed; i++) {
    const lease = acquired(await locks.acquire(name));
    assert.equal(await locks.release(lease), true);
    const size = await redis.zcard(marks);
    if (size < 1500 + i + 1) {
      trimmed = true;
      assert.equal(size, RELEASED_MARKS, "back to the last RELEASED_MARKS releases");
      assert.equal(await locks.release(lease), true, "this release's retry still matches");
      assert.equal(await redis.zscore(marks, "old-token-0"), null, "the oldest went first");
    }
  }
  assert.ok(trimmed, `no trim in 400 releases (one in ${TRIM_EVERY} expected)`);
});

Deno.test("no choice of which leases to release keeps a name's marks from their trim", async () => {
  const { redis, locks } = await fixture();
  const name = keygen();
  const marks = await seedMarks(redis, name, 1400);
  // A caller sees each fence before it releases: it lets every lease whose fence divides by
  // TRIM_EVERY run out (helper-47), which kept a trim chosen by the fence from ever running.
  for (let i = 0; i < 400; i++) {
    const lease = acquired(await locks.acquire(name, { mode: "shared", ttlMs: 100 }));
    if (lease.fence % TRIM_EVERY !== 0) assert.equal(await locks.release(lease), true);
  }
  const size = await redis.zcard(marks);
  // over 250 past the bound about once in 10^7 runs
  assert.ok(size <= RELEASED_MARKS + 250, `the marks hold ${size} releases`);
});

Deno.test("a name taken again by another token keeps no release in its record; retries find the marks", async () => {
  const { redis, locks } = await fixture();
  const name = keygen();
  const released = /\|\d+:[0-9a-f]{12}\|/; // a record's `<fence>:<sha>` of its last release
  const first = acquired(await locks.acquire(name));
  assert.equal(await locks.release(first), true);
  const second = acquired(await locks.acquire(name));
  const record = (await redis.get<string>(lockKey(name)))!;
  assert.doesNotMatch(record, released, "as short as a first lease");
  assert.equal(await locks.release(first), true, "a retry of the first release, by its fence");
  assert.equal(await locks.release({ name, token: first.token }), true, "and by its token alone");
  assert.equal(await holderOf(redis, name), second.token, "the second lease stands");
  // Taken again by the token that released it: the record keeps that release too (its mark moves
  // to <token>@<fence> at the grant; earlier builds removed it).
  assert.equal(await locks.release(second), true);
  const third = acquired(await locks.acquire(name, { token: second.token }));
  assert.match((await redis.get<string>(lockKey(name)))!, new RegExp(`\\|${second.fence}:`));
  assert.equal(await locks.release(second), true, "its earlier release, by its fence");
  assert.equal(await holderOf(redis, name), third.token);
  assert.equal(await locks.release(third), true);
});

Deno.test("a lease that runs out unreleased leaves its record, meta included, for fenceWindowMs", async () => {
  const { backend, locks } = await fixture();
  const name = keygen();
  const meta = { note: "x".repeat(1000) }; // about the 1 KiB limit
  acquired(await locks.acquire(name, { ttlMs: 100, meta }));
  await until("the lease ran out", async () => !(await locks.inspect(name)).held);
  const { Redis: IORedis } = await import("ioredis");
  const tcp = new IORedis(backend.server.url);
  try {
    const keys = await tcp.keys(`*{${name}}*`);
    assert.deepEqual(keys, [lockKey(name)], "only the record");
    // The README's bound for a lease that was never released: the record with its meta,
    // about 200 bytes plus the name, the token and the meta's JSON, and up to a quarter
    // more where the allocator rounds a large value up.
    const bytes = Number(await tcp.memory("USAGE", lockKey(name)));
    const bound = 1.25 * (200 + name.length + 22 + JSON.stringify(meta).length);
    assert.ok(bytes <= bound, `the residue is ${bytes} bytes, over ${bound}`);
    const pttl = await tcp.pttl(lockKey(name));
    assert.ok(pttl > 0 && pttl <= FENCE_GRACE_MS, `kept ${pttl} ms`);
  } finally {
    tcp.disconnect();
  }
});

Deno.test("a release retried after its record is gone (a short fenceWindowMs) still answers true", async () => {
  const { redis } = await fixture();
  const prefix = keygen("p");
  const short = new Locks(redis, { fenceWindowMs: 1000, prefix });
  for (const mode of [{}, { mode: "shared" as const }, { limit: 2 }]) {
    const name = keygen();
    const lease = acquired(await short.acquire(name, mode));
    assert.equal(await short.release(lease), true);
    const record = `${prefix}:lock:{${name}}`;
    await until("the record is gone", async () => (await redis.exists(record)) === 0);
    assert.equal(await short.release(lease), true, "the retry, by its mark");
    assert.equal(await short.release({ name, token: lease.token }), true, "without a fence");
  }
  const ops = new LockOps(redis, { prefix });
  assert.equal((await ops.stats()).total.release.lost, 0, "nothing counted lost");
});

Deno.test("fences keep increasing after Redis lost all data (FLUSHALL)", async () => {
  const { redis, locks } = await fixture();
  const name = keygen();
  const before = acquired(await locks.acquire(name, { ttlMs: 5000 }));
  await redis.flushall();
  const after = acquired(await locks.acquire(name, { ttlMs: 5000 }));
  assert.ok(after.fence > before.fence);
});

Deno.test("renew() keeps millisecond precision, also with under 500 ms left", async () => {
  const { locks, leaseLeft } = await fixture();
  const name = keygen();
  const lease = acquired(await locks.acquire(name, { ttlMs: 700 }));
  await until("under 500 ms are left", async () => (await leaseLeft(name)) < 500);
  const renewed = await locks.renew(lease, { ttlMs: 1500 });
  assert.ok(renewed.renewed);
  assert.equal(renewed.lease.fence, lease.fence);
  assert.equal(renewed.lease.ttlMs, 1500);
  assert.equal(renewed.lease.expiresAt, renewed.lease.serverTime + 1500);
  const left = await leaseLeft(name);
  assert.ok(left > 1300 && left <= 1500, `lease left ${left}`);
  // A renewal never shortens a lease, and its reply tells the end the lease keeps.
  const short = await locks.renew(renewed.lease, { ttlMs: 250 });
  assert.ok(short.renewed);
  const shortLeft = await leaseLeft(name);
  assert.ok(shortLeft > 250, `lease left ${shortLeft}`);
  assert.ok(short.lease.expiresAt >= renewed.lease.expiresAt, "the reply says so");
  assert.ok(Math.abs(short.lease.ttlMs - shortLeft) < 50, `told ${short.lease.ttlMs}`);
});

Deno.test("renew() extends only the lease it names: not a later lease of the same token", async () => {
  const { locks, leaseLeft } = await fixture();
  const name = keygen();
  const token = "one-token-for-two-leases";
  const first = acquired(await locks.acquire(name, { token, ttlMs: 2000 }));
  assert.equal(await locks.release(first), true);
  const second = acquired(await locks.acquire(name, { token, ttlMs: 2000 }));
  assert.ok(second.fence > first.fence);
  // A late renewal of the first lease (a watchdog that did not hear of its release, a retry)
  // must not tell its holder that the first lease goes on, nor lengthen the second.
  assert.deepEqual(await locks.renew(first, { ttlMs: 60_000 }), { renewed: false });
  assert.deepEqual(await locks.renewMany([first], { ttlMs: 60_000 }), [{ renewed: false }]);
  assert.ok((await leaseLeft(name)) <= 2000, "the second lease keeps its own end");
  const renewed = await locks.renew(second, { ttlMs: 3000 });
  assert.ok(renewed.renewed && renewed.lease.fence === second.fence);
  // Without a fence a renewal goes by token, as before: the lease that token holds now.
  const { fence: _, ...byToken } = second;
  const loose = await locks.renew(byToken, { ttlMs: 3000 });
  assert.ok(loose.renewed && loose.lease.fence === second.fence);
  assert.equal(await locks.release(second), true);
});

Deno.test("a late copy of a first look, after its call's lease was released, is refused", async () => {
  const { backend, locks } = await fixture();
  // Every acquire script call, kept to be sent again once the call is over.
  const sent: [string, string[], unknown[]][] = [];
  const copying = new Proxy(backend.redis, {
    get(target, property, receiver) {
      const value = Reflect.get(target, property, receiver);
      if (property !== "evalsha") return value;
      return (sha: string, keys: string[], args: unknown[]) => {
        sent.push([sha, keys, args]);
        return target.evalsha(sha, keys, args as string[]);
      };
    },
  });
  const mine = new Locks(copying);
  const cases = [
    () => mine.acquire(keygen(), { ttlMs: 60_000 }),
    () => mine.acquire(keygen(), { ttlMs: 60_000, mode: "shared" }),
    () => mine.acquire(keygen(), { ttlMs: 60_000, limit: 2 }),
    () => mine.acquire(keygen(), { ttlMs: 60_000, reentrant: true }),
  ];
  for (const acquire of cases) {
    sent.length = 0;
    const lease = acquired(await acquire());
    const [sha, keys, args] = sent[0]!;
    assert.equal(await mine.release(lease), true);
    const copy = await backend.redis.evalsha(sha, keys, args as string[]) as number[];
    assert.deepEqual(copy.slice(0, 2), [-1, 6], "refused: the fresh token was released");
    assert.equal((await locks.inspect(lease.name)).held, false, "no lease left behind");
  }
  // Several names: refused while any of them was released.
  sent.length = 0;
  const names = [keygen(), keygen()];
  const all = await mine.acquireAll(names, { ttlMs: 60_000 });
  assert.ok(all.acquired);
  const [sha, keys, args] = sent[0]!;
  assert.equal(await mine.release(all.leases[0]!), true);
  const copy = await backend.redis.evalsha(sha, keys, args as string[]) as number[];
  assert.deepEqual(copy.slice(0, 2), [-1, 6]);
  assert.equal(await mine.release(all.leases[1]!), true);
  for (const name of names) assert.equal((await locks.inspect(name)).held, false);
  // A chosen token is not fresh unless said so; said so, it is refused too (lock_lost).
  const name = keygen();
  const token = "chosen-fresh-token-0001";
  const first = acquired(await locks.acquire(name, { token, freshToken: true }));
  assert.equal(await locks.release(first), true);
  await assert.rejects(locks.acquire(name, { token, freshToken: true }), { code: "lock_lost" });
  const reused = acquired(await locks.acquire(name, { token }));
  assert.equal(await locks.release(reused), true);
  await assert.rejects(locks.acquire(name, { freshToken: "yes" as never }), TypeError);
});

Deno.test("a renewal tells the lease as Redis keeps it: a stale reference's hold or mode does not survive", async () => {
  const { locks } = await fixture();
  const name = keygen();
  const token = "renew-kind-token-0001";
  const reentrant = acquired(await locks.acquire(name, { token, reentrant: true }));
  assert.equal(await locks.release(reentrant), true);
  const plain = acquired(await locks.acquire(name, { token }));
  // A reference kept without its fence, with the earlier lease's hold and a mode it never had.
  const stale = { name, token, hold: reentrant.hold!, mode: "shared" as const };
  assert.deepEqual(await locks.renew(stale), { renewed: false }, "that hold is not held");
  const byToken = await locks.renew({ name, token, mode: "shared" } as never);
  assert.ok(byToken.renewed);
  assert.equal(byToken.lease.fence, plain.fence);
  assert.equal(byToken.lease.mode, undefined, "exclusive, as Redis keeps it");
  assert.equal(byToken.lease.hold, undefined);
  assert.equal(await locks.release(byToken.lease), true);
  assert.equal((await locks.inspect(name)).held, false, "the release freed it");
  // A plain hold released while reentrant holds of its token remain is not renewed either.
  const plainHold = acquired(await locks.acquire(name, { token }));
  const beside = acquired(await locks.acquire(name, { token, reentrant: true }));
  assert.equal(await locks.release(plainHold), true);
  assert.deepEqual(await locks.renew(plainHold), { renewed: false }, "its plain hold is gone");
  const still = await locks.renew(beside);
  assert.ok(still.renewed && still.lease.holdCount === 1);
  assert.equal(await locks.release(still.lease), true);
  assert.equal((await locks.inspect(name)).held, false);
  // Holds counted without ids (a record written before hold ids): the renewal tells the count.
  const counted = acquired(await locks.acquire(name, { token }));
  const { redis } = await fixture();
  const fields = String(await redis.get(lockKey(name))).split("|");
  fields[7] = "2";
  await redis.set(lockKey(name), fields.join("|"), { keepTtl: true });
  const told = await locks.renew(counted);
  assert.ok(told.renewed && told.lease.holdCount === 2, JSON.stringify(told));
  assert.equal(await locks.release(counted), true);
  assert.equal(await locks.release(counted), true);
  assert.equal((await locks.inspect(name)).held, false, "two holds, two releases");
  // A reentrant hold released already is not renewed; the other hold is.
  const one = acquired(await locks.acquire(name, { token, reentrant: true, hold: "hold-one-01" }));
  const two = acquired(await locks.acquire(name, { token, reentrant: true, hold: "hold-two-02" }));
  assert.equal(await locks.release(two), true);
  assert.deepEqual(await locks.renew(two), { renewed: false });
  const kept = await locks.renew(one);
  assert.ok(kept.renewed && kept.lease.hold === "hold-one-01" && kept.lease.holdCount === 1);
  assert.equal(await locks.release(kept.lease), true);
  assert.equal((await locks.inspect(name)).held, false);
});

Deno.test("inspect() shows fence, TTL and meta but never the token", async () => {
  const { backend, locks } = await fixture();
  const name = keygen();
  assert.deepEqual(await locks.inspect(name), { name, held: false });
  const lease = acquired(await locks.acquire(name, { ttlMs: 3000, meta: { owner: "cron-7" } }));
  const info = await locks.inspect(name);
  assert.ok(info.held);
  assert.equal(info.fence, lease.fence);
  assert.ok(info.ttlMs > 2500 && info.ttlMs <= 3000);
  assert.deepEqual(info.meta, { owner: "cron-7" });
  assert.ok(!JSON.stringify(info).includes(lease.token));
  const raw = await new Locks(backend.client({ automaticDeserialization: false })).inspect(
    name,
  );
  assert.ok(raw.held);
  assert.deepEqual(raw.meta, { owner: "cron-7" }, "meta is the same without deserialization");
  assert.equal(raw.fence, lease.fence);
});

Deno.test("acquire() with waitMs gets the lock once the holder releases it", async () => {
  const { locks } = await fixture();
  const name = keygen();
  const holder = acquired(await locks.acquire(name, { ttlMs: 5000 }));
  const waiting = locks.acquire(name, { ttlMs: 5000, waitMs: 3000 });
  setTimeout(() => locks.release(holder), 200);
  const lease = acquired(await waiting);
  assert.ok(lease.fence > holder.fence);
});

Deno.test("acquire() with waitMs gives up busy after waiting, and stops on abort", async () => {
  const { backend, locks } = await fixture();
  const name = keygen();
  acquired(await locks.acquire(name, { ttlMs: 5000 }));
  const before = backend.requests();
  const started = performance.now();
  const busy = await locks.acquire(name, { waitMs: 300 });
  assert.equal(busy.acquired, false);
  assert.ok(performance.now() - started >= 300);
  // No hold history: the first looks come every 10 ms (half the assumed 20 ms hold), then
  // back off by half the time held so far: 10, 20, 30, 45, 68, 101, 152, 228, 300 ms and
  // the queue exit, about 12 requests. Polling at the 5 ms floor would be over 60.
  const polls = backend.requests() - before;
  assert.ok(polls >= 3 && polls <= 20, `${polls} requests in 300 ms`);
  const controller = new AbortController();
  const aborted = locks.acquire(name, { waitMs: 10000, signal: controller.signal });
  setTimeout(() => controller.abort(new Error("caller gave up")), 50);
  await assert.rejects(aborted, /caller gave up/);
});

Deno.test("every steady-state operation costs exactly one REST request", async () => {
  const { backend, locks } = await fixture();
  const name = keygen();
  // Every script loaded first, also when this test runs alone: the counts are of warm calls.
  const warm = acquired(await locks.acquire(name));
  await locks.renew(warm);
  await locks.inspect(name);
  await locks.release(warm);
  const count = async (op: () => Promise<unknown>) => {
    const before = backend.requests();
    await op();
    return backend.requests() - before;
  };
  let lease = warm;
  assert.equal(await count(async () => lease = acquired(await locks.acquire(name))), 1);
  assert.equal(await count(() => locks.renew(lease)), 1);
  assert.equal(await count(() => locks.inspect(name)), 1);
  assert.equal(await count(() => locks.release(lease)), 1);
  assert.equal(await count(() => locks.acquire(name)), 1);
  assert.equal(await count(() => locks.acquire(name)), 1, "busy is one request too");
});

Deno.test("operations still work after SCRIPT FLUSH (EVALSHA falls back to EVAL)", async () => {
  const { backend, redis, locks } = await fixture();
  await redis.scriptFlush();
  const name = keygen();
  const before = backend.requests();
  const lease = acquired(await locks.acquire(name));
  assert.equal(backend.requests() - before, 2, "EVALSHA answered NOSCRIPT, then one EVAL");
  await redis.scriptFlush();
  assert.ok((await locks.renew(lease)).renewed);
  await redis.scriptFlush();
  assert.ok((await locks.inspect(name)).held);
  await redis.scriptFlush();
  assert.equal(await locks.release(lease), true);
});

Deno.test("a cold script cache under 100 concurrent auto-pipelined acquires loads the script once", async () => {
  const { backend, redis } = await fixture();
  const locks = new Locks(backend.client({ enableAutoPipelining: true }));
  await redis.scriptFlush();
  // Every call meets NOSCRIPT in one pipeline; 100 copies of the source would be a body over the
  // bridge's 1 MB limit (Upstash's too). One call loads the script, the others wait and EVALSHA.
  const results = await Promise.all(
    Array.from({ length: 100 }, () => locks.acquire(keygen("cold"), { ttlMs: 5000 })),
  );
  const leases = results.map(acquired);
  assert.equal(leases.length, 100);
  await redis.scriptFlush();
  const renewed = await locks.renewMany(leases);
  assert.ok(renewed.every((result) => result.renewed), "a cold batch of 100 renews too");
  for (const lease of leases) await locks.release(lease);
});

Deno.test("release() of a lease that was lost answers false, even after the same token released an earlier lease", async () => {
  const { redis, locks } = await fixture();
  const name = keygen();
  const token = "chosen-token-00000000001"; // the README's choose-your-token retry pattern
  const first = acquired(await locks.acquire(name, { token, ttlMs: 1000 }));
  assert.equal(await locks.release(first), true);
  const second = acquired(await locks.acquire(name, { token, ttlMs: 150 }));
  await until("the second lease expires", async () => !(await locks.inspect(name)).held);
  const other = acquired(await locks.acquire(name, { ttlMs: 5000 }));
  assert.equal(await locks.release(second), false, "the second lease was lost");
  assert.equal(await locks.release({ name, token }), false, "also by name and token only");
  assert.equal(
    await locks.release(first),
    true,
    "a retry of the first release still matches",
  );
  assert.equal(await holderOf(redis, name), other.token, "B still holds it");
  const sameToken = acquired(await locks.acquire(name, { token: other.token }));
  assert.equal(await locks.release(first), true);
  assert.equal(await locks.release(sameToken), true);
});

Deno.test("a release retried by its fence answers true after the token's next lease was lost and another's released", async () => {
  const { redis, locks } = await fixture();
  const name = keygen();
  const token = "chosen-token-00000000003";
  const first = acquired(await locks.acquire(name, { token, ttlMs: 1000 }));
  assert.equal(await locks.release(first), true);
  const second = acquired(await locks.acquire(name, { token, ttlMs: 150 }));
  await until("the second lease expires", async () => !(await locks.inspect(name)).held);
  const other = acquired(await locks.acquire(name, { ttlMs: 5000 }));
  assert.equal(await locks.release(other), true); // the record now remembers this release only
  assert.equal(await locks.release(first), true, "the first release did happen");
  assert.equal(await locks.release(second), false, "the second lease was lost");
  assert.equal(await locks.release({ name, token }), false, "the token's latest lease was lost");
  assert.equal(await locks.release(other), true, "and the other release is still a release");
  assert.equal((await locks.inspect(name)).held, false);
  void redis;
});

Deno.test("a token's every release answers its retry by fence, after its later leases were released or broken", async () => {
  const { redis, locks } = await fixture();
  const ops = new LockOps(redis);
  const name = keygen();
  const token = "chosen-token-00000000004";
  const first = acquired(await locks.acquire(name, { token }));
  assert.equal(await locks.release(first), true);
  const second = acquired(await locks.acquire(name, { token }));
  assert.equal(await locks.release(second), true);
  const third = acquired(await locks.acquire(name, { token }));
  assert.equal((await ops.break(name, { by: "test" })).broken, true);
  assert.equal(await locks.release(first), true, "the first release");
  assert.equal(await locks.release(second), true, "the second release");
  assert.equal(await locks.release(third), false, "the third lease was broken");
  assert.equal(await locks.release({ name, token }), false, "so was the token's latest");
});

Deno.test("a late retry of an earlier release never frees the same token's newer lease", async () => {
  const { locks } = await fixture();
  const name = keygen();
  const token = "chosen-token-00000000002";
  const first = acquired(await locks.acquire(name, { token }));
  assert.equal(await locks.release(first), true);
  const second = acquired(await locks.acquire(name, { token }));
  assert.equal(await locks.release(first), true, "the first release did happen");
  assert.ok((await locks.inspect(name)).held, "and the second lease is still held");
  assert.equal(await locks.release(second), true);
});

Deno.test("the names . and .. are refused, as URLs cannot carry them", async () => {
  const { locks } = await fixture();
  for (const name of [".", ".."]) {
    await assert.rejects(locks.acquire(name), {
      name: "RangeError",
      message: /not \. or \.\./,
    });
    await assert.rejects(locks.inspect(name), RangeError);
  }
  for (const name of ["...", ".a", "a..", "..b"]) {
    const lease = acquired(await locks.acquire(name));
    assert.equal(await locks.release(lease), true);
  }
});

Deno.test("a paused Redis fails each call with backend_unavailable after timeoutMs, then recovers", async () => {
  const { backend, redis } = await fixture();
  const quick = new Locks(redis, { timeoutMs: 300 });
  const name = keygen();
  const pid = await redisPid(backend.server.url);
  Deno.kill(pid, "SIGSTOP");
  try {
    const started = performance.now();
    await assert.rejects(quick.acquire(name), (error: unknown) => {
      assert.ok(error instanceof EdgelockError && error.code === "backend_unavailable");
      assert.match(error.message, /did not answer the acquire script in 300 ms/);
      return true;
    });
    const elapsed = performance.now() - started;
    assert.ok(elapsed < 1500, `gave up after ${Math.round(elapsed)} ms`);
  } finally {
    Deno.kill(pid, "SIGCONT");
  }
  assert.ok((await quick.acquire(keygen())).acquired, "works again once Redis resumes");
  assert.throws(() => new Locks(redis, { timeoutMs: 0 }), /timeoutMs must be an integer/);
});

Deno.test("invalid arguments are rejected with precise messages", async () => {
  const { redis, locks } = await fixture();
  const name = keygen();
  // meta is stored as JSON: what does not serialize to an object is refused, not stored as text.
  for (const meta of [new Date(), { toJSON: () => 42 }]) {
    await assert.rejects(locks.acquire(name, { meta: meta as never }), {
      name: "TypeError",
      message: "meta must be a plain JSON object",
    });
  }
  // What JSON cannot hold is named, not left to the engine's words.
  const cycle: Record<string, unknown> = {};
  cycle.self = cycle;
  for (const meta of [cycle, { n: 1n }]) {
    await assert.rejects(locks.acquire(name, { meta }), {
      name: "TypeError",
      message: "meta cannot be sent as JSON (a cycle, a BigInt, or a toJSON that threw)",
    });
  }
  assert.throws(() => new Locks(redis, null as never), {
    name: "TypeError",
    message: "new Locks() takes an options object",
  });
  // withLock's options may be left out in JavaScript, as acquire's may.
  assert.equal(await locks.withLock(keygen(), undefined as never, () => "ran"), "ran");
  // A hole in a batch is a lease that is not one, before any request.
  await assert.rejects(
    locks.renewMany(new Array(2)),
    { name: "TypeError", message: "Expected a lease returned by acquire or renew" },
  );
  await assert.rejects(locks.acquire(""), { name: "RangeError", message: /lock name ""/ });
  await assert.rejects(locks.acquire("a b"), /must be 1–200 characters/);
  await assert.rejects(locks.acquire("x".repeat(201)), RangeError);
  await assert.rejects(locks.acquire(42 as unknown as string), TypeError);
  await assert.rejects(
    locks.acquire(name, { ttlMs: 99 }),
    /ttlMs must be an integer from 100 to 300000/,
  );
  await assert.rejects(locks.acquire(name, { ttlMs: 300001 }), RangeError);
  await assert.rejects(locks.acquire(name, { ttlMs: 1.5 }), RangeError);
  await assert.rejects(locks.acquire(name, { ttlMs: "5" as unknown as number }), TypeError);
  await assert.rejects(locks.acquire(name, { waitMs: -1 }), /waitMs must be/);
  await assert.rejects(locks.acquire(name, { waitMs: 30001 }), RangeError);
  await assert.rejects(locks.acquire(name, { token: "short" }), /token must be 16–128/);
  await assert.rejects(locks.acquire(name, { token: "x".repeat(15) + "!" }), RangeError);
  await assert.rejects(
    locks.acquire(name, { meta: [] as unknown as Record<string, unknown> }),
    TypeError,
  );
  await assert.rejects(
    locks.acquire(name, { meta: { big: "x".repeat(1100) } }),
    /at most 1024 bytes/,
  );
  await assert.rejects(locks.acquire(name, { signal: {} as AbortSignal }), TypeError);
  await assert.rejects(locks.renew(null as unknown as Lease), TypeError);
  assert.throws(() => new Locks({} as never), TypeError);
  assert.throws(() => new Locks(redis, { prefix: "a b" }), RangeError);
  assert.equal(await redis.exists(lockKey(name)), 0, "nothing was written");
});

Deno.test("a refused REST token is config_error naming the variable, with no retry hint", async () => {
  const { backend } = await fixture();
  const broken = new Locks(backend.client({ token: "wrong-token" }));
  await assert.rejects(broken.acquire(keygen()), (error: unknown) => {
    assert.ok(error instanceof EdgelockError);
    assert.equal(error.code, "config_error");
    assert.match(error.message, /refused the REST token .*UPSTASH_REDIS_REST_TOKEN/);
    assert.equal(error.retryAfterMs, undefined);
    return true;
  });
});

Deno.test("an unreachable backend becomes backend_unavailable, not a raw client error", async () => {
  const url = `http://127.0.0.1:${freePort()}`;
  const down = new Locks(new Redis({ url, token: "x", retry: false }), { timeoutMs: 1000 });
  await assert.rejects(down.acquire(keygen()), (error: unknown) => {
    assert.ok(error instanceof EdgelockError);
    assert.equal(error.code, "backend_unavailable");
    assert.equal(error.retryAfterMs, 1000);
    return true;
  });
});

Deno.test("an option a call does not take is a TypeError naming it and the likeliest meant", async () => {
  const { redis } = await fixture();
  const cases: [() => unknown, RegExp][] = [
    [
      () => new Locks(redis, { prefx: "a" } as never),
      /new Locks\(\) has no option "prefx"; did you mean "prefix"\?/,
    ],
    [
      () => new LockOps(redis, { maxWaiters: 3 } as never),
      /new LockOps\(\) has no option "maxWaiters"/,
    ],
    [() => new Locks(redis, "edgelock" as never), /new Locks\(\) takes an options object/],
  ];
  for (const [call, message] of cases) assert.throws(call, { name: "TypeError", message });
  const locks = new Locks(redis, { maxWaiters: 3 });
  const lease = acquired(await locks.acquire(keygen(), { ttlMs: 5_000 }));
  await assert.rejects(
    locks.acquire(keygen(), { ttl: 5_000 } as never),
    { name: "TypeError", message: 'acquire() has no option "ttl"; did you mean "ttlMs"?' },
  );
  await assert.rejects(
    locks.acquireAll([keygen()], { mode: "shared" } as never),
    { name: "TypeError", message: 'acquireAll() has no option "mode"' },
  );
  await assert.rejects(
    locks.renew(lease, { tllMs: 5_000 } as never),
    { name: "TypeError", message: 'renew() has no option "tllMs"; did you mean "ttlMs"?' },
  );
  assert.equal(await locks.release(lease), true);
});

Deno.test("a misconfigured client's error names the cause, and never a key", async () => {
  const { backend } = await fixture();
  const app = createApp({
    redis: backend.redis,
    apiKeys: [{ tenant: "t", secret: "s".repeat(20) }],
    log: () => {},
  });
  const service = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, app.fetch);
  // A server that closes every connection it accepts, as Redis's own port does an HTTP request's.
  const closer = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const closing = (async () => {
    for await (const connection of closer) connection.close();
  })();
  try {
    const port = await freePort();
    const cases: [string, string, RegExp][] = [
      [
        `http://127.0.0.1:${port}`,
        "backend_unavailable",
        new RegExp(`^Nothing accepts connections at http://127\\.0\\.0\\.1:${port} \\(refused\\)`),
      ],
      [
        "http://127.0.0.1:6666", // the fetch spec's bad ports: no request is ever sent there
        "config_error",
        /127\.0\.0\.1:6666 is on a port fetch refuses to reach/,
      ],
      [
        `http://127.0.0.1:${closer.addr.port}`,
        "backend_unavailable",
        /closed the connection \(.*closed.*\): if this lasts, is it Redis's TCP port\? check UPSTASH_REDIS_REST_URL/,
      ],

      [
        `http://127.0.0.1:${service.addr.port}`,
        "config_error",
        /answers HTTP 405, but not as an Upstash Redis REST endpoint: check UPSTASH_REDIS_REST_URL/,
      ],
      [
        backend.bridge.url.replace("http:", "https:"),
        "config_error",
        /answers plain HTTP, not TLS: use http:\/\//,
      ],
    ];
    for (const [url, code, message] of cases) {
      const locks = new Locks(backend.client({ url }), { timeoutMs: 500 });
      const error = await locks.acquire(keygen()).then(() => undefined, (e) => e);
      assert.ok(error instanceof EdgelockError, `${url}: ${error}`);
      assert.equal(error.code, code, error.message);
      assert.match(error.message, message);
      const printed = Deno.inspect(error);
      assert.doesNotMatch(printed, /edgelock:|evalsha|command was|[0-9a-f]{40}/, printed);
      if (code === "backend_unavailable") assert.match(printed, /ECONNREFUSED|refused|closed/i);
      assert.equal("retryAfterMs" in error, code === "backend_unavailable");
    }
    // A key of the wrong type (something else writes under the prefix) is no outage, and what
    // prints names neither keys nor the SHA-1.
    const name = keygen();
    await backend.redis.lpush(lockKey(name), "x");
    const error = await new Locks(backend.redis).acquire(name).then(() => undefined, (e) => e);
    assert.ok(error instanceof EdgelockError, String(error));
    assert.equal(error.code, "config_error");
    assert.ok(!("retryAfterMs" in error), "no retry hint, not even an undefined one");
    assert.match(error.message, /holds another type of value.*a prefix of its own/);
    const printed = Deno.inspect(error);
    assert.match(printed, /WRONGTYPE/);
    // Redis 6.2 names the script f_<sha1> in the error.
    assert.doesNotMatch(
      (redacted(new Error(`ERR Error running script (call to f_${"ab".repeat(20)}): x`)) as Error)
        .message,
      /[0-9a-f]{40}/,
    );
    // A REST URL with a path: the endpoint takes the path for a command.
    const pathed = new Locks(backend.client({ url: `${backend.bridge.url}/v1` }));
    await assert.rejects(pathed.acquire(keygen()), {
      code: "config_error",
      message: /without a path/,
    });
    assert.doesNotMatch(printed, /edgelock:|evalsha|command was|[0-9a-f]{40}/, printed);
    // The service's log line for it says as little.
    const lines: string[] = [];
    const logged = createApp({
      redis: backend.redis,
      apiKeys: [{ tenant: "t", secret: "s".repeat(20) }],
      log: (entry) => lines.push(JSON.stringify(entry)),
    });
    await backend.redis.lpush(`edgelock:t:lock:{${name}}`, "x");
    const reply = await logged.request(`/v1/locks/${name}/acquire`, {
      method: "POST",
      headers: { authorization: `Bearer ${"s".repeat(20)}` },
    });
    assert.equal(reply.status, 500, await reply.text());
    assert.match(lines.join("\n"), /WRONGTYPE/);
    assert.doesNotMatch(lines.join("\n"), /edgelock:|evalsha|command was|[0-9a-f]{40}/);
    // An @upstash/redis client made from unset variables only warns; Locks refuses it at once.
    const warn = console.warn;
    console.warn = () => {};
    try {
      const unset = new Redis({ url: undefined as never, token: undefined as never });
      assert.throws(() => new Locks(unset), {
        code: "config_error",
        message: /without a URL or token: set UPSTASH_REDIS_REST_URL and UPSTASH_REDIS_REST_TOKEN/,
      });
      assert.throws(() => new LockManager(unset), {
        code: "config_error",
        message: /^LockManager got an @upstash\/redis client without a URL or token/,
      });
      const tokenless = new Redis({ url: backend.bridge.url, token: undefined as never });
      assert.throws(() => new Locks(tokenless), {
        code: "config_error",
        message: /without a token: set UPSTASH_REDIS_REST_URL and UPSTASH_REDIS_REST_TOKEN/,
      });
    } finally {
      console.warn = warn;
    }
  } finally {
    await service.shutdown();
    closer.close();
    await closing;
  }
});

Deno.test("a generated token is its 16 random bytes in base64url, as btoa spells them", () => {
  const cases = [
    new Uint8Array(16),
    new Uint8Array(16).fill(255),
    Uint8Array.from({ length: 16 }, (_, i) => i * 17),
  ];
  for (let i = 0; i < 200; i++) cases.push(crypto.getRandomValues(new Uint8Array(16)));
  for (const bytes of cases) {
    const expected = btoa(String.fromCharCode(...bytes)).replace(/\+/g, "-").replace(/\//g, "_")
      .replace(/=+$/, "");
    assert.equal(base64url(bytes), expected, String(bytes));
  }
});

Deno.test("a break the Redis client sends twice ends one lease, not the one granted in between", async () => {
  const { redis, locks } = await fixture();
  const name = keygen();
  const stuck = acquired(await locks.acquire(name, { ttlMs: 60_000 }));
  let victim: Lease | undefined;
  // As @upstash/redis does when a connection dies after Redis ran the script: the request goes
  // again. Between the two, another caller takes the name the first delivery freed.
  const twice = async (send: () => Promise<unknown>) => {
    const first = await send();
    if (victim !== undefined) return first;
    victim = acquired(await locks.acquire(name, { ttlMs: 60_000 }));
    return await send();
  };
  const client = {
    evalsha: (sha: string, keys: string[], args: unknown[]) =>
      twice(() => redis.evalsha(sha, keys, args)),
    eval: (script: string, keys: string[], args: unknown[]) =>
      twice(() => redis.eval(script, keys, args)),
  };
  const broken = await new LockOps(client).break(name, { by: "ops", reason: "stuck" });
  assert.deepEqual(broken, { broken: true, fence: stuck.fence });
  assert.ok(victim, "the name was taken between the two deliveries");
  const info = await locks.inspect(name);
  assert.ok(info.held && info.fence === victim.fence, `the new lease is still held: ${info.held}`);
  assert.equal(await locks.release(victim), true);
  assert.equal((await new LockOps(redis).audit()).filter((e) => e.name === name).length, 1);
});

Deno.test("a closed connection is an outage, named; an answer that is not HTTP is config_error", () => {
  const url = "http://127.0.0.1:9";
  const closed = new TypeError("error sending request: connection closed before message completed");
  const outage = closedOrNotHttp(closed, url, "check the URL");
  assert.equal(outage.retry, true, "a proxy restarting looks the same as Redis's own port");
  assert.match(
    outage.message,
    /closed the connection \(.*closed.*\): if this lasts, is it Redis's TCP port\? check the URL/,
  );
  const tls = new TypeError("client error (SendRequest): invalid HTTP version parsed");
  const notHttp = closedOrNotHttp(tls, url, "check the URL");
  assert.equal(notHttp.retry, false);
  assert.match(notHttp.message, /answers, but not in HTTP/);
});

Deno.test("a break given the fence it inspected leaves a lease granted since alone", async () => {
  const { redis, locks } = await fixture();
  const ops = new LockOps(redis);
  const name = keygen();
  const stuck = acquired(await locks.acquire(name, { ttlMs: 200 }));
  const seen = await locks.inspect(name);
  assert.ok(seen.held && seen.fence === stuck.fence);
  // The stuck lease runs out before the operator acts, and another caller takes the name.
  let next: Lease | undefined;
  await until("the stuck lease ran out and another took the name", async () => {
    const again = await locks.acquire(name, { ttlMs: 60_000 });
    if (again.acquired) next = again.lease;
    return next !== undefined;
  });
  assert.ok(next);
  assert.deepEqual(await ops.break(name, { by: "ops", fence: seen.fence }), { broken: false });
  assert.ok((await locks.inspect(name)).held, "the new lease is left alone");
  assert.deepEqual(await ops.break(name, { by: "ops", fence: next.fence }), {
    broken: true,
    fence: next.fence,
  });
  await assert.rejects(ops.break(name, { by: "ops", fence: 1.5 }), RangeError);
});

Deno.test("a break by fence of a shared name ends its leases only while a holder of that fence holds", async () => {
  const { redis, locks } = await fixture();
  const ops = new LockOps(redis);
  const name = keygen();
  const a = acquired(await locks.acquire(name, { mode: "shared", ttlMs: 60_000 }));
  const b = acquired(await locks.acquire(name, { mode: "shared", ttlMs: 60_000 }));
  assert.equal(await locks.release(b), true);
  // b is gone: its fence names no holder, though the record still shows it as the latest.
  assert.deepEqual(await ops.break(name, { by: "ops", fence: b.fence }), { broken: false });
  assert.ok((await locks.inspect(name)).held, "a's lease is left alone");
  const broken = await ops.break(name, { by: "ops", fence: a.fence });
  assert.equal(broken.broken, true);
  assert.equal((await locks.inspect(name)).held, false);
  assert.equal(await locks.release(a), false, "a's lease was broken");
});
