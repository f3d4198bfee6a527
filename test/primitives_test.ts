// Read-write locks, semaphores, reentrant and multi-name locks against a real redis-server: each
// invariant attacked the way it would break (a writer starved, a limit exceeded, a half-taken
// set, a deadlock, a reused fence).
import assert from "node:assert/strict";
import fc from "fast-check";
import { EdgelockError, type Lease, LockOps, Locks } from "@edgelock/edgelock";
import { createClient } from "@edgelock/edgelock/client";
import { createApp } from "@edgelock/edgelock/service";
import { acquired, keygen, lockKeys, shared, startBackend, takeTicket, until } from "./_backend.ts";

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

async function rejectsWith(promise: Promise<unknown>, code: string) {
  await assert.rejects(promise, (error) => error instanceof EdgelockError && error.code === code);
}

const fixture = shared(async () => {
  const backend = await startBackend();
  const locks = new Locks(backend.redis);
  const ops = new LockOps(backend.redis);
  return { backend, locks, ops };
}, ({ backend }) => backend.stop());

Deno.test("readers hold a name together; a writer waits for all and fences higher", async () => {
  const { locks } = await fixture();
  const name = keygen("rw");
  const readers = await Promise.all(
    [1, 2, 3].map(() => locks.acquire(name, { mode: "shared", ttlMs: 10_000 })),
  ).then((results) => results.map(acquired));
  assert.equal(new Set(readers.map((r) => r.fence)).size, 3, "each reader its own fence");
  assert.equal((await locks.acquire(name)).acquired, false, "no writer beside readers");
  const writer = locks.acquire(name, { waitMs: 5000 });
  await locks.release(readers[0]!);
  await locks.release(readers[1]!);
  await sleep(100);
  const info = await locks.inspect(name);
  assert.ok(info.held && info.mode === "shared" && info.holders === 1, JSON.stringify(info));
  await locks.release(readers[2]!);
  const wrote = acquired(await writer);
  assert.ok(readers.every((r) => r.fence < wrote.fence), "the writer's fence is the highest");
  assert.equal(
    (await locks.acquire(name, { mode: "shared" })).acquired,
    false,
    "no reader beside the writer",
  );
  await locks.release(wrote);
  const after = acquired(await locks.acquire(name, { mode: "shared" }));
  assert.ok(after.fence > wrote.fence, "a reader can tell it read after the latest write");
  await locks.release(after);
});

Deno.test("a queued writer blocks later readers: a stream of readers cannot starve it", async () => {
  const { locks } = await fixture();
  const name = keygen("rw");
  let reader = acquired(await locks.acquire(name, { mode: "shared", ttlMs: 10_000 }));
  const writer = locks.acquire(name, { waitMs: 10_000, ttlMs: 10_000 });
  await until(
    "the writer is queued",
    async () => ((await locks.inspect(name)) as { waiters?: number }).waiters === 1,
  );
  // Readers keep arriving, each wanting in while the first still reads: none cuts in.
  const late: Promise<Lease>[] = [];
  for (let i = 0; i < 5; i++) {
    assert.equal((await locks.acquire(name, { mode: "shared" })).acquired, false);
    late.push(locks.acquire(name, { mode: "shared", waitMs: 10_000 }).then(acquired));
    await sleep(20);
  }
  await locks.release(reader);
  const wrote = acquired(await writer);
  await sleep(50);
  assert.equal(((await locks.inspect(name)) as { mode?: string }).mode, "exclusive");
  await locks.release(wrote);
  const readers = await Promise.all(late);
  assert.ok(
    readers.every((r) => r.fence > wrote.fence),
    "the readers came after the writer",
  );
  for (reader of readers) await locks.release(reader);
});

Deno.test("a reader that crashed frees the writer when its lease runs out", async () => {
  const { locks } = await fixture();
  const name = keygen("rw");
  acquired(await locks.acquire(name, { mode: "shared", ttlMs: 300 })); // never released
  const wrote = acquired(await locks.acquire(name, { waitMs: 3000 }));
  await locks.release(wrote);
});

Deno.test("a writer that vanished while queued holds readers up only until its ticket lapses", async () => {
  const { backend, locks } = await fixture();
  const name = keygen("rw");
  const reader = acquired(await locks.acquire(name, { mode: "shared", ttlMs: 10_000 }));
  await takeTicket(backend.redis, name, "vanished-writer-000001", 400);
  assert.equal((await locks.acquire(name, { mode: "shared" })).acquired, false, "behind it");
  // Granted within the wait once the ticket lapsed (the reader itself holds for 10 s).
  const late = acquired(await locks.acquire(name, { mode: "shared", waitMs: 3000 }));
  await locks.release(late);
  await locks.release(reader);
});

