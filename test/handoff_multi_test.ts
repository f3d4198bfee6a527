// The hand-off to multi-name waiters: a release that frees a name whose head waits for several
// names hands it all of them at once, when every one is free and it heads every queue.
import assert from "node:assert/strict";
import type { Redis } from "@upstash/redis";
import { EdgelockError, type Lease, type LockEvent, Locks } from "@edgelock/edgelock";
import fc from "fast-check";
import { startShiftedRedisServer } from "../dev/clock_shift.ts";
import { check, type Operation, withBroken } from "../dev/history.ts";
import { HAND_OVER_ALL } from "../src/core/lua/hand_over_all.ts";
import { acquired, keygen, lockKeys, shared, startBackend, until } from "./_backend.ts";
import { beforePipelines, holdAndRelease } from "./_handoff.ts";

const fixture = shared(startBackend, (backend) => backend.stop());

// A Locks whose busy looks are counted.
function tracked(redis: Redis, options: ConstructorParameters<typeof Locks>[1] = {}) {
  const events: LockEvent[] = [];
  const locks = new Locks(redis, { ...options, onEvent: (event) => events.push(event) });
  return { locks, looks: () => events.filter((e) => e.type === "wait").length };
}

// A client that counts its BLPOP replies: `answered` when a hand-off came, `empty` when the block
// ended with nothing (the waiter then looks again).
function blocksOf(redis: Redis) {
  const blocks = { answered: 0, empty: 0 };
  const client = new Proxy(redis, {
    get(target, property, receiver) {
      if (property !== "exec") return Reflect.get(target, property, receiver);
      return async (command: [string, ...string[]]) => {
        const reply = await target.exec(command);
        if (command[0] === "BLPOP") blocks[reply === null ? "empty" : "answered"]++;
        return reply;
      };
    },
  });
  return { client, blocks };
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
  const late = beforePipelines(redis, async () => {
    if (released) return;
    released = true;
    for (const lease of held) await holder.release(lease);
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

Deno.test("a multi-name waiter handed its names after the server clock stepped back finds them at its next look", async () => {
  const server = await startShiftedRedisServer();
  const backend = await startBackend([], server);
  try {
    const names = [keygen("ma"), keygen("mb")];
    const holder = new Locks(backend.redis);
    const held = await Promise.all(names.map(async (n) => acquired(await holder.acquire(n))));
    const { client, blocks } = blocksOf(backend.redis);
    const { locks, looks } = tracked(client);
    const waiting = locks.acquireAll(names, { ttlMs: 30_000, waitMs: 20_000 });
    await queued(backend.redis, names);
    // The hand-off's grant now carries a server time before the waiter's look: the waiter cannot
    // tell it from a grant made before its look (no live lease), so it looks again.
    await server.shift(-10_000);
    for (const lease of held) assert.equal(await holder.release(lease), true);
    const leases = leasesOf(await waiting);
    assert.equal(blocks.answered, 1, "the hand-off woke it");
    assert.equal(looks(), 1, "one busy look before the block; the look after it was granted");
    for (const [i, lease] of leases.entries()) {
      assert.equal(lease.name, names[i]);
      const info = await holder.inspect(lease.name);
      assert.ok(info.held && info.fence === lease.fence, "the lease Redis holds for it");
      assert.ok(lease.fence > held[i]!.fence, "fences still increase across the step back");
      assert.equal(await locks.release(lease), true);
    }
    for (const name of names) assert.equal((await holder.inspect(name)).held, false);
  } finally {
    await backend.stop();
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

// Random queues over four names of writers and readers (one name each) and multi-name waiters
// (one to four names, in any order), most blocking, some polling, some releasing through another
// Locks (no hints): the history checker finds no overlap and no fence out of order, and a waiter
// is never granted before an earlier arrival that shares a name with it (unless both read).
Deno.test("random queues of writers, readers and multi-name waiters: exclusion, fences and arrival order hold", async () => {
  const { redis } = await fixture();
  const runs = Number(Deno.env.get("HANDOFF_RUNS") ?? 15);
  await fc.assert(
    fc.asyncProperty(
      fc.array(
        fc.record({
          set: fc.shuffledSubarray([0, 1, 2, 3], { minLength: 1 }),
          reads: fc.integer({ min: 0, max: 3 }).map((n) => n === 0),
          holdMs: fc.integer({ min: 0, max: 15 }),
          polls: fc.integer({ min: 0, max: 4 }).map((n) => n === 0),
          elsewhere: fc.boolean(),
        }),
        { minLength: 2, maxLength: 8 },
      ),
      async (waiters) => {
        // The names a waiter takes: a reader its set's first.
        const taken = ({ set, reads }: (typeof waiters)[number]) => reads ? set.slice(0, 1) : set;
        const locks = new Locks(redis);
        const polling = new Locks(redis, { blocking: false });
        const other = new Locks(redis);
        const all = [0, 1, 2, 3].map(() => keygen("mq"));
        const history: Operation[] = [];
        const grants: number[] = [];
        const first = leasesOf(await locks.acquireAll(all, { ttlMs: 30_000 }));
        const wait = async (waiter: (typeof waiters)[number], i: number) => {
          const { reads, holdMs, polls, elsewhere } = waiter;
          const names = taken(waiter).map((n) => all[n]!);
          const by = polls ? polling : locks;
          const invokedAt = Date.now();
          // A reader takes the first name of its set, shared; others all of it (one name alone
          // through acquire or acquireAll, by turns).
          const mode = reads ? { mode: "shared" as const } : {};
          const leases = reads || (names.length === 1 && i % 2 === 0)
            ? [acquired(await by.acquire(names[0]!, { ttlMs: 30_000, waitMs: 20_000, ...mode }))]
            : leasesOf(await by.acquireAll(names, { ttlMs: 30_000, waitMs: 20_000 }));
          grants.push(i);
          const kind = reads
            ? { mode: "shared" as const }
            : names.length > 1
            ? { multi: true }
            : {};
          const releaser = elsewhere ? other : by;
          await holdAndRelease(history, `c${i}`, leases, invokedAt, kind, holdMs, releaser);
        };
        const started: Promise<void>[] = [];
        for (const [i, waiter] of waiters.entries()) {
          const names = taken(waiter).map((n) => all[n]!);
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
            const [x, y] = [waiters[i]!, waiters[j]!];
            const conflict = taken(x).some((n) => taken(y).includes(n)) && !(x.reads && y.reads);
            assert.ok(!(conflict && j < i), `waiter ${i} granted before ${j}: ${grants}`);
          }
        }
      },
    ),
    { numRuns: runs },
  );
});

Deno.test("a multi-name waiter whose token holds one of its names already is handed the others", async () => {
  for (const [hinted, contended] of [[false, false], [true, false], [false, true], [true, true]]) {
    const { redis } = await fixture();
    const holder = new Locks(redis);
    const { client, blocks } = blocksOf(redis);
    const locks = new Locks(client);
    const [a, b] = [keygen("sa"), keygen("sb")];
    const token = `self-held-${crypto.randomUUID()}`;
    const own = acquired(await locks.acquire(b, { token, ttlMs: 30_000 }));
    // Another waiter queued on the name it holds, ahead of it: it keeps that name all the same.
    const ahead = contended ? holder.acquire(b, { waitMs: 20_000 }).then(acquired) : undefined;
    if (ahead) await queued(redis, [b]);
    let first = acquired(await holder.acquire(a, { ttlMs: 30_000 }));
    let writer: Promise<Lease> | undefined;
    if (hinted) {
      // A writer is handed the first name ahead of the multi-name waiter: its grant names it.
      writer = holder.acquire(a, { waitMs: 20_000 }).then(acquired);
      await queued(redis, [a]);
    }
    const waiting = locks.acquireAll([a, b], { token, ttlMs: 5_000, waitMs: 20_000 });
    await queued(redis, [a], hinted ? 2 : 1);
    await queued(redis, [b], contended ? 2 : 1);
    if (writer) {
      await holder.release(first);
      first = await writer;
    }
    await holder.release(first);
    const leases = leasesOf(await waiting);
    const label = `hinted: ${hinted}, contended: ${contended}`;
    assert.deepEqual(blocks, { answered: 1, empty: 0 }, `handed over (${label})`);
    assert.equal(leases[1]!.fence, own.fence, "the name it held keeps its fence");
    for (const lease of leases) assert.equal(await locks.release(lease), true);
    if (ahead) await holder.release(await ahead);
  }
});

Deno.test("a multi-name acquire with the token of a reentrant lease is mode_mismatch, and ends nothing", async () => {
  const { redis } = await fixture();
  const locks = new Locks(redis);
  const [a, b] = [keygen("ea"), keygen("eb")];
  const outer = acquired(await locks.acquire(b, { reentrant: true, ttlMs: 30_000 }));
  await assert.rejects(
    locks.acquireAll([a, b], { token: outer.token, waitMs: 1_000 }),
    (error) => error instanceof EdgelockError && error.code === "mode_mismatch",
  );
  assert.equal((await locks.inspect(a)).held, false, "no name taken");
  const info = await locks.inspect(b);
  assert.ok(info.held && info.fence === outer.fence && info.expiresAt === outer.expiresAt);
  assert.equal(await locks.release(outer), true);
  assert.equal((await locks.inspect(b)).held, false, "its one hold ended it");
});

// A writer's release, and a reader's (the last of the readers: its grant named the waiter too).
for (const mode of ["exclusive", "shared"] as const) {
  Deno.test(`a ${mode} release whose source was loaded anew runs after the hand-over behind it, which waits for it`, async () => {
    const { redis } = await fixture();
    const [a, b] = [keygen("ra"), keygen("rb")];
    // The releaser's second request (its release again, as EVAL) waits until the other name's
    // release is done: each finds the other's name held.
    let armed = false;
    let execs = 0;
    let open!: () => void;
    const gate = new Promise<void>((resolve) => open = resolve);
    const gated = beforePipelines(redis, async () => {
      if (armed && ++execs === 2) await gate;
    });
    const releaser = new Locks(gated);
    const holder = new Locks(redis);
    const { client, blocks } = blocksOf(redis);
    const locks = new Locks(client);
    const first = acquired(await holder.acquire(a, { ttlMs: 30_000 }));
    const other = acquired(await holder.acquire(b, { ttlMs: 30_000 }));
    const writer = releaser.acquire(a, { ttlMs: 30_000, waitMs: 20_000, mode });
    await queued(redis, [a]);
    const waiting = locks.acquireAll([b, a], { ttlMs: 5_000, waitMs: 20_000 });
    await until("queued second", async () => await redis.zcard(lockKeys(a)[1]) === 2);
    await holder.release(first);
    const held = acquired(await writer); // its grant names the multi-name waiter
    await redis.scriptFlush();
    await redis.scriptLoad(HAND_OVER_ALL.source); // the hand-over's source is loaded, the release's not
    armed = true;
    const releasing = releaser.release(held); // hand_over_all runs first and finds its name held
    await until("the first request ran", () => Promise.resolve(execs >= 2));
    assert.equal(await holder.release(other), true); // its hand-over finds the first name held
    open();
    assert.equal(await releasing, true);
    const leases = leasesOf(await waiting);
    assert.deepEqual(blocks, { answered: 1, empty: 0 }, "handed over by the release's second step");
    for (const lease of leases) assert.equal(await locks.release(lease), true);
  });
}

Deno.test("leases kept at a leave name the next waiters, as leases handed while blocked do", async () => {
  const requests = async (atLeave: boolean) => {
    const backend = await fixture();
    const { redis } = backend;
    const names = [keygen("la"), keygen("lb")];
    const holder = new Locks(redis);
    const held = await Promise.all(names.map(async (n) => acquired(await holder.acquire(n))));
    // At a leave, the holder releases first: the leave finds the names handed over.
    let released = !atLeave;
    const late = beforePipelines(redis, async () => {
      if (released) return;
      released = true;
      for (const lease of held) await holder.release(lease);
    });
    const first = new Locks(late);
    const waiting = first.acquireAll(names, { ttlMs: 30_000, waitMs: atLeave ? 400 : 20_000 });
    await queued(redis, names, 1);
    const next = holder.acquireAll(names, { ttlMs: 5_000, waitMs: 20_000 });
    await queued(redis, names, 2);
    if (!atLeave) { for (const lease of held) await holder.release(lease); }
    const leases = leasesOf(await waiting);
    const before = backend.requests();
    for (const lease of leases) assert.equal(await first.release(lease), true);
    const count = backend.requests() - before;
    for (const lease of leasesOf(await next)) await holder.release(lease);
    return count;
  };
  assert.equal(await requests(true), await requests(false));
});
