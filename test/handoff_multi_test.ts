// The hand-off to multi-name waiters: a release that frees a name whose head waits for several
// names hands it all of them at once, when every one is free and it heads every queue.
import assert from "node:assert/strict";
import type { Redis } from "@upstash/redis";
import { type Lease, type LockEvent, Locks } from "@edgelock/edgelock";
import fc from "fast-check";
import { check, type Operation, withBroken } from "../dev/history.ts";
import { acquired, keygen, lockKeys, shared, startBackend, until } from "./_backend.ts";

const fixture = shared(startBackend, (backend) => backend.stop());

// A Locks whose busy looks are counted.
function tracked(redis: Redis, options: ConstructorParameters<typeof Locks>[1] = {}) {
  const events: LockEvent[] = [];
  const locks = new Locks(redis, { ...options, onEvent: (event) => events.push(event) });
  return { locks, looks: () => events.filter((e) => e.type === "wait").length };
}

// Until `count` waiters are in the queue of every one of `names`.
const queued = (redis: Redis, names: readonly string[], count = 1) =>
  until(`${count} waiting on ${names}`, async () => {
    for (const name of names) if (await redis.zcard(lockKeys(name)[1]) < count) return false;
    return true;
  });

const leasesOf = (result: Awaited<ReturnType<Locks["acquireAll"]>>): Lease[] => {
  if (!result.acquired) throw new Error(`expected the names: ${JSON.stringify(result)}`);
  return result.leases;
};

Deno.test("a multi-name waiter is handed every name at the release of the last, with one look", async () => {
  const { redis } = await fixture();
  const { locks, looks } = tracked(redis);
  const names = [keygen("ma"), keygen("mb")];
  const [a, b] = await Promise.all(names.map(async (name) => acquired(await locks.acquire(name))));
  const waiting = locks.acquireAll(names, { ttlMs: 5_000, waitMs: 20_000, meta: { by: "m" } });
  await queued(redis, names);
  assert.equal(await locks.release(a!), true);
  // The first name is free, the second held: nothing is handed over, the first waits for it.
  assert.equal((await locks.inspect(names[0]!)).held, false);
  assert.equal(await redis.zcard(lockKeys(names[0]!)[1]), 1, "still queued on the free name");
  assert.equal(await locks.release(b!), true);
  const leases = leasesOf(await waiting);
  assert.equal(looks(), 1, "one look, then the block that the second release answered");
  for (const [i, lease] of leases.entries()) {
    assert.equal(lease.name, names[i]);
    assert.ok(lease.fence > b!.fence, "a new, higher fence");
    assert.ok(lease.ttlMs <= 5_000 && lease.ttlMs > 4_000, `its own TTL: ${lease.ttlMs}`);
    const info = await locks.inspect(lease.name);
    assert.ok(info.held && info.fence === lease.fence);
    assert.deepEqual(info.meta, { by: "m" });
    const [lockKey, queueKey] = lockKeys(lease.name);
    assert.equal(await redis.exists(queueKey, `${lockKey}:offers`), 0, "queue and offer gone");
  }
  for (const lease of leases) assert.equal(await locks.release(lease), true);
});

Deno.test("a multi-name waiter behind a writer on one of its names is handed all after it", async () => {
  const { redis } = await fixture();
  const writer = tracked(redis);
  const multi = tracked(redis);
  const names = [keygen("ma"), keygen("mb")];
  const [a, b] = await Promise.all(
    names.map(async (name) => acquired(await writer.locks.acquire(name))),
  );
  const order: string[] = [];
  const first = writer.locks.acquire(names[1]!, { waitMs: 20_000 }).then(async (result) => {
    order.push("writer");
    await new Promise((resolve) => setTimeout(resolve, 20));
    await writer.locks.release(acquired(result));
  });
  await queued(redis, [names[1]!]);
  const then = multi.locks.acquireAll(names, { waitMs: 20_000 }).then((result) => {
    order.push("multi");
    return leasesOf(result);
  });
  await queued(redis, names);
  await writer.locks.release(a!); // the multi-name waiter heads this queue, not the other's
  await writer.locks.release(b!); // the writer ahead is handed the second name
  await first;
  const leases = await then;
  assert.deepEqual(order, ["writer", "multi"]);
  assert.equal(multi.looks(), 1, "handed over, not found by a look");
  for (const lease of leases) assert.equal(await multi.locks.release(lease), true);
});

Deno.test("a holder whose grant named a multi-name waiter hands it its names in the release's request", async () => {
  const backend = await fixture();
  const { redis } = backend;
  const { locks, looks } = tracked(redis);
  const names = [keygen("ma"), keygen("mb")];
  const first = leasesOf(await locks.acquireAll(names));
  // A writer on the first name, then a multi-name waiter behind it on both.
  const writer = locks.acquire(names[0]!, { waitMs: 20_000 });
  await queued(redis, [names[0]!]);
  const multi = locks.acquireAll(names, { ttlMs: 5_000, waitMs: 20_000 });
  await queued(redis, names, 1);
  await until(
    "the multi-name waiter is second",
    async () => await redis.zcard(lockKeys(names[0]!)[1]) === 2,
  );
  for (const lease of first) await locks.release(lease); // the writer is handed the first name
  const held = acquired(await writer);
  const before = backend.requests();
  assert.equal(await locks.release(held), true);
  const leases = leasesOf(await multi);
  // The BLPOP was counted when it arrived, before the release.
  assert.equal(backend.requests() - before, 1, "the release and the hand-over: one request");
  assert.equal(looks(), 2, "one look each, then the block a release answered");
  for (const lease of leases) assert.equal(await locks.release(lease), true);
});