Deno.test("an aborted multi-name wait leaves every queue it joined", async () => {
  const { backend, locks } = await fixture();
  const tag = `{${keygen("m")}}`;
  const [a, b] = [`${tag}a`, `${tag}b`];
  const holder = acquired(await locks.acquire(b!, { ttlMs: 10_000 }));
  const stop = new AbortController();
  const waiting = locks.acquireAll([a!, b!], { waitMs: 10_000, signal: stop.signal });
  await until(
    "it waits in both queues",
    async () =>
      await backend.redis.zcard(lockKeys(a!)[1]) === 1 &&
      await backend.redis.zcard(lockKeys(b!)[1]) === 1,
  );
  assert.equal((await locks.inspect(a!)).held, false, "it holds neither name while waiting");
  stop.abort();
  await assert.rejects(waiting);
  assert.equal(await backend.redis.zcard(lockKeys(a!)[1]), 0);
  assert.equal(await backend.redis.zcard(lockKeys(b!)[1]), 0);
  const free = acquired(await locks.acquire(a!));
  await locks.release(free);
  await locks.release(holder);
});

Deno.test("a semaphore never has more than limit permits out, and serves waiters in order", async () => {
  const { locks } = await fixture();
  const name = keygen("sem");
  const two = acquired(await locks.acquire(name, { limit: 3, permits: 2 }));
  const one = acquired(await locks.acquire(name, { limit: 3 }));
  assert.equal(one.mode, "semaphore");
  assert.equal((await locks.acquire(name, { limit: 3 })).acquired, false, "all 3 are out");
  const info = await locks.inspect(name);
  assert.ok(info.held && info.permits === 3 && info.holders === 2 && info.limit === 3);
  // A waiter for 3 permits is not passed by a later caller for 1.
  const big = locks.acquire(name, { limit: 3, permits: 3, waitMs: 5000 });
  await until(
    "the big waiter is queued",
    async () => ((await locks.inspect(name)) as { waiters?: number }).waiters === 1,
  );
  await locks.release(one);
  assert.equal((await locks.acquire(name, { limit: 3 })).acquired, false, "no cutting in");
  await locks.release(two);
  const all = acquired(await big);
  assert.equal(all.permits, 3);
  assert.ok(all.fence > one.fence && one.fence > two.fence, "each holder a higher fence");
  await locks.release(all);
});

Deno.test("a limit or mode that disagrees with the one in force is an error, not a grant", async () => {
  const { locks } = await fixture();
  const name = keygen("sem");
  const held = acquired(await locks.acquire(name, { limit: 3 }));
  await rejectsWith(locks.acquire(name, { limit: 4 }), "limit_mismatch");
  await rejectsWith(locks.acquire(name, { limit: 4, waitMs: 200 }), "limit_mismatch");
  await rejectsWith(locks.acquire(name, { mode: "shared" }), "mode_mismatch");
  await rejectsWith(locks.acquire(name), "mode_mismatch");
  await rejectsWith(locks.acquireAll([name]), "mode_mismatch");
  await locks.release(held);
  const other = keygen("rw");
  const reader = acquired(await locks.acquire(other, { mode: "shared" }));
  await rejectsWith(locks.acquire(other, { limit: 2 }), "mode_mismatch");
  await locks.release(reader);
  const writer = acquired(await locks.acquire(other));
  await rejectsWith(locks.acquire(other, { limit: 2 }), "mode_mismatch");
  await rejectsWith(
    locks.acquire(other, { mode: "shared", token: writer.token }),
    "mode_mismatch",
  );
  await locks.release(writer);
  const free = acquired(await locks.acquire(name, { limit: 4 }));
  assert.equal(free.limit, 4, "once free, a name takes another limit");
  await locks.release(free);
});

Deno.test("bad modes, limits and permits are refused before any request", async () => {
  const { backend, locks } = await fixture();
  const before = backend.requests();
  const name = keygen("bad");
  const bad: [Record<string, unknown>, typeof RangeError | typeof TypeError, RegExp][] = [
    [{ mode: "read" }, RangeError, /mode must be "exclusive" or "shared"/],
    [{ limit: 0 }, RangeError, /limit must be an integer from 1 to 1000/],
    [{ limit: 1001 }, RangeError, /limit must be an integer from 1 to 1000/],
    [{ limit: 2.5 }, RangeError, /limit must be an integer/],
    [{ limit: 3, permits: 4 }, RangeError, /permits must be an integer from 1 to limit \(3\)/],
    [{ limit: 3, permits: 0 }, RangeError, /permits must be/],
    [{ permits: 2 }, TypeError, /permits needs limit/],
    [{ limit: 3, mode: "shared" }, TypeError, /A semaphore \(limit\) takes no mode/],
    [{ reentrant: "yes" }, TypeError, /reentrant must be a boolean/],
  ];
  for (const [options, type, message] of bad) {
    await assert.rejects(locks.acquire(name, options), (error) => {
      return error instanceof type && message.test((error as Error).message);
    }, JSON.stringify(options));
  }
  await assert.rejects(locks.acquire("{bad", { mode: "shared", ttlMs: 1 }), RangeError);
  await assert.rejects(
    locks.withLock(name, { ifAvailable: true, waitMs: 100 }, () => 1),
    /ifAvailable means no wait/,
  );
  assert.equal(backend.requests(), before, "no request for a bad input");
});

Deno.test("a reentrant lease counts its holds, each ended by its own release", async () => {
  const { locks } = await fixture();
  const name = keygen("re");
  const first = acquired(await locks.acquire(name, { reentrant: true }));
  assert.equal(first.holdCount, 1);
  const again = acquired(await locks.acquire(name, { reentrant: true, token: first.token }));
  assert.equal(again.holdCount, 2);
  assert.equal(again.fence, first.fence, "one lease, one fence");
  assert.notEqual(again.hold, first.hold, "each acquire is a hold of its own");
  assert.equal(await locks.release(first), true);
  assert.ok((await locks.inspect(name)).held, "still held once");
  assert.equal(await locks.release(first), true, "a retry answers the same");
  assert.ok((await locks.inspect(name)).held, "and ends no other hold");
  assert.equal(await locks.release(again), true);
  assert.equal((await locks.inspect(name)).held, false, "freed at zero");
  const plain = acquired(await locks.acquire(name));
  acquired(await locks.acquire(name, { token: plain.token })); // a retry, not a hold
  assert.equal(await locks.release(plain), true);
  assert.equal((await locks.inspect(name)).held, false, "one release frees a retried acquire");
  const reader = acquired(await locks.acquire(name, { mode: "shared", reentrant: true }));
  const twice = acquired(
    await locks.acquire(name, { mode: "shared", reentrant: true, token: reader.token }),
  );
  assert.equal(twice.holdCount, 2);
  const renewed = await locks.renew(twice);
  assert.ok(
    renewed.renewed && renewed.lease.holdCount === 2 && renewed.lease.mode === "shared" &&
      renewed.lease.hold === twice.hold,
  );
  await locks.release(reader);
  await locks.release(reader);
  assert.ok((await locks.inspect(name)).held);
  await locks.release(renewed.lease);
  assert.equal((await locks.inspect(name)).held, false);
});

Deno.test("acquiring again with a token whose lease ended is a new lease: a new fence, one hold", async () => {
  const { locks } = await fixture();
  const name = keygen("re-anew");
  const outer = acquired(await locks.acquire(name, { reentrant: true, ttlMs: 100 }));
  await until("the lease ends", async () => !(await locks.inspect(name)).held);
  const inner = acquired(await locks.acquire(name, { reentrant: true, token: outer.token }));
  assert.ok(inner.fence > outer.fence, "a higher fence: the outer hold was lost");
  assert.equal(inner.holdCount, 1);
  assert.equal(await locks.release(inner), true);
  assert.equal((await locks.inspect(name)).held, false, "the lost outer hold keeps nothing held");
});