Deno.test("a multi-name waiter that leaves as it is handed its names keeps them", async () => {
  const { redis } = await fixture();
  const names = [keygen("ma"), keygen("mb")];
  const holder = new Locks(redis);
  const held = await Promise.all(names.map(async (name) => acquired(await holder.acquire(name))));
  // The waiter's wait ends busy; as it leaves the queues (one pipeline), the holder releases
  // first, which hands the waiter its names: its leave finds the hand-off.
  let released = false;
  const late = new Proxy(redis, {
    get(target, property, receiver) {
      if (property !== "pipeline") return Reflect.get(target, property, receiver);
      return () => {
        const pipeline = target.pipeline();
        const exec = pipeline.exec.bind(pipeline);
        return Object.assign(pipeline, {
          exec: async (...options: Parameters<typeof exec>) => {
            released = true;
            for (const lease of held) await holder.release(lease);
            return await exec(...options);
          },
        });
      };
    },
  });
  const locks = new Locks(late);
  const result = await locks.acquireAll(names, { ttlMs: 5_000, waitMs: 300 });
  assert.ok(released, "the holder released as the waiter left");
  const leases = leasesOf(result);
  for (const lease of leases) {
    const info = await holder.inspect(lease.name);
    assert.ok(info.held && info.fence === lease.fence, "the handed lease");
    assert.equal(await holder.release(lease), true);
  }
});

Deno.test("with the held check removed from the multi-name hand-off, it grants a held name", async () => {
  const { redis } = await fixture();
  const broken = withBroken(redis, "handoff_all");
  const locks = new Locks(broken);
  const names = [keygen("ma"), keygen("mb")];
  const [a, b] = await Promise.all(names.map(async (name) => acquired(await locks.acquire(name))));
  const waiting = locks.acquireAll(names, { waitMs: 20_000 });
  await queued(redis, names);
  await locks.release(a!);
  const leases = leasesOf(await waiting);
  assert.equal(await locks.release(b!), false, "the second name was handed over while held");
  for (const lease of leases) await locks.release(lease);
});

// Random queues over three names of writers (one name each) and multi-name waiters (two or three
// names), most blocking, some polling, some releasing through another Locks (no hints): the
// history checker finds no overlap and no fence out of order, and a waiter is never granted
// before an earlier arrival that shares a name with it.
Deno.test("random queues of writers and multi-name waiters: exclusion, fences and arrival order hold", async () => {
  const { redis } = await fixture();
  const runs = Number(Deno.env.get("HANDOFF_RUNS") ?? 15);
  await fc.assert(
    fc.asyncProperty(
      fc.array(
        fc.record({
          set: fc.subarray([0, 1, 2], { minLength: 1 }),
          holdMs: fc.integer({ min: 0, max: 15 }),
          polls: fc.integer({ min: 0, max: 4 }).map((n) => n === 0),
          elsewhere: fc.boolean(),
        }),
        { minLength: 2, maxLength: 8 },
      ),
      async (waiters) => {
        const locks = new Locks(redis);
        const polling = new Locks(redis, { blocking: false });
        const other = new Locks(redis);
        const all = [0, 1, 2].map(() => keygen("mq"));
        const history: Operation[] = [];
        const grants: number[] = [];
        const first = leasesOf(await locks.acquireAll(all, { ttlMs: 30_000 }));
        const wait = async (
          { set, holdMs, polls, elsewhere }: (typeof waiters)[number],
          i: number,
        ) => {
          const names = set.map((n) => all[n]!);
          const by = polls ? polling : locks;
          const invokedAt = Date.now();
          const leases = names.length === 1
            ? [acquired(await by.acquire(names[0]!, { ttlMs: 30_000, waitMs: 20_000 }))]
            : leasesOf(await by.acquireAll(names, { ttlMs: 30_000, waitMs: 20_000 }));
          grants.push(i);
          for (const lease of leases) {
            history.push({
              op: "acquire",
              client: `c${i}`,
              name: lease.name,
              token: lease.token,
              invokedAt,
              completedAt: Date.now(),
              outcome: "acquired",
              fence: lease.fence,
              serverTime: lease.serverTime,
              expiresAt: lease.expiresAt,
              ...(names.length > 1 && { multi: true }),
            });
          }
          await new Promise((resolve) => setTimeout(resolve, holdMs));
          for (const lease of leases) {
            const releasedAt = Date.now();
            const released = await (elsewhere ? other : by).release(lease);
            history.push({
              op: "release",
              client: `c${i}`,
              name: lease.name,
              token: lease.token,
              invokedAt: releasedAt,
              completedAt: Date.now(),
              outcome: released ? "released" : "not_held",
            });
          }
        };
        const started: Promise<void>[] = [];
        for (const [i, waiter] of waiters.entries()) {
          const names = waiter.set.map((n) => all[n]!);
          const before = await Promise.all(names.map((name) => redis.zcard(lockKeys(name)[1])));
          started.push(wait(waiter, i));
          await until(`waiter ${i} queued`, async () => {
            const now = await Promise.all(names.map((name) => redis.zcard(lockKeys(name)[1])));
            return now.every((count, j) => count > before[j]!);
          });
        }
        for (const lease of first) await locks.release(lease);
        await Promise.all(started);
        assert.deepEqual(check(history), []);
        for (const [at, i] of grants.entries()) {
          for (const j of grants.slice(at + 1)) {
            const overlap = waiters[i]!.set.some((n) => waiters[j]!.set.includes(n));
            assert.ok(!(overlap && j < i), `waiter ${i} granted before ${j}: ${grants}`);
          }
        }
      },
    ),
    { numRuns: runs },
  );
});