Deno.test("a reentrant lease released without its hold is refused, and stays held, in every mode", async () => {
  const { locks } = await fixture();
  const { post } = await http();
  for (const kind of [{}, { mode: "shared" as const }, { limit: 2 }]) {
    const name = keygen("re");
    const lease = acquired(await locks.acquire(name, { ...kind, reentrant: true, ttlMs: 30_000 }));
    for (
      const bare of [{ name, token: lease.token }, { name, token: lease.token, fence: lease.fence }]
    ) {
      await assert.rejects(locks.release(bare), (error: unknown) => {
        assert.ok(error instanceof EdgelockError, String(error));
        assert.equal(error.code, "mode_mismatch");
        assert.match(error.message, /reentrant: release each hold with its lease \(its hold\)/);
        return true;
      });
      assert.ok((await locks.inspect(name)).held, `${JSON.stringify(kind)}: still held`);
    }
    // The HTTP API says the same: a 409 problem, nothing freed.
    const over = await post(`/v1/locks/${name}/acquire`, { ...kind, reentrant: true });
    assert.equal(over.status, 200, JSON.stringify(over.body));
    const refused = await post(`/v1/locks/${name}/release`, { token: over.body.token });
    assert.equal(refused.status, 409);
    assert.equal(refused.type, "application/problem+json");
    assert.equal(refused.body.code, "mode_mismatch");
    const release = { token: over.body.token, hold: over.body.hold };
    assert.equal((await post(`/v1/locks/${name}/release`, release)).body.released, true);
    assert.equal(await locks.release(lease), true);
    assert.equal((await locks.inspect(name)).held, false);
    // A plain lease of the same token is released without a hold, as before; once it also has a
    // reentrant hold, a release without a hold ends the plain one, and its retry answers the same.
    const plain = acquired(await locks.acquire(name, { ...kind, token: lease.token }));
    const inner = acquired(
      await locks.acquire(name, { ...kind, token: plain.token, reentrant: true }),
    );
    assert.equal(inner.holdCount, 2);
    assert.equal(await locks.release({ name, token: plain.token }), true);
    assert.equal(await locks.release({ name, token: plain.token }), true, "a retry");
    assert.ok((await locks.inspect(name)).held, "the reentrant hold remains");
    assert.equal(await locks.release(inner), true);
    assert.equal((await locks.inspect(name)).held, false);
  }
});

Deno.test("a retried reentrant acquire (the same hold id) counts once; a retried release ends once", async () => {
  const { locks } = await fixture();
  const name = keygen("re");
  const outer = acquired(await locks.acquire(name, { reentrant: true, ttlMs: 20_000 }));
  const options = {
    reentrant: true,
    token: outer.token,
    hold: "inner-hold-1",
    ttlMs: 20_000,
  };
  const inner = acquired(await locks.acquire(name, options));
  const retried = acquired(await locks.acquire(name, options)); // its reply was lost
  assert.equal(retried.holdCount, 2, "the retry counted no hold more");
  assert.equal(await locks.release(inner), true);
  assert.equal(await locks.release(inner), true, "the release retried");
  const other = await locks.acquire(name);
  assert.equal(other.acquired, false, "the outer hold still holds the name");
  const info = await locks.inspect(name);
  assert.ok(info.held && info.permits === 1, "one hold left");
  assert.equal(await locks.release(outer), true);
  assert.equal((await locks.inspect(name)).held, false, "one release per hold frees it");
  await assert.rejects(locks.acquire(name, { hold: "inner-hold-1" }), /hold needs reentrant/);
  await assert.rejects(locks.acquire(name, { reentrant: true, hold: "x" }), RangeError);
});

for (
  const [label, mode] of [
    ["an exclusive", {}],
    ["a shared", { mode: "shared" as const }],
    ["a semaphore's", { limit: 2, permits: 2 }],
  ] as const
) {
  Deno.test(`${label} reentrant hold with a shorter TTL never ends the lease the outer hold was told`, async () => {
    const { locks } = await fixture();
    const name = keygen("re");
    const outer = acquired(
      await locks.acquire(name, { ...mode, reentrant: true, ttlMs: 30_000 }),
    );
    const inner = acquired(
      await locks.acquire(name, { ...mode, reentrant: true, token: outer.token, ttlMs: 300 }),
    );
    assert.ok(inner.expiresAt >= outer.expiresAt, "the inner hold is told the lease's end");
    const renewed = await locks.renew(inner, { ttlMs: 300 });
    assert.ok(renewed.renewed && renewed.lease.expiresAt >= outer.expiresAt, "renew too");
    assert.equal(await locks.release(renewed.lease), true);
    // Well past the inner hold's own 300 ms: the outer hold still has its 30 s.
    await until("a second passed on the server", async () => {
      const info = await locks.inspect(name);
      return !info.held || info.ttlMs! < outer.ttlMs - 1000;
    });
    // A writer (or, for the semaphore, one more permit) must wait for the outer lease.
    const other = await locks.acquire(name, "limit" in mode ? { limit: 2 } : {});
    assert.equal(other.acquired, false, "nobody else holds it while the outer lease runs");
    const info = await locks.inspect(name);
    assert.ok(info.held && info.expiresAt! >= outer.expiresAt - 1, "held until its end");
    assert.ok((await locks.renew(outer)).renewed, "the outer hold renews");
    assert.equal(await locks.release(outer), true);
  });
}

Deno.test("a shared lease's release is safe to retry; a lost one says so", async () => {
  const { locks, ops } = await fixture();
  const name = keygen("rw");
  const [a, b] = await Promise.all([1, 2].map(() => locks.acquire(name, { mode: "shared" })))
    .then((results) => results.map(acquired));
  assert.equal(await locks.release(a!), true);
  assert.equal(await locks.release(a!), true, "a retried release answers the same");
  assert.equal(await locks.release(b!), true);
  assert.equal(await locks.release(b!), true, "also for the last reader out");
  const short = acquired(await locks.acquire(name, { mode: "shared", ttlMs: 150 }));
  const stays = acquired(await locks.acquire(name, { mode: "shared", ttlMs: 10_000 }));
  await sleep(300);
  assert.equal(await locks.release(short), false, "its lease ran out");
  assert.equal((await locks.renew(short)).renewed, false);
  const broken = await ops.break(name, { by: "test" });
  assert.ok(broken.broken);
  assert.equal((await locks.renew(stays)).renewed, false, "a break ends every reader");
  assert.equal(await locks.release(stays), false);
  const next = acquired(await locks.acquire(name));
  assert.ok(next.fence > stays.fence);
  await locks.release(next);
});

for (
  const [label, mode] of [
    ["an exclusive", {}],
    ["a shared", { mode: "shared" as const }],
    ["a semaphore", { limit: 3 }],
  ] as const
) {
  Deno.test(`${label} release retried with the token alone answers true and counts nothing lost`, async () => {
    const { backend } = await fixture();
    const prefix = keygen("p");
    const counted = new Locks(backend.redis, { prefix });
    const name = keygen("rt");
    const first = acquired(await counted.acquire(name, mode));
    const exclusive = !("mode" in mode) && !("limit" in mode);
    // Shared and semaphore: another holder stays; exclusive: another lease comes and goes.
    const other = exclusive ? undefined : acquired(await counted.acquire(name, mode));
    const ref = { name, token: first.token };
    assert.equal(await counted.release(ref), true);
    if (exclusive) await counted.release(acquired(await counted.acquire(name)));
    assert.equal(await counted.release(ref), true, "the retry, without the fence");
    assert.equal(await counted.release(first), true, "and with it");
    assert.equal(
      (await new LockOps(backend.redis, { prefix }).stats()).total.release.lost,
      0,
      "no lease counted lost",
    );
    if (other) assert.equal(await counted.release(other), true);
  });
}

Deno.test("a holder acquiring again is told only what it holds: other permits or a plain acquire of a reentrant lease are errors", async () => {
  const { locks } = await fixture();
  const name = keygen("sem");
  const one = acquired(await locks.acquire(name, { limit: 3, permits: 1, reentrant: true }));
  await assert.rejects(
    locks.acquire(name, { limit: 3, permits: 3, reentrant: true, token: one.token }),
    (error) => (error as EdgelockError).code === "permits_mismatch",
  );
  await assert.rejects(
    locks.acquire(name, { limit: 3, permits: 3, token: one.token }),
    (error) => (error as EdgelockError).code === "permits_mismatch",
  );
  const two = acquired(await locks.acquire(name, { limit: 3, permits: 2 }));
  const info = await locks.inspect(name);
  assert.ok(info.held && info.permits === 3, "1 + 2 of 3, as the callers were told");
  await assert.rejects(
    locks.acquire(name, { limit: 3, permits: 1, token: one.token }),
    (error) => (error as EdgelockError).code === "mode_mismatch",
    "a plain acquire would count no hold of the reentrant lease",
  );
  for (const lease of [one, two]) assert.equal(await locks.release(lease), true);
  const outer = acquired(await locks.acquire(name, { reentrant: true }));
  await assert.rejects(
    locks.acquire(name, { token: outer.token }),
    /acquire it again with reentrant: true/,
  );
  assert.equal(await locks.release(outer), true);
  assert.equal((await locks.inspect(name)).held, false);
});

Deno.test("a multi-name lock takes all its names or none", async () => {
  const { locks } = await fixture();
  const tag = `{${keygen("m")}}`;
  const names = ["x", "y", "z"].map((n) => tag + n);
  const other = acquired(await locks.acquire(names[1]!));
  const busy = await locks.acquireAll(names);
  assert.equal(busy.acquired, false);
  assert.equal((await locks.inspect(names[0]!)).held, false, "no name half-taken");
  assert.equal((await locks.inspect(names[2]!)).held, false);
  const all = locks.acquireAll(names, { waitMs: 5000 });
  await sleep(50);
  await locks.release(other);
  const got = await all;
  assert.ok(got.acquired);
  assert.deepEqual(got.leases.map((l) => l.name), names);
  assert.equal(new Set(got.leases.map((l) => l.token)).size, 1, "one token");
  assert.ok(got.leases[1]!.fence > other.fence);
  const renewed = await locks.renewMany(got.leases);
  assert.ok(renewed.every((r) => r.renewed));
  for (const lease of got.leases) assert.equal(await locks.release(lease), true);
});

Deno.test("withLocks holds every name through long work, and aborts when one is lost", async () => {
  const { locks, ops } = await fixture();
  const tag = `{${keygen("m")}}`;
  const names = [`${tag}a`, `${tag}b`];
  const fences = await locks.withLocks(names, { ttlMs: 300 }, async (leases, signal) => {
    await sleep(700); // over two TTLs: renewed meanwhile
    assert.equal(signal.aborted, false);
    return leases.map((lease) => lease.fence);
  });
  assert.equal(fences.length, 2);
  for (const name of names) assert.equal((await locks.inspect(name)).held, false, "released");
  let aborted = false;
  await rejectsWith(
    locks.withLocks(names, { ttlMs: 300 }, async (_leases, signal) => {
      await ops.break(names[1]!, { by: "test" });
      await new Promise((resolve) => signal.addEventListener("abort", resolve));
      aborted = true;
    }),
    "lock_lost",
  );
  assert.ok(aborted, "the routine's signal aborted");
  assert.equal((await locks.inspect(names[0]!)).held, false, "the other lease was released");
});

Deno.test("a multi-name lock takes any names on one Redis; the cluster layout refuses other slots", async () => {
  const { backend, locks } = await fixture();
  const [a, b] = [keygen("acct"), keygen("other")];
  const both = await locks.acquireAll([a, b]);
  assert.ok(both.acquired, "names in different groups, on one Redis");
  for (const lease of both.leases) assert.equal(await locks.release(lease), true);
  const cluster = new Locks(backend.redis, { cluster: true });
  await assert.rejects(
    cluster.acquireAll(["acct:1", "acct:2"]),
    /the names of one multi-name lock must share a slot: "acct:2" does not start like "acct:1"/,
  );
  await assert.rejects(locks.acquireAll(["{a}1", "{a}1"]), /must differ/);
  await assert.rejects(locks.acquireAll([]), /1 to 32/);
  await assert.rejects(
    locks.acquireAll(Array.from({ length: 33 }, (_, i) => `{a}${i}`)),
    /1 to 32/,
  );
});

Deno.test("overlapping multi-name locks never deadlock and never overlap", async () => {
  const { locks } = await fixture();
  const tag = `{${keygen("dl")}}`;
  const sets = [["a", "b"], ["b", "c"], ["c", "a"], ["a", "b", "c"]].map((s) =>
    s.map((n) => tag + n)
  );
  const holding = new Map<string, number>();
  let overlaps = 0;
  let done = 0;
  await Promise.all(sets.map(async (set, who) => {
    for (let round = 0; round < 8; round++) {
      const got = await locks.acquireAll(set, { waitMs: 20_000, ttlMs: 5000 });
      assert.ok(got.acquired, `caller ${who} round ${round}`);
      for (const name of set) {
        if (holding.has(name)) overlaps++;
        holding.set(name, who);
      }
      await sleep(Math.random() * 10);
      for (const name of set) holding.delete(name);
      for (const lease of got.leases) await locks.release(lease);
      done++;
    }
  }));
  assert.equal(overlaps, 0);
  assert.equal(done, 32);
});

Deno.test("fences strictly increase per name across modes (model-based)", async () => {
  const { locks } = await fixture();
  // A reference model with long leases and no waiting: who holds what, and what fits.
  type Op = { client: number; act: "shared" | "exclusive" | "release" };
  const run = async (ops: Op[]) => {
    const name = keygen("model");
    const held = new Map<number, { lease: Lease; mode: string }>();
    let lastFence = 0;
    for (const { client, act } of ops) {
      if (act === "release") {
        const mine = held.get(client);
        assert.equal(
          // A token that never held it (a retry of a release answers true: tested above).
          await locks.release(mine?.lease ?? { name, token: "stranger-token-0000000" }),
          !!mine,
        );
        held.delete(client);
        continue;
      }
      if (held.has(client)) continue;
      const modes = [...held.values()].map((h) => h.mode);
      const fits = act === "shared" ? !modes.includes("exclusive") : modes.length === 0;
      const result = await locks.acquire(name, {
        ...(act === "shared" && { mode: "shared" as const }),
        token: `client-token-${client}-000000`,
      });
      assert.equal(result.acquired, fits, `${act} by ${client} with ${JSON.stringify(modes)}`);
      if (result.acquired) {
        assert.ok(result.lease.fence > lastFence, "a new fence above every earlier one");
        lastFence = result.lease.fence;
        held.set(client, { lease: result.lease, mode: act });
      }
      const info = await locks.inspect(name);
      assert.equal(info.held, held.size > 0);
    }
    for (const { lease } of held.values()) await locks.release(lease);
  };
  const op = fc.record({
    client: fc.integer({ min: 0, max: 3 }),
    act: fc.constantFrom("shared" as const, "exclusive" as const, "release" as const),
  });
  await fc.assert(fc.asyncProperty(fc.array(op, { maxLength: 30 }), run), {
    numRuns: Number(Deno.env.get("MODEL_RUNS") ?? 40),
  });
});

Deno.test("a semaphore grants exactly what fits under its limit (model-based)", async () => {
  const { locks } = await fixture();
  type Op = { client: number; permits: number; release: boolean };
  const run = async (ops: Op[]) => {
    const name = keygen("model");
    const held = new Map<number, Lease>();
    let lastFence = 0;
    for (const { client, permits, release } of ops) {
      const mine = held.get(client);
      if (release) {
        if (mine) assert.equal(await locks.release(mine), true);
        held.delete(client);
        continue;
      }
      if (mine) continue;
      const out = [...held.values()].reduce((sum, lease) => sum + lease.permits!, 0);
      const result = await locks.acquire(name, { limit: 4, permits });
      assert.equal(result.acquired, out + permits <= 4, `${permits} with ${out} of 4 out`);
      if (result.acquired) {
        assert.ok(result.lease.fence > lastFence);
        lastFence = result.lease.fence;
        held.set(client, result.lease);
      }
      const info = await locks.inspect(name);
      assert.equal(info.held ? info.permits : 0, out + (result.acquired ? permits : 0));
    }
    for (const lease of held.values()) await locks.release(lease);
  };
  const op = fc.record({
    client: fc.integer({ min: 0, max: 4 }),
    permits: fc.integer({ min: 1, max: 4 }),
    release: fc.boolean(),
  });
  await fc.assert(fc.asyncProperty(fc.array(op, { maxLength: 30 }), run), {
    numRuns: Number(Deno.env.get("MODEL_RUNS") ?? 40),
  });
});

// The same backend through the service.
const http = shared(async () => {
  const { backend } = await fixture();
  const secret = "primitives-secret-0123456789";
  const app = createApp({
    redis: backend.redis,
    apiKeys: [{ tenant: "t", secret }],
    log: () => {},
  });
  const fetch = (input: RequestInfo | URL, init?: RequestInit) =>
    Promise.resolve(app.fetch(new Request(input, init)));
  const client = createClient({ baseUrl: "http://edgelock.test", apiKey: secret, fetch });
  const post = async (path: string, body: unknown) => {
    const response = await fetch(`http://edgelock.test${path}`, {
      method: "POST",
      headers: { authorization: `Bearer ${secret}`, "content-type": "application/json" },
      body: JSON.stringify(body),
    });
    return {
      status: response.status,
      type: response.headers.get("content-type"),
      body: await response.json(),
    };
  };
  return { secret, app, fetch, client, post };
});

Deno.test("shared, semaphore and reentrant leases, with their holdCount and mode", async () => {
  const { client } = await http();
  const name = `{${keygen("h")}}rw`;
  const [a, b] = await Promise.all([1, 2].map(() => client.acquire(name, { mode: "shared" })))
    .then((results) => results.map(acquired));
  assert.equal(a!.mode, "shared");
  assert.equal((await client.acquire(name)).acquired, false, "the writer is busy");
  const info = await client.inspect(name);
  assert.ok(info.held && info.mode === "shared" && info.holders === 2, JSON.stringify(info));
  const renewed = await client.renew(a!);
  assert.ok(renewed.renewed && renewed.lease.mode === "shared");
  assert.equal(await client.release(a!), true);
  assert.equal(await client.release(b!), true);
  const sem = keygen("h");
  const two = acquired(await client.acquire(sem, { limit: 2, permits: 2 }));
  assert.deepEqual([two.mode, two.limit, two.permits], ["semaphore", 2, 2]);
  await rejectsWith(client.acquire(sem, { limit: 3 }), "limit_mismatch");
  await rejectsWith(client.acquire(sem, { mode: "shared" }), "mode_mismatch");
  await client.release(two);
  const once = acquired(await client.acquire(sem, { reentrant: true }));
  const twice = acquired(await client.acquire(sem, { reentrant: true, token: once.token }));
  assert.deepEqual([once.holdCount, twice.holdCount], [1, 2]);
  assert.equal(await client.release(once), true);
  assert.equal(await client.release(once), true, "a retry");
  assert.ok((await client.inspect(sem)).held, "the second hold is still there");
  assert.equal(await client.release(twice), true);
  assert.equal((await client.inspect(sem)).held, false);
});

Deno.test("POST /v1/locks/acquire takes names all or none, one lease each", async () => {
  const { client, post } = await http();
  const tag = `{${keygen("h")}}`;
  const names = [`${tag}a`, `${tag}b`];
  const ran = await client.withLocks(names, { ttlMs: 300 }, async (leases) => {
    await sleep(500);
    return leases.length;
  });
  assert.equal(ran, 2, "withLocks over HTTP renews and releases");
  const got = await client.acquireAll(names, { ttlMs: 5000 });
  assert.ok(got.acquired);
  assert.deepEqual(got.leases.map((lease) => lease.name), names);
  const busy = await post("/v1/locks/acquire", { names: [`${tag}b`, `${tag}c`] });
  assert.equal(busy.status, 409);
  assert.equal(busy.body.code, "lock_busy");
  assert.equal((await client.inspect(`${tag}c`)).held, false, "nothing half-taken");
  for (const lease of got.leases) assert.equal(await client.release(lease), true);
  const apart = await client.acquireAll([keygen("x"), keygen("y")], { ttlMs: 5000 });
  assert.ok(apart.acquired, "any names: the service's Redis is one primary");
  for (const lease of apart.leases) assert.equal(await client.release(lease), true);
  await assert.rejects(client.acquireAll(["}a", "b"]), RangeError, "checked before sending");
});

Deno.test("a wrong mix is a 4xx problem with its own code, never a 5xx", async () => {
  const { client, post } = await http();
  const name = keygen("h");
  const held = acquired(await client.acquire(name, { limit: 3 }));
  const cases: [string, unknown, number, string][] = [
    [`/v1/locks/${name}/acquire`, { limit: 4 }, 409, "limit_mismatch"],
    [`/v1/locks/${name}/acquire`, { mode: "shared" }, 409, "mode_mismatch"],
    [`/v1/locks/${name}/acquire`, {}, 409, "mode_mismatch"],
    [`/v1/locks/${name}/acquire`, { limit: 3, permits: 4 }, 400, "invalid_request"],
    [`/v1/locks/${name}/acquire`, { permits: 2 }, 400, "invalid_request"],
    [`/v1/locks/${name}/acquire`, { limit: 3, mode: "shared" }, 400, "invalid_request"],
    [`/v1/locks/${name}/acquire`, { mode: "read" }, 400, "invalid_request"],
    [`/v1/locks/${name}/acquire`, { limit: 0 }, 400, "invalid_request"],
    [`/v1/locks/${name}/acquire`, { reentrant: "yes" }, 400, "invalid_request"],
    ["/v1/locks/acquire", { names: ["}a", "a:2"] }, 400, "invalid_request"],
    [`/v1/locks/}${name}/acquire`, {}, 400, "invalid_request"],
    ["/v1/locks/acquire", { names: [] }, 400, "invalid_request"],
    ["/v1/locks/acquire", { names: ["{a}1", "{a}1"] }, 400, "invalid_request"],
    ["/v1/locks/acquire", { names: ["{a}1"], limit: 2 }, 400, "invalid_request"],
    ["/v1/locks/acquire", { names: [name] }, 409, "mode_mismatch"],
  ];
  for (const [path, body, status, code] of cases) {
    const reply = await post(path, body);
    assert.equal(
      reply.status,
      status,
      `${path} ${JSON.stringify(body)}: ${JSON.stringify(reply.body)}`,
    );
    assert.equal(reply.body.code, code);
    assert.match(reply.type ?? "", /problem\+json/);
    assert.doesNotMatch(
      JSON.stringify(reply.body),
      /edgelock:lock|:holders|:released|ERR |script/i,
    );
  }
  await client.release(held);
});
