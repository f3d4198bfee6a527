// The hand-off at release: blocked waiters are granted the lock by the release itself.
import assert from "node:assert/strict";
import type { Redis } from "@upstash/redis";
import {
  type AcquireResult,
  EdgelockError,
  type Lease,
  type LockEvent,
  LockOps,
  Locks,
} from "@edgelock/edgelock";
import { startBridge } from "../bridge/mod.ts";
import { runScript } from "../src/core/_runner.ts";
import fc from "fast-check";
import { check, type Operation, withBroken } from "../dev/history.ts";
import { ACQUIRE } from "../src/core/lua/acquire.ts";
import { ACQUIRE_SHARED } from "../src/core/lua/acquire_shared.ts";
import type { Script } from "../src/core/lua/_define.ts";
import { LEAVE_QUEUE } from "../src/core/lua/leave_queue.ts";
import { HAND_OVER } from "../src/core/lua/hand_over.ts";
import { BELL_ENTRIES, MAX_TICKET_MS } from "../src/core/lua/lib.ts";
import { startShiftedRedisServer } from "../dev/clock_shift.ts";
import {
  acquired,
  keygen,
  keysOf,
  lockKeys,
  shared,
  startBackend,
  takeTicket,
  until,
} from "./_backend.ts";
import { holdAndRelease } from "./_handoff.ts";

const fixture = shared(async () => {
  const backend = await startBackend();
  // The same Redis behind a bridge that serves no blocking command: waiters must poll.
  const refusing = await startBridge({
    redisUrl: backend.server.url,
    token: backend.token,
    port: 0,
    maxBlocking: 0,
  });
  return { backend, refusing };
}, async ({ backend, refusing }) => {
  await refusing.close();
  await backend.stop();
});

// A Locks whose events are collected: `looks(name)` counts the busy looks of waiters on it.
function tracked(redis: Redis, options: ConstructorParameters<typeof Locks>[1] = {}) {
  const events: LockEvent[] = [];
  const locks = new Locks(redis, { ...options, onEvent: (event) => events.push(event) });
  return { locks, events, looks: () => events.filter((e) => e.type === "wait").length };
}

type Command = [string, ...string[]];

// The client with its `exec` (the waiters' BLPOP) replaced; `exec` sends a command for real.
function withExec(
  redis: Redis,
  replace: (command: Command, exec: (command: Command) => Promise<unknown>) => Promise<unknown>,
): Redis {
  return new Proxy(redis, {
    get(target, property, receiver) {
      if (property !== "exec") return Reflect.get(target, property, receiver);
      return (command: Command) => replace(command, (c) => target.exec(c));
    },
  });
}

// A client that counts the blocking `command`'s replies (BLPOP, XREAD): `answered` when something
// came (a hand-off, a ring), `empty` when the block ended with nothing.
function blocksOf(redis: Redis, command: "BLPOP" | "XREAD") {
  const blocks = { answered: 0, empty: 0 };
  const client = withExec(redis, async (sent, exec) => {
    const reply = await exec(sent);
    if (sent[0] === command) blocks[reply === null ? "empty" : "answered"]++;
    return reply;
  });
  return { client, blocks };
}

// The fence of the lease that holds `name`, if one does.
async function fenceOf(locks: Locks, name: string): Promise<number | undefined> {
  const info = await locks.inspect(name);
  return info.held ? info.fence : undefined;
}

const queued = (redis: Redis, name: string, count: number) =>
  until(`${count} waiting`, async () => await redis.zcard(lockKeys(name)[1]) >= count);

// A reader's look at `name` through the acquire script itself; `wakeId` '' for one that polls.
function readerLook(
  name: string,
  token: string,
  wakeId: string,
  { ttlMs = 3_000, ticketMs = 2_000, maxWaiters = 10 } = {},
) {
  const { wakeKey, ...keys } = keysOf(name);
  return ACQUIRE_SHARED.call({
    keys: { ...keys, wakeKey: wakeKey(wakeId) },
    args: {
      token,
      ttlMs,
      meta: "",
      graceMs: 60_000,
      ticketMs,
      maxWaiters,
      fresh: false,
      name,
      waitedMs: 0,
      waiting: true,
      hold: "",
      limit: 0,
      permits: 1,
      wakeId,
    },
  });
}

Deno.test("a release hands the lock to a blocked waiter, which needs no second look", async () => {
  const { backend } = await fixture();
  const { locks, looks } = tracked(backend.redis);
  const name = keygen("h");
  const holder = acquired(await locks.acquire(name, { ttlMs: 10_000 }));
  const waiting = locks.acquire(name, { ttlMs: 5_000, waitMs: 20_000, meta: { by: "waiter" } });
  await queued(backend.redis, name, 1);
  assert.equal(await locks.release(holder), true);
  const lease = acquired(await waiting);
  assert.ok(lease.fence > holder.fence, "a new, higher fence");
  assert.equal(looks(), 1, "one look, then the block that the release answered");
  const info = await locks.inspect(name);
  assert.ok(info.held);
  assert.equal(info.fence, lease.fence);
  assert.deepEqual(info.meta, { by: "waiter" }, "the waiter's meta is on its lease");
  assert.ok(lease.ttlMs <= 5_000 && lease.ttlMs > 4_000, `its own TTL: ${lease.ttlMs}`);
  assert.equal(await backend.redis.exists(lockKeys(name)[1], `${lockKeys(name)[0]}:offers`), 0);
  assert.equal(await locks.release(lease), true);
});

Deno.test("blocked waiters are handed the lock in arrival order, three requests each", async () => {
  const { backend } = await fixture();
  const { locks } = tracked(backend.redis);
  const name = keygen("h");
  const holder = acquired(await locks.acquire(name, { ttlMs: 10_000 }));
  const order: number[] = [];
  const fences: number[] = [];
  const waiters: Promise<void>[] = [];
  for (let i = 0; i < 8; i++) {
    waiters.push((async () => {
      const lease = acquired(await locks.acquire(name, { ttlMs: 10_000, waitMs: 20_000 }));
      order.push(i);
      fences.push(lease.fence);
      await locks.release(lease);
    })());
    await queued(backend.redis, name, i + 1);
  }
  const before = backend.requests();
  await locks.release(holder);
  await Promise.all(waiters);
  assert.deepEqual(order, [0, 1, 2, 3, 4, 5, 6, 7]);
  assert.deepEqual(fences, [...fences].sort((a, b) => a - b), "fences increase");
  // Each grant told its holder the next waiter's wake key, so each release handed over at once:
  // one release and the woken BLPOP's reply per grant, and the first release's second step.
  const requests = backend.requests() - before;
  assert.ok(requests <= 8 + 1 + 1, `${requests} requests for 8 hand-offs`);
});

Deno.test("with the head passed over, the grants leave arrival order (the test above catches it)", async () => {
  const { backend } = await fixture();
  const locks = new Locks(withBroken(backend.redis, "head"));
  const name = keygen("h");
  const holder = acquired(await locks.acquire(name, { ttlMs: 10_000 }));
  const waiters: Promise<{ i: number; fence: number }>[] = [];
  for (let i = 0; i < 3; i++) {
    waiters.push(
      locks.acquire(name, { ttlMs: 10_000, waitMs: 20_000 }).then(async (result) => {
        const lease = acquired(result);
        await locks.release(lease);
        return { i, fence: lease.fence };
      }),
    );
    await queued(backend.redis, name, i + 1);
  }
  await locks.release(holder);
  const grants = (await Promise.all(waiters)).sort((a, b) => a.fence - b.fence);
  assert.notEqual(grants[0]!.i, 0, "the second in line went first");
});

Deno.test("the first waiter behind a lease is handed it by any release of it, in one request", async () => {
  const { backend } = await fixture();
  const waiter = tracked(backend.redis);
  const other = new Locks(backend.redis);
  const name = keygen("h");
  // Granted with no one waiting: its grant names no next waiter.
  const holder = acquired(await other.acquire(name, { ttlMs: 10_000 }));
  const waiting = waiter.locks.acquire(name, { ttlMs: 5_000, waitMs: 20_000 });
  await queued(backend.redis, name, 1);
  const before = backend.requests();
  // Another instance, which knows only the lease: its fence names the waiter's wake key.
  assert.equal(await new Locks(backend.redis).release(holder), true);
  const lease = acquired(await waiting);
  // The BLPOP was counted when it arrived, before the release.
  assert.equal(backend.requests() - before, 1, "the release alone");
  assert.equal(waiter.looks(), 1, "the waiter never looked again");
  assert.ok(lease.fence > holder.fence);
  await waiter.locks.release(lease);
});

Deno.test("a release that does not know the head's wake key hands over in a second step", async () => {
  const { backend } = await fixture();
  const waiter = tracked(backend.redis);
  const other = new Locks(backend.redis); // releases without the hint: another instance
  const name = keygen("h");
  const holder = acquired(await other.acquire(name, { ttlMs: 10_000 }));
  // The first waiter gives up: the one after it blocks on a wake key of its own.
  const first = await other.acquire(name, { waitMs: 300 });
  assert.equal(first.acquired, false);
  const waiting = waiter.locks.acquire(name, { ttlMs: 5_000, waitMs: 20_000 });
  await queued(backend.redis, name, 1);
  const before = backend.requests();
  assert.equal(await new Locks(backend.redis).release(holder), true);
  const lease = acquired(await waiting);
  assert.equal(backend.requests() - before, 2, "the release, then the hand-over");
  assert.equal(waiter.looks(), 1, "the waiter never looked again");
  await waiter.locks.release(lease);
});

Deno.test("a lease carries who waited at its grant: another instance's release hands over in place", async () => {
  const { backend } = await fixture();
  const waiters = tracked(backend.redis);
  const name = keygen("h");
  const holder = acquired(await waiters.locks.acquire(name, { ttlMs: 10_000 }));
  assert.equal(holder.next, undefined, "no one waited at its grant");
  const first = waiters.locks.acquire(name, { ttlMs: 10_000, waitMs: 20_000 });
  await queued(backend.redis, name, 1);
  const second = waiters.locks.acquire(name, { ttlMs: 10_000, waitMs: 20_000 });
  await queued(backend.redis, name, 2);
  await waiters.locks.release(holder);
  const lease = acquired(await first);
  // Granted with the second waiting, on a wake key no other instance knows of but by the lease.
  assert.match(String(lease.next), /^w[\w-]{16}$/);
  // Stored and read back elsewhere, as a lease passed between two requests is.
  const stored = JSON.parse(JSON.stringify(lease));
  const before = backend.requests();
  assert.equal(await new Locks(backend.redis).release(stored), true);
  const last = acquired(await second);
  assert.equal(backend.requests() - before, 1, "the release alone");
  assert.equal(waiters.looks(), 2, "each waiter looked once");
  assert.equal(last.next, undefined);
  await waiters.locks.release(last);
  // A next that is not one a grant gave is refused, naming the field; nothing is released.
  const again = acquired(await waiters.locks.acquire(name, { ttlMs: 10_000 }));
  for (const next of ["", "w:1", 42, "a".repeat(65)]) {
    await assert.rejects(
      () => new Locks(backend.redis).release({ ...again, next } as never),
      (error: unknown) => error instanceof TypeError && /lease's next/.test(error.message),
    );
  }
  assert.equal((await waiters.locks.inspect(name)).held, true);
  await waiters.locks.release(again);
});

Deno.test("a lease's own next wins over what the instance kept of an earlier lease of its token", async () => {
  const { backend } = await fixture();
  const [here, there] = [new Locks(backend.redis), new Locks(backend.redis)];
  const name = keygen("h");
  const token = "reused-token-000000001";
  // The token queues through `locks`, then another waiter behind it.
  const tokenThenOther = async (locks: Locks) => {
    const mine = locks.acquire(name, { token, ttlMs: 10_000, waitMs: 20_000 });
    await queued(backend.redis, name, 1);
    const next = there.acquire(name, { ttlMs: 10_000, waitMs: 20_000 });
    await queued(backend.redis, name, 2);
    return [mine, next] as const;
  };
  const holder = acquired(await here.acquire(name, { ttlMs: 10_000 }));
  const [firstTurn, other] = await tokenThenOther(here);
  await here.release(holder);
  const first = acquired(await firstTurn);
  assert.ok(first.next, "the other waited at its grant");
  // Released elsewhere: `here` still keeps that lease's next.
  await there.release(first);
  const between = acquired(await other);
  // The token's next lease, granted through `there` with a waiter behind it.
  const [secondTurn, last] = await tokenThenOther(there);
  await there.release(between);
  const second = acquired(await secondTurn);
  assert.ok(second.next && second.next !== first.next);
  const before = backend.requests();
  assert.equal(await here.release(second), true);
  await there.release(acquired(await last));
  assert.equal(
    backend.requests() - before,
    2,
    "the release, in place, then the last one's release",
  );
});

Deno.test("a reentrant lease's release uses the newest hint its instance kept for that fence", async () => {
  const { backend } = await fixture();
  const [locks, others] = [new Locks(backend.redis), new Locks(backend.redis)];
  const name = keygen("h");
  const hold = (id: string) =>
    locks.acquire(name, {
      token: "reentrant-token-00001",
      reentrant: true,
      hold: id,
      ttlMs: 20_000,
    });
  const outer = acquired(await hold("hold-one-1"));
  // The second hold's grant names a waiter that then gives up.
  const abort = new AbortController();
  const gone = others.acquire(name, { ttlMs: 10_000, waitMs: 20_000, signal: abort.signal });
  await queued(backend.redis, name, 1);
  const second = acquired(await hold("hold-two-2"));
  abort.abort();
  await gone.catch(() => {});
  await until("it left", async () => await backend.redis.zcard(lockKeys(name)[1]) === 0);
  // The third hold's grant names the waiter that came next.
  const waiting = others.acquire(name, { ttlMs: 10_000, waitMs: 20_000 });
  await queued(backend.redis, name, 1);
  const third = acquired(await hold("hold-three"));
  assert.ok(second.next && third.next && third.next !== second.next);
  await locks.release(third);
  await locks.release(outer);
  const before = backend.requests();
  assert.equal(await locks.release(second), true, "the last hold, its next out of date");
  const next = acquired(await waiting);
  assert.equal(backend.requests() - before, 1, "handed over in place");
  await others.release(next);
});

Deno.test("renewing an earlier lease of a token renews nothing; by token alone, the current lease", async () => {
  const { backend } = await fixture();
  const locks = new Locks(backend.redis);
  const name = keygen("h");
  const token = "renewed-token-00000001";
  const holder = acquired(await locks.acquire(name, { ttlMs: 10_000 }));
  const turn = locks.acquire(name, { token, ttlMs: 10_000, waitMs: 20_000 });
  await queued(backend.redis, name, 1);
  const behind = locks.acquire(name, { ttlMs: 10_000, waitMs: 20_000 });
  await queued(backend.redis, name, 2);
  await locks.release(holder);
  const earlier = acquired(await turn);
  assert.ok(earlier.next);
  await locks.release(earlier);
  await locks.release(acquired(await behind));
  const current = acquired(await locks.acquire(name, { token, ttlMs: 10_000 }));
  assert.deepEqual(await locks.renew(earlier), { renewed: false }, "its fence is not held");
  const renewed = await locks.renew({ name, token });
  assert.ok(renewed.renewed && renewed.lease.fence === current.fence);
  assert.equal(renewed.lease.next, undefined);
  await locks.release(renewed.lease);
});

Deno.test("a release without its fence hands the first waiter over in a second step", async () => {
  const { backend } = await fixture();
  const waiter = tracked(backend.redis);
  const name = keygen("h");
  const holder = acquired(await new Locks(backend.redis).acquire(name, { ttlMs: 10_000 }));
  const waiting = waiter.locks.acquire(name, { ttlMs: 5_000, waitMs: 20_000 });
  await queued(backend.redis, name, 1);
  const before = backend.requests();
  const released = await new Locks(backend.redis).release({ name, token: holder.token });
  assert.equal(released, true);
  const lease = acquired(await waiting);
  assert.equal(backend.requests() - before, 2, "the release, then the hand-over");
  assert.equal(waiter.looks(), 1, "the waiter never looked again");
  await waiter.locks.release(lease);
});

Deno.test("a first look run twice leaves the offer on the key its waiter blocks on", async () => {
  const { backend } = await fixture();
  // The waiter's first blocking look runs again after it ran (a retry whose first request arrived
  // late, an at-least-once proxy); the waiter keeps the first run's reply.
  const acquireSha = await ACQUIRE.sha1();
  let duplicated = false;
  const blocked: string[] = [];
  const redis = new Proxy(backend.redis, {
    get(target, property, receiver) {
      if (property === "exec") {
        return (command: Command) => {
          if (command[0] === "BLPOP") blocked.push(command[1] ?? "");
          return target.exec(command);
        };
      }
      if (property !== "evalsha") return Reflect.get(target, property, receiver);
      return async (sha: string, keys: string[], args: unknown[]) => {
        const reply = await target.evalsha(sha, keys, args);
        if (sha === acquireSha && !duplicated && Array.isArray(reply) && reply[0] === 0) {
          duplicated = true;
          await target.evalsha(sha, keys, args);
        }
        return reply;
      };
    },
  });
  const holder = new Locks(backend.redis);
  const { locks, looks } = tracked(redis);
  const name = keygen("h");
  const lease = acquired(await holder.acquire(name, { ttlMs: 10_000 }));
  const waiting = locks.acquire(name, { ttlMs: 10_000, waitMs: 20_000 });
  await until("blocked", () => Promise.resolve(blocked.length === 1));
  assert.ok(duplicated);
  const { offersKey, wakeKey } = keysOf(name);
  const offers: unknown[] = await backend.redis.hvals(offersKey);
  assert.equal(offers.length, 1);
  assert.equal(wakeKey(String(offers[0]).split("|")[2]!), blocked[0], "the offer names that key");
  assert.equal(await holder.release(lease), true);
  await locks.release(acquired(await waiting));
  assert.equal(looks(), 1, "handed over on the key it blocked on, without another look");
});

Deno.test("two reentrant holds of one token waiting together are each counted once handed", async () => {
  const { backend } = await fixture();
  const blocked: string[] = [];
  const redis = withExec(backend.redis, (command, exec) => {
    if (command[0] === "BLPOP") blocked.push(command[1] ?? "");
    return exec(command);
  });
  const holder = new Locks(backend.redis);
  const locks = new Locks(redis);
  const name = keygen("h");
  const lease = acquired(await holder.acquire(name, { ttlMs: 10_000 }));
  const token = crypto.randomUUID().replaceAll("-", "");
  const hold = (ttlMs: number) =>
    locks.acquire(name, { ttlMs, waitMs: 20_000, token, reentrant: true });
  // The first hold queues behind the lease on its successor key; the second, of the same token
  // and at the head's place, on a key of its own: a hand-off carries the hold it was made for.
  const first = hold(20_000);
  await until("the first blocked", () => Promise.resolve(blocked.length === 1));
  const second = hold(5_000);
  await until("the second blocked", () => Promise.resolve(blocked.length === 2));
  assert.notEqual(blocked[0], blocked[1]);
  assert.equal(await holder.release(lease), true);
  const [a, b] = [acquired(await first), acquired(await second)];
  assert.notEqual(a.hold, b.hold);
  const info = await holder.inspect(name);
  assert.ok(info.held && a.fence === b.fence && info.fence === a.fence);
  assert.equal(Math.max(a.holdCount!, b.holdCount!), 2, "both holds counted");
  // Either hold released, the other still excludes everyone else.
  assert.equal(await locks.release(b), true);
  assert.equal((await holder.acquire(name)).acquired, false, "the first hold still holds it");
  assert.equal(await locks.release(a), true);
});

Deno.test("a lost wake-up costs one block: the waiter finds its lease at its next look", async () => {
  const { backend } = await fixture();
  // A client whose first BLPOP reply is lost: the grant was popped, the waiter hears nothing.
  let lost = 0;
  const redis = withExec(backend.redis, async (command, exec) => {
    const reply = await exec(command);
    return command[0] === "BLPOP" && reply !== null && lost++ === 0 ? null : reply;
  });
  const { locks, looks } = tracked(redis);
  const name = keygen("h");
  const holder = acquired(await locks.acquire(name, { ttlMs: 10_000 }));
  const waiting = locks.acquire(name, { ttlMs: 5_000, waitMs: 20_000 });
  await queued(backend.redis, name, 1);
  await locks.release(holder);
  const lease = acquired(await waiting);
  assert.equal(lost, 1, "the wake-up was lost");
  assert.equal(looks(), 1, "one busy look; the next look found the lease");
  assert.equal(
    await fenceOf(locks, name),
    lease.fence,
    "the lease the release granted, same fence",
  );
  assert.equal(await locks.release(lease), true);
});

Deno.test("a waiter that hears no wake-up finds its lease before its wait ends", async () => {
  const { backend } = await fixture();
  // Its BLPOP replies are withheld, so it cannot learn of the hand-off before its wait ends.
  const redis = withExec(
    backend.redis,
    () => new Promise((resolve) => setTimeout(() => resolve(null), 50)),
  );
  const locks = new Locks(redis);
  const name = keygen("h");
  const holder = acquired(await locks.acquire(name, { ttlMs: 10_000 }));
  const waiting = locks.acquire(name, { ttlMs: 5_000, waitMs: 600 });
  await queued(backend.redis, name, 1);
  await locks.release(holder); // hands over: the waiter's offer is at the head
  const lease = acquired(await waiting);
  assert.ok(lease.fence > holder.fence);
  assert.equal(await fenceOf(locks, name), lease.fence);
  assert.equal(await locks.release(lease), true);
});

Deno.test("a waiter leaving the queue finds a hand-off that beat it", async () => {
  const { backend } = await fixture();
  const redis = backend.redis;
  const locks = new Locks(redis);
  const name = keygen("h");
  const [lockKey, queueKey, ticketsKey, marksKey] = lockKeys(name);
  const offersKey = `${lockKey}:offers`;
  const wakeKey = `${lockKey}:wake:wTestWake0001`;
  const holder = acquired(await locks.acquire(name, { ttlMs: 10_000 }));
  const token = "blocked-waiter-00000001";
  const look = ACQUIRE.call({
    keys: { lockKey, queueKey, ticketsKey, marksKey, offersKey, wakeKey },
    args: {
      token,
      ttlMs: 3_000,
      meta: "",
      graceMs: 60_000,
      ticketMs: 2_000,
      maxWaiters: 10,
      fresh: false,
      name,
      waitedMs: 0,
      waiting: true,
      hold: "",
      wakeId: "wTestWake0001",
    },
  });
  const busy = await runScript(redis, ACQUIRE, look.keys, look.args) as unknown[];
  assert.equal(busy[0], 0);
  // The first waiter behind the lease blocks on the lease's successor key, which its release
  // declares: the release hands it over.
  const wakeId = `f${holder.fence}`;
  assert.equal(busy[7], wakeId);
  const handedKey = `${lockKey}:wake:${wakeId}`;
  await locks.release(holder);
  assert.equal(await redis.llen(handedKey), 2, "the grant and its receipt wait on the wake key");
  const leave = LEAVE_QUEUE.call({
    keys: {
      queueKey,
      ticketsKey,
      offersKey,
      lockKey,
      wakeKey: handedKey,
      holdersKey: `${lockKey}:holders`,
    },
    args: { member: token, outcome: "", wakeId, ticketEnd: "", seenFence: 0, hold: "" },
  });
  const reply = await runScript(redis, LEAVE_QUEUE, leave.keys, leave.args) as number[];
  assert.equal(reply[0], 2, "the leave reports the lease");
  assert.equal(reply[1], await fenceOf(locks, name));
  assert.ok(reply[2]! > 2_000 && reply[2]! <= 3_000, `with its TTL left: ${reply[2]}`);
  assert.equal(await redis.exists(handedKey, offersKey), 0, "the wake key and the offer are gone");
  assert.equal(await locks.release({ name, token }), true);
});

Deno.test("a reader leaving the queue finds the lease a ring granted it since its last look", async () => {
  const { backend } = await fixture();
  const redis = backend.redis;
  const locks = new Locks(redis);
  const name = keygen("h");
  const { lockKey, queueKey, ticketsKey, offersKey, holdersKey, readersKey, wakeKey } = keysOf(
    name,
  );
  const writer = acquired(await locks.acquire(name, { ttlMs: 10_000 }));
  const leave = (token: string, wakeId: string, seenFence: number) =>
    LEAVE_QUEUE.call({
      keys: { queueKey, ticketsKey, offersKey, lockKey, wakeKey: wakeKey(wakeId), holdersKey },
      args: { member: `${token}~s`, outcome: "", wakeId, ticketEnd: "", seenFence, hold: "" },
    });
  const run = async (call: { keys: string[]; args: (string | number)[] }, script: Script) =>
    await runScript(redis, script, call.keys, call.args) as number[];
  const [one, two] = ["reader-one-000000001", "reader-two-000000002"];
  assert.equal((await run(readerLook(name, one, "wReaderOne0001"), ACQUIRE_SHARED))[0], 0);
  assert.equal((await run(readerLook(name, two, "wReaderTwo0002"), ACQUIRE_SHARED))[0], 0);
  await locks.release(writer); // the ring grants both
  const ring = await redis.xrange(readersKey, "-", "+");
  assert.equal(Object.keys(ring).length, 1, "one ring");
  // Each look saw the writer's fence, the name's last.
  const reply = await run(leave(one, "wReaderOne0001", writer.fence), LEAVE_QUEUE);
  assert.equal(reply[0], 2, "the leave reports the lease");
  assert.ok(reply[1]! > writer.fence);
  assert.ok(reply[2]! > 2_000 && reply[2]! <= 3_000, `with its TTL left: ${reply[2]}`);
  // A lease granted before the leaver's last look (whose fence it saw) is not its grant.
  assert.equal(await run(leave(two, "wReaderTwo0002", reply[1]! + 1), LEAVE_QUEUE), 0);
  for (const token of [one, two]) {
    assert.equal(await locks.release({ name, token, mode: "shared" } as never), true);
  }
});

Deno.test("a reader that times out as a ring grants it keeps the lease, however many rings follow", async () => {
  const { backend } = await fixture();
  const redis = backend.redis;
  const locks = new Locks(redis);
  const name = keygen("h");
  const { lockKey, queueKey, ticketsKey, marksKey, offersKey, holdersKey, readersKey } = keysOf(
    name,
  );
  const writer = acquired(await locks.acquire(name, { ttlMs: 60_000 }));
  const leaveSha = await LEAVE_QUEUE.sha1();
  // A reader that polls (no offer), queued last: the ring stops at it, and every hand-over while
  // readers hold rings again (for the readers behind it, which may fit).
  const poller = readerLook(name, "poller-000000000001", "", {
    ttlMs: 1000,
    ticketMs: 20_000,
    maxWaiters: 100,
  });
  const ring = HAND_OVER.call({
    keys: {
      lockKey,
      queueKey,
      ticketsKey,
      offersKey,
      marksKey,
      holdersKey,
      readersKey,
    },
    each: [],
    args: { graceMs: 60_000, name, n: 0 },
    rest: [],
  });
  let others: Promise<AcquireResult>[] = [];
  // The leave of the reader that gives up is held back while the writer releases (its ring grants
  // every reader) and 20 more rings follow, past what the bell keeps.
  const slow = new Proxy(redis, {
    get(target, property, receiver) {
      if (property !== "evalsha") return Reflect.get(target, property, receiver);
      return async (sha: string, keys: string[], args: unknown[]) => {
        if (sha === leaveSha) {
          await locks.release(writer);
          for (let i = 0; i < 20; i++) await runScript(redis, HAND_OVER, ring.keys, ring.args);
        }
        return await target.evalsha(sha, keys, args);
      };
    },
  });
  const gaveUp = new Locks(slow).acquire(name, { mode: "shared", ttlMs: 30_000, waitMs: 400 });
  await queued(redis, name, 1);
  others = [1, 2, 3, 4].map(() =>
    locks.acquire(name, { mode: "shared", ttlMs: 30_000, waitMs: 20_000 })
  );
  await queued(redis, name, 5);
  await runScript(redis, ACQUIRE_SHARED, poller.keys, poller.args);
  const result = await gaveUp;
  assert.ok(
    result.acquired,
    `told ${JSON.stringify(result)}: ${JSON.stringify(await locks.inspect(name))}`,
  );
  assert.ok(await redis.xlen(readersKey) >= BELL_ENTRIES, "its ring is trimmed from the bell");
  for (const other of await Promise.all(others)) await locks.release(acquired(other));
  assert.equal(await locks.release(result.lease), true);
});

Deno.test("a bell key of another type costs the readers their ring, never the release", async () => {
  const { backend } = await fixture();
  const locks = new Locks(backend.redis);
  const name = keygen("h");
  const writer = acquired(await locks.acquire(name, { ttlMs: 60_000 }));
  const reader = locks.acquire(name, { mode: "shared", ttlMs: 10_000, waitMs: 20_000 });
  await queued(backend.redis, name, 1);
  await backend.redis.set(`${lockKeys(name)[0]}:readers`, "a hand edit", { px: 60_000 });
  assert.equal(await locks.release(writer), true);
  const read = acquired(await reader); // at its next look, within a block
  assert.ok(read.fence > writer.fence);
  assert.equal(await locks.release(read), true);
  assert.equal((await locks.inspect(name)).held, false);
});

// A waiter that never hears its BLPOP replies (withheld until aborted).
const deafTo = (redis: Redis) => withExec(redis, () => new Promise(() => {}));

Deno.test("a lease handed to a waiter that then aborts stays to its TTL, then goes to the next", async () => {
  const { backend } = await fixture();
  const locks = new Locks(backend.redis);
  const name = keygen("h");
  const holder = acquired(await locks.acquire(name, { ttlMs: 10_000 }));
  const controller = new AbortController();
  const aborted = new Locks(deafTo(backend.redis)).acquire(name, {
    ttlMs: 500,
    waitMs: 20_000,
    signal: controller.signal,
  });
  await queued(backend.redis, name, 1);
  const second = locks.acquire(name, { waitMs: 20_000 });
  await queued(backend.redis, name, 2);
  await locks.release(holder); // handed to the first waiter, which does not hear of it
  await until("the first waiter holds it", async () => (await locks.inspect(name)).held);
  const handed = await locks.inspect(name);
  controller.abort(new Error("the caller went away"));
  await assert.rejects(aborted, /the caller went away/);
  // Not released: a retry with the same token may have been told it holds this lease.
  assert.equal(await fenceOf(locks, name), handed.held ? handed.fence : -1);
  const lease = acquired(await second);
  assert.ok(handed.held && lease.serverTime >= handed.expiresAt, "after the handed lease ended");
  assert.equal(await fenceOf(locks, name), lease.fence, "the second waiter holds it");
  await locks.release(lease);
});

Deno.test("a waiter that aborts never frees the lease another call with its token holds", async () => {
  const { backend } = await fixture();
  const locks = new Locks(backend.redis);
  const name = keygen("h");
  const token = "one-token-two-calls-0001";
  const holder = acquired(await locks.acquire(name, { ttlMs: 1000 }));
  // Two calls with one token (a retry beside the first): the later look's offer is the one kept,
  // so the release hands the lease to the deaf call; the other finds it at its next look.
  const told = locks.acquire(name, { token, ttlMs: 10_000, waitMs: 20_000 });
  await queued(backend.redis, name, 1);
  const firstOffer = await backend.redis.hget(`${lockKeys(name)[0]}:offers`, token);
  const controller = new AbortController();
  const aborted = new Locks(deafTo(backend.redis)).acquire(name, {
    token,
    ttlMs: 10_000,
    waitMs: 20_000,
    signal: controller.signal,
  });
  await until("the deaf call's offer replaced the first call's", async () => {
    const offer = await backend.redis.hget(`${lockKeys(name)[0]}:offers`, token);
    return offer !== firstOffer;
  });
  await locks.release(holder);
  const lease = acquired(await told);
  controller.abort(new Error("the retry's caller went away"));
  await assert.rejects(aborted, /went away/);
  assert.equal(await fenceOf(locks, name), lease.fence, "the lease told to the caller still holds");
  assert.equal((await locks.acquire(name)).acquired, false, "no one else gets the name");
  await locks.release(lease);
});

Deno.test("an acquire with the same token that aborts frees nothing another was handed", async () => {
  const { backend } = await fixture();
  // The first acquire never hears its BLPOP replies; the second, with the same token, does.
  const deaf = deafTo(backend.redis);
  const locks = new Locks(backend.redis);
  const name = keygen("h");
  const token = "same-token-for-a-retry-01";
  const holder = acquired(await locks.acquire(name, { ttlMs: 10_000 }));
  const controller = new AbortController();
  const first = new Locks(deaf).acquire(name, { token, waitMs: 20_000, signal: controller.signal });
  await queued(backend.redis, name, 1);
  const second = locks.acquire(name, { token, ttlMs: 10_000, waitMs: 20_000 });
  await until("the second acquire has blocked", async () => {
    const offers = await backend.redis.hgetall(`${lockKeys(name)[0]}:offers`);
    return offers !== null && Object.keys(offers).length === 1 && backend.requests() > 0;
  });
  await new Promise((resolve) => setTimeout(resolve, 50)); // its BLPOP is at Redis
  await locks.release(holder); // handed to the latest offer: the second acquire's wake key
  const lease = acquired(await second);
  controller.abort(new Error("the first request's client went away"));
  await assert.rejects(first, /went away/);
  assert.equal(await fenceOf(locks, name), lease.fence, "the second acquire still holds it");
  assert.equal(await locks.release(lease), true);
});

Deno.test("a grant that was broken before the waiter's next look is never taken as its lease", async () => {
  const { backend } = await fixture();
  // The waiter's first block ends empty, but only once the test has handed it the lock, broken
  // that lease and let another token take the name: the grant stays on its wake key.
  let gate: () => void = () => {};
  const opened = new Promise<void>((resolve) => gate = resolve);
  let blocks = 0;
  const redis = withExec(backend.redis, async (command, exec) => {
    if (command[0] === "BLPOP" && blocks++ === 0) return await opened.then(() => null);
    return await exec(command);
  });
  const locks = new Locks(backend.redis);
  const name = keygen("h");
  const holder = acquired(await locks.acquire(name, { ttlMs: 10_000 }));
  const waiting = new Locks(redis).acquire(name, { ttlMs: 10_000, waitMs: 20_000 });
  await queued(backend.redis, name, 1);
  await locks.release(holder); // handed to the waiter, which is not listening
  const handed = await fenceOf(locks, name);
  assert.ok(handed !== undefined && handed > holder.fence);
  assert.equal((await new LockOps(backend.redis).break(name, { by: "test" })).broken, true);
  const other = acquired(await locks.acquire(name, { ttlMs: 10_000 }));
  gate(); // the waiter looks again (busy: the other holds it) and blocks again
  await until("the waiter blocks again", () => Promise.resolve(blocks >= 2));
  let settled = false;
  waiting.finally(() => settled = true);
  await new Promise((resolve) => setTimeout(resolve, 100));
  assert.equal(settled, false, "the waiter still waits while the other token holds the name");
  await locks.release(other);
  const lease = acquired(await waiting);
  assert.ok(lease.fence > other.fence, `a new lease: ${lease.fence} > ${other.fence}`);
  assert.equal(await fenceOf(locks, name), lease.fence);
  await locks.release(lease);
});

Deno.test("a release of an inner reentrant hold hands nothing over", async () => {
  const { backend } = await fixture();
  const locks = new Locks(backend.redis);
  const name = keygen("h");
  const outer = acquired(await locks.acquire(name, { ttlMs: 10_000, reentrant: true }));
  const inner = acquired(
    await locks.acquire(name, { ttlMs: 10_000, reentrant: true, token: outer.token }),
  );
  let granted = false;
  const waiting = locks.acquire(name, { waitMs: 20_000 }).then((result) => {
    granted = true;
    return result;
  });
  await queued(backend.redis, name, 1);
  assert.equal(await locks.release(inner), true);
  assert.equal(await locks.release(inner), true, "a retried inner release");
  assert.equal(await fenceOf(locks, name), outer.fence, "the outer hold still holds");
  assert.equal(granted, false);
  assert.equal(await locks.release(outer), true);
  const lease = acquired(await waiting);
  assert.ok(lease.fence > outer.fence);
  await locks.release(lease);
});

Deno.test("a retried release after the hand-off answers true and frees nothing", async () => {
  const { backend } = await fixture();
  const locks = new Locks(backend.redis);
  const name = keygen("h");
  const holder = acquired(await locks.acquire(name, { ttlMs: 10_000 }));
  const waiting = locks.acquire(name, { waitMs: 20_000 });
  await queued(backend.redis, name, 1);
  assert.equal(await locks.release(holder), true);
  const lease = acquired(await waiting);
  assert.equal(await locks.release(holder), true, "the retry answers the same");
  assert.equal(await locks.release({ name, token: holder.token }), true, "without its fence too");
  assert.equal(await fenceOf(locks, name), lease.fence, "the new holder still holds");
  await locks.release(lease);
});

Deno.test("a waiter on a slow link keeps its place: each next look arrives within its ticket", async () => {
  const { backend } = await fixture();
  const DELAY_MS = 300;
  const tickets: number[] = [];
  const blocks: number[] = [];
  const ticketAt = Object.keys(ACQUIRE.contract.args).indexOf("ticketMs");
  // Every script call arrives DELAY_MS late, so each round trip takes at least that; the BLPOPs'
  // timeouts are noted.
  const slow = new Proxy(backend.redis, {
    get(target, property, receiver) {
      if (property === "exec") {
        return (command: Command) => {
          if (command[0] === "BLPOP") blocks.push(Number(command[2]) * 1000);
          return target.exec(command);
        };
      }
      if (property !== "evalsha") return Reflect.get(target, property, receiver);
      return async (sha: string, keys: string[], args: unknown[]) => {
        await new Promise((resolve) => setTimeout(resolve, DELAY_MS));
        if (args.length > ticketAt) tickets.push(Number(args[ticketAt]));
        return await target.evalsha(sha, keys, args);
      };
    },
  });
  const holders = new Locks(backend.redis);
  const name = keygen("h");
  const holder = acquired(await holders.acquire(name, { ttlMs: 60_000 }));
  // A fresh Locks, as an edge function makes per request: no round trip measured before.
  const waiting = new Locks(slow).acquire(name, { ttlMs: 10_000, waitMs: 20_000 });
  await until("two looks", () => Promise.resolve(tickets.length >= 2 && blocks.length >= 1));
  // The next look reaches Redis two round trips after the block ends: the first block is cut
  // short for them, and the next ticket makes room for them.
  assert.ok(
    blocks[0]! + 2 * DELAY_MS <= tickets[0]! - 250,
    `a block of ${blocks[0]} ms in a ticket of ${tickets[0]} ms`,
  );
  assert.ok(tickets[1]! >= 2_000 + 250 + 2 * DELAY_MS, `a ticket of ${tickets[1]} ms`);
  assert.equal(await holders.release(holder), true);
  await holders.release(acquired(await waiting));
});

Deno.test("a waiter that times out while its leave is lost hands nothing, to itself least of all", async () => {
  const { backend } = await fixture();
  const name = keygen("h");
  const locks = new Locks(backend.redis);
  const holder = acquired(await locks.acquire(name, { ttlMs: 60_000 }));
  const leaveSha = await LEAVE_QUEUE.sha1();
  // The leave never reaches Redis, and the name frees just before it was sent (a break).
  const losing = new Proxy(backend.redis, {
    get(target, property, receiver) {
      if (property !== "evalsha") return Reflect.get(target, property, receiver);
      return async (sha: string, keys: string[], args: unknown[]) => {
        if (sha !== leaveSha) return await target.evalsha(sha, keys, args);
        await new LockOps(backend.redis).break(name, { by: "test" });
        throw new Error("the request was lost");
      };
    },
  });
  const result = await new Locks(losing).acquire(name, { ttlMs: 30_000, waitMs: 300 });
  assert.equal(result.acquired, false);
  assert.equal((await locks.inspect(name)).held, false, "no lease left to the waiter that gave up");
  const next = acquired(await locks.acquire(name, { waitMs: 3_000 }));
  assert.ok(next.fence > holder.fence);
  await locks.release(next);
});

Deno.test("a dead waiter at the head is skipped once its ticket lapsed", async () => {
  const { backend } = await fixture();
  const locks = new Locks(backend.redis);
  const name = keygen("h");
  const holder = acquired(await locks.acquire(name, { ttlMs: 10_000 }));
  await takeTicket(backend.redis, name, "vanished-waiter-0000001", 200); // never looks again
  const waiting = locks.acquire(name, { waitMs: 20_000 });
  await queued(backend.redis, name, 2);
  await until("the dead ticket lapsed", async () => {
    const [[, deadline]] = [
      await backend.redis.zrange(lockKeys(name)[2], 0, 0, {
        withScores: true,
      }),
    ] as unknown as [[string, number]];
    const [seconds] = await backend.redis.time();
    return deadline < seconds * 1000;
  });
  await locks.release(holder);
  const lease = acquired(await waiting);
  assert.equal(await fenceOf(locks, name), lease.fence);
  await locks.release(lease);
});

Deno.test("a waiter whose holder vanished takes the lock at the lease end", async () => {
  const { backend } = await fixture();
  const { locks, looks } = tracked(backend.redis);
  const name = keygen("h");
  const holder = acquired(await locks.acquire(name, { ttlMs: 400 })); // never released
  const lease = acquired(await locks.acquire(name, { waitMs: 20_000 }));
  assert.ok(lease.serverTime >= holder.expiresAt, "granted once the lease had ended");
  assert.ok(looks() <= 2, `the head blocked until the lease end, not past it (${looks()} looks)`);
  await locks.release(lease);
});

Deno.test("waiters through a bridge that refuses BLPOP poll, and are granted in order", async () => {
  const { backend, refusing } = await fixture();
  const redis = backend.client({ url: refusing.url });
  const locks = new Locks(redis);
  const name = keygen("h");
  const holder = acquired(await locks.acquire(name, { ttlMs: 10_000 }));
  const order: number[] = [];
  const waiters = [0, 1, 2].map(async (i) => {
    await until(
      `waiter ${i}'s turn to arrive`,
      async () => await redis.zcard(lockKeys(name)[1]) >= i,
    );
    const lease = acquired(await locks.acquire(name, { waitMs: 20_000 }));
    order.push(i);
    await locks.release(lease);
  });
  await queued(redis, name, 3);
  await locks.release(holder);
  await Promise.all(waiters);
  assert.deepEqual(order, [0, 1, 2]);
});

Deno.test("with blocking off, waiters poll and send no BLPOP", async () => {
  const { backend } = await fixture();
  let blpops = 0;
  const redis = withExec(backend.redis, (command, exec) => {
    if (command[0] === "BLPOP") blpops++;
    return exec(command);
  });
  const locks = new Locks(redis, { blocking: false });
  const name = keygen("h");
  const holder = acquired(await locks.acquire(name, { ttlMs: 10_000 }));
  const waiting = locks.acquire(name, { waitMs: 20_000 });
  await queued(backend.redis, name, 1);
  await locks.release(holder);
  await locks.release(acquired(await waiting));
  assert.equal(blpops, 0);
  assert.throws(
    () => new Locks(redis, { blocking: "yes" as never }),
    /blocking must be true or false/,
  );
});

Deno.test("a shared waiter is not handed the lock; an exclusive one behind readers is", async () => {
  const { backend } = await fixture();
  const locks = new Locks(backend.redis);
  const name = keygen("h");
  const readers = await Promise.all(
    [0, 1].map(async () => acquired(await locks.acquire(name, { mode: "shared", ttlMs: 10_000 }))),
  );
  const writer = locks.acquire(name, { ttlMs: 10_000, waitMs: 20_000 });
  await queued(backend.redis, name, 1);
  const reader = locks.acquire(name, { mode: "shared", waitMs: 20_000 });
  await queued(backend.redis, name, 2);
  for (const lease of readers) await locks.release(lease);
  const written = acquired(await writer);
  assert.ok(written.fence > readers[1]!.fence);
  await locks.release(written);
  const read = acquired(await reader);
  assert.equal(read.mode, "shared");
  await locks.release(read);
});

// Readers block on the readers' bell (XREAD) for their whole wait unless it rings: the writer's
// lease outlasts the wait.
const READER_WAIT_MS = 1_900;

// Five readers queue behind a writer, which then releases; their leases.
async function readersBehindWriter(locks: Locks, redis: Redis, name: string) {
  const writer = acquired(await locks.acquire(name, { ttlMs: 60_000 }));
  const readers = [0, 1, 2, 3, 4].map(() =>
    locks.acquire(name, { mode: "shared", ttlMs: 10_000, waitMs: READER_WAIT_MS })
  );
  await queued(redis, name, 5);
  assert.equal(await locks.release(writer), true);
  const leases = (await Promise.all(readers)).map(acquired);
  for (const lease of leases) assert.ok(lease.fence > writer.fence, "granted after the writer");
  return leases;
}

// \`redis\`, with \`before\` awaited ahead of each call of \`script\` (EVALSHA or EVAL, either form).
function onCalls(redis: Redis, script: Script, before: () => unknown): Redis {
  const shas = Promise.all([script.sha1(), script.keyLocked.sha1()]);
  const sources = [script.source, script.keyLocked.source];
  return new Proxy(redis, {
    get(target, property, receiver) {
      const value = Reflect.get(target, property, receiver);
      if (property !== "evalsha" && property !== "eval") return value;
      return async (first: string, keys: string[], args: unknown[]) => {
        if ((await shas).includes(first) || sources.includes(first)) await before();
        return (value as typeof target.evalsha).call(target, first, keys, args);
      };
    },
  });
}

// A client that counts the calls of \`script\`.
function callsOf(redis: Redis, script: Script) {
  let calls = 0;
  return { client: onCalls(redis, script, () => calls++), calls: () => calls };
}

Deno.test("readers behind a writer are granted in the ring of its release: one look each", async () => {
  const { backend } = await fixture();
  const { client, blocks } = blocksOf(backend.redis, "XREAD");
  const { client: counted, calls } = callsOf(client, ACQUIRE_SHARED);
  const { locks, looks } = tracked(counted);
  const name = keygen("h");
  const leases = await readersBehindWriter(locks, backend.redis, name);
  assert.deepEqual(
    blocks,
    { answered: 5, empty: 0 },
    "each reader listened once, and heard the ring",
  );
  assert.equal(looks(), 5, "one busy look each");
  assert.equal(calls(), 5, "and no look after the ring: its grant came in it");
  const fences = leases.map((lease) => lease.fence);
  assert.equal(new Set(fences).size, 5, `a fence of its own each: ${fences}`);
  for (const lease of leases) assert.equal(lease.mode, "shared");
  const info = await locks.inspect(name);
  assert.ok(info.held);
  assert.equal(info.holders, 5);
  for (const lease of leases) assert.equal(await locks.release(lease), true);
  // The bell is one entry that outlives its ring by a few seconds, not a growing log.
  const bell = `${lockKeys(name)[0]}:readers`;
  assert.equal(await backend.redis.xlen(bell), 1);
  const ttl = await backend.redis.pttl(bell);
  assert.ok(ttl > 0 && ttl <= 5_000, `the bell lives ${ttl} ms`);
});

Deno.test("a writer's release wakes each reader behind it on its own key: no ring, none behind woken", async () => {
  const { backend } = await fixture();
  const { client, blocks } = blocksOf(backend.redis, "XREAD");
  const { client: counted, calls } = callsOf(client, ACQUIRE_SHARED);
  const locks = new Locks(counted);
  const name = keygen("h");
  const bell = keysOf(name).readersKey;
  await backend.redis.scriptLoad(ACQUIRE_SHARED.source); // no NOSCRIPT retry among the looks
  const waiting = { ttlMs: 10_000, waitMs: 20_000 };
  const reading = { ...waiting, mode: "shared" as const };
  const first = acquired(await locks.acquire(name, { ttlMs: 60_000 }));
  const inLine: Promise<AcquireResult>[] = [];
  for (const options of [waiting, reading, reading, waiting, reading]) {
    inLine.push(locks.acquire(name, options));
    await queued(backend.redis, name, inLine.length);
  }
  const [writer, reader1, reader2, writer2, reader3] = inLine;
  // The first lease knew no waiter: its release hands over in a second step. The writer's grant
  // names the waiters behind it, the readers among them.
  await locks.release(first);
  const written = acquired(await writer!);
  await locks.release(written);
  const readers = [acquired(await reader1!), acquired(await reader2!)];
  assert.equal(blocks.answered, 2, "the two readers woke, each on its own key");
  assert.equal(await backend.redis.exists(bell), 0, "the bell never rang");
  for (const lease of readers) await locks.release(lease); // the last hands over to the writer
  const written2 = acquired(await writer2!);
  assert.equal(blocks.answered, 2, "the reader behind that writer slept on");
  await locks.release(written2);
  const last = acquired(await reader3!);
  assert.equal(blocks.answered, 3);
  assert.equal(await backend.redis.exists(bell), 0, "nor for the last reader");
  assert.equal(calls(), 3, "one look each");
  assert.ok(readers.every((r) => r.fence > written.fence && r.fence < written2.fence));
  assert.ok(last.fence > written2.fence);
  await locks.release(last);
});

Deno.test("a token refused on the blocking wait is config_error naming the variable, not an outage", async () => {
  const { backend } = await fixture();
  const refusing = withExec(
    backend.redis,
    (sent, exec) =>
      sent[0] === "BLPOP"
        ? Promise.reject(new Error("WRONGPASS invalid username-password pair"))
        : exec(sent),
  );
  const locks = new Locks(refusing);
  const name = keygen("h");
  const holder = acquired(await locks.acquire(name, { ttlMs: 60_000 }));
  const error = await locks.acquire(name, { waitMs: 5_000 }).then(() => undefined, (e) => e);
  assert.ok(error instanceof EdgelockError, String(error));
  assert.equal(error.code, "config_error");
  assert.match(error.message, /refused the REST token .*UPSTASH_REDIS_REST_TOKEN/);
  await locks.release(holder);
});

Deno.test("a writer's wake key of another type costs it its wake-up, never the release", async () => {
  const { backend } = await fixture();
  const redis = backend.redis;
  const locks = new Locks(redis);
  const name = keygen("h");
  const { offersKey, wakeKey } = keysOf(name);
  const holder = acquired(await locks.acquire(name, { ttlMs: 60_000 }));
  const writer = locks.acquire(name, {
    ttlMs: 30_000,
    waitMs: 20_000,
    token: "writer-0000000000001",
  });
  await queued(redis, name, 1);
  // The holder's acquire again with its token (a retry): its grant now names the writer.
  const again = acquired(await locks.acquire(name, { token: holder.token, ttlMs: 60_000 }));
  // A hand edit: the writer's wake key holds a string.
  const offer = await redis.hget<string>(offersKey, "writer-0000000000001");
  await redis.set(wakeKey(String(offer).split("|")[2]!), "a hand edit", { px: 60_000 });
  assert.equal(await locks.release(again), true, "the release went through, and says so");
  const lease = acquired(await writer);
  assert.ok(lease.fence > holder.fence);
  await locks.release(lease);
});

Deno.test("a reader's wake key of another type costs it its wake-up, never the release or exclusion", async () => {
  const { backend } = await fixture();
  const redis = backend.redis;
  const locks = new Locks(redis);
  const name = keygen("h");
  const { offersKey, wakeKey } = keysOf(name);
  const reading = { mode: "shared" as const, ttlMs: 30_000, waitMs: 20_000 };
  const first = acquired(await locks.acquire(name, { ttlMs: 60_000 }));
  const writer = locks.acquire(name, { ttlMs: 60_000, waitMs: 20_000 });
  await queued(redis, name, 1);
  const readers = [
    locks.acquire(name, { ...reading, token: "reader-one-0000000001" }),
    locks.acquire(name, { ...reading, token: "reader-two-0000000002" }),
  ];
  await queued(redis, name, 3);
  const writer2 = locks.acquire(name, { ttlMs: 30_000, waitMs: 20_000 });
  await queued(redis, name, 4);
  await locks.release(first);
  const written = acquired(await writer); // its grant names both readers
  // A hand edit: the second reader's wake key holds a string.
  const offer = await redis.hget<string>(offersKey, "reader-two-0000000002~s");
  await redis.set(wakeKey(String(offer).split("|")[2]!), "a hand edit", { px: 60_000 });
  assert.equal(await locks.release(written), true, "the release went through");
  const leases = [acquired(await readers[0]!), acquired(await readers[1]!)];
  const info = await locks.inspect(name);
  assert.ok(info.held && info.mode === "shared" && info.holders === 2, JSON.stringify(info));
  for (const lease of leases) assert.equal(await locks.release(lease), true);
  const last = acquired(await writer2); // only once both readers released
  assert.ok(leases.every((lease) => lease.fence < last.fence));
  await locks.release(last);
});

Deno.test("a reader that leaves as it is granted on its wake key keeps that lease, after a clock step back too", async () => {
  const server = await startShiftedRedisServer();
  const backend = await startBackend([], server);
  try {
    const redis = backend.redis;
    const locks = new Locks(redis);
    const name = keygen("h");
    const { lockKey, queueKey, ticketsKey, offersKey, holdersKey, wakeKey } = keysOf(name);
    const first = acquired(await locks.acquire(name, { ttlMs: 60_000 }));
    const writer = locks.acquire(name, { ttlMs: 60_000, waitMs: 20_000 });
    await queued(redis, name, 1);
    await locks.release(first);
    const handed = acquired(await writer);
    const [token, wakeId] = ["reader-clock-00000001", "wReaderClock0001"];
    const look = readerLook(name, token, wakeId, { ttlMs: 30_000, ticketMs: 5_000 });
    const busy = await runScript(redis, ACQUIRE_SHARED, look.keys, look.args) as number[];
    assert.equal(busy[0], 0);
    const seenFence = busy[9]!;
    // The writer's acquire again with its token (a retry): its grant now names the reader.
    const written = acquired(await locks.acquire(name, { token: handed.token, ttlMs: 60_000 }));
    await server.shift(-10_000); // the grant's fence is now below the look's time
    assert.equal(await locks.release(written), true);
    assert.equal(await redis.xlen(wakeKey(wakeId)), 1, "granted on its wake key");
    const leave = LEAVE_QUEUE.call({
      keys: { queueKey, ticketsKey, offersKey, lockKey, wakeKey: wakeKey(wakeId), holdersKey },
      args: {
        member: `${token}~s`,
        outcome: "timeout",
        wakeId,
        ticketEnd: "",
        seenFence,
        hold: "",
      },
    });
    const left = await runScript(redis, LEAVE_QUEUE, leave.keys, leave.args) as number[];
    assert.equal(left[0], 2, `the leave returns the lease: ${JSON.stringify(left)}`);
    assert.equal(await locks.release({ name, token, fence: left[1]! }), true);
    assert.equal((await locks.inspect(name)).held, false, "nothing left behind");
  } finally {
    await backend.stop();
  }
});

// \`redis\`, with \`before\` run once, just before the first leave of the queue is sent.
function beforeLeave(redis: Redis, before: () => Promise<void>): Redis {
  let fired = false;
  return onCalls(redis, LEAVE_QUEUE, async () => {
    if (!fired) {
      fired = true;
      await before();
    }
  });
}

Deno.test("a reader that times out as a ring grants it keeps the lease, after a clock step back too", async () => {
  const server = await startShiftedRedisServer();
  const backend = await startBackend([], server);
  try {
    const locks = new Locks(backend.redis);
    const name = keygen("h");
    // Granted with no one waiting: its grant names no waiter, so its release grants in a ring.
    const writer = acquired(await locks.acquire(name, { ttlMs: 60_000 }));
    // Between the reader's last look and its leave, the clock steps back and the writer releases:
    // the ring's fence is the writer's and one, below the server's time at the look.
    const reader = new Locks(beforeLeave(backend.redis, async () => {
      await server.shift(-10_000);
      assert.equal(await locks.release(writer), true);
    }));
    const result = await reader.acquire(name, { mode: "shared", ttlMs: 30_000, waitMs: 1_000 });
    const info = await locks.inspect(name);
    assert.ok(result.acquired, `told busy, while the name is ${JSON.stringify(info)}`);
    assert.ok(info.held && info.fence === result.lease.fence);
    assert.equal(await locks.release(result.lease), true);
    assert.equal((await locks.inspect(name)).held, false, "nothing left behind");
  } finally {
    await backend.stop();
  }
});

Deno.test("a reentrant reader that times out never takes the lease another hold of its token was granted", async () => {
  const { backend } = await fixture();
  const locks = new Locks(backend.redis);
  const name = keygen("h");
  const token = "two-holds-reader-0001";
  const writer = acquired(await locks.acquire(name, { ttlMs: 60_000 }));
  // Hold one gives up; before its leave, the writer releases and the ring grants the token's
  // place, whose offer is hold two's (its look came last).
  const one = new Locks(beforeLeave(backend.redis, async () => {
    assert.equal(await locks.release(writer), true);
  })).acquire(name, { mode: "shared", token, reentrant: true, hold: "holdOne0", waitMs: 800 });
  await queued(backend.redis, name, 1);
  const two = locks.acquire(name, {
    mode: "shared",
    token,
    reentrant: true,
    hold: "holdTwo0",
    ttlMs: 30_000,
    waitMs: 20_000,
  });
  const [first, second] = await Promise.all([one, two]);
  const granted = acquired(second);
  assert.equal(granted.hold, "holdTwo0");
  assert.equal(first.acquired, false, "hold one was never counted: it is not told it holds");
  // Hold two's release ends the lease: a writer may take the name, and no reader believes it holds.
  assert.equal(await locks.release(granted), true);
  const next = acquired(await locks.acquire(name, { ttlMs: 5_000 }));
  assert.equal(await locks.release(next), true);
});

Deno.test("a reader behind a queued writer hears a ring not meant for it and listens on", async () => {
  const { backend } = await fixture();
  const { client, blocks } = blocksOf(backend.redis, "XREAD");
  const { client: counted, calls } = callsOf(client, ACQUIRE_SHARED);
  const locks = new Locks(counted);
  const name = keygen("h");
  const first = acquired(await locks.acquire(name, { ttlMs: 60_000 }));
  const ahead = locks.acquire(name, { mode: "shared", ttlMs: 10_000, waitMs: 20_000 });
  await queued(backend.redis, name, 1);
  const writer = locks.acquire(name, { ttlMs: 10_000, waitMs: 20_000 });
  await queued(backend.redis, name, 2);
  const behind = locks.acquire(name, { mode: "shared", ttlMs: 10_000, waitMs: 20_000 });
  await queued(backend.redis, name, 3);
  await locks.release(first); // the ring grants the reader ahead only
  const read = acquired(await ahead);
  await until("the reader behind heard the ring", () => Promise.resolve(blocks.answered === 2));
  assert.equal(calls(), 2, "one look each: the reader behind did not look again");
  await locks.release(read); // hands the lock to the writer
  const written = acquired(await writer);
  await locks.release(written); // the ring grants the reader behind
  const last = acquired(await behind);
  assert.ok(last.fence > written.fence && written.fence > read.fence);
  assert.equal(calls(), 2, "and it was granted in the ring, still without a look");
  await locks.release(last);
});

Deno.test("with the bell removed, readers sleep through the release (the test above catches it)", async () => {
  const { backend } = await fixture();
  const { client, blocks } = blocksOf(withBroken(backend.redis, "bell"), "XREAD");
  const locks = new Locks(client);
  const leases = await readersBehindWriter(locks, backend.redis, keygen("h"));
  // Each takes the lock only at its wait's last look.
  assert.deepEqual(blocks, { answered: 0, empty: 5 });
  for (const lease of leases) await locks.release(lease);
});

Deno.test("the bell rings for readers only when they fit: after the writer ahead of them", async () => {
  const { backend } = await fixture();
  const locks = new Locks(backend.redis);
  const name = keygen("h");
  const first = acquired(await locks.acquire(name, { ttlMs: 60_000 }));
  const second = locks.acquire(name, { ttlMs: 60_000, waitMs: 20_000 });
  await queued(backend.redis, name, 1);
  const reader = locks.acquire(name, { mode: "shared", waitMs: READER_WAIT_MS });
  await queued(backend.redis, name, 2);
  await locks.release(first);
  const written = acquired(await second); // handed over; the reader still waits
  const bell = `${lockKeys(name)[0]}:readers`;
  assert.equal(await backend.redis.exists(bell), 0, "no ring while a writer is ahead");
  assert.equal(await locks.release(written), true);
  const read = acquired(await reader);
  assert.ok(read.fence > written.fence);
  await locks.release(read);
});

Deno.test("readers behind a writer that gives up are rung at once, not after their block", async () => {
  const { backend } = await fixture();
  const { client, blocks } = blocksOf(backend.redis, "XREAD");
  const locks = new Locks(client);
  const name = keygen("h");
  const holder = acquired(await locks.acquire(name, { mode: "shared", ttlMs: 60_000 }));
  const writer = locks.acquire(name, { ttlMs: 60_000, waitMs: 300 });
  await queued(backend.redis, name, 1);
  const reader = locks.acquire(name, { mode: "shared", ttlMs: 10_000, waitMs: READER_WAIT_MS });
  await queued(backend.redis, name, 2);
  assert.equal((await writer).acquired, false, "the writer gave up");
  const read = acquired(await reader);
  assert.deepEqual(blocks, { answered: 1, empty: 0 }, "the writer's leave rang the bell");
  for (const lease of [holder, read]) assert.equal(await locks.release(lease), true);
});

Deno.test("readers through a bridge that refuses XREAD BLOCK poll, and are granted", async () => {
  const { backend, refusing } = await fixture();
  const redis = backend.client({ url: refusing.url });
  const locks = new Locks(redis);
  const name = keygen("h");
  const writer = acquired(await locks.acquire(name, { ttlMs: 60_000 }));
  const readers = [0, 1].map(() => locks.acquire(name, { mode: "shared", waitMs: 20_000 }));
  await queued(redis, name, 2);
  await locks.release(writer);
  for (const lease of (await Promise.all(readers)).map(acquired)) await locks.release(lease);
});

Deno.test("the offers and wake keys carry TTLs and are gone after the wait", async () => {
  const { backend } = await fixture();
  const redis = backend.redis;
  const locks = new Locks(redis);
  const name = keygen("h");
  const [lockKey] = lockKeys(name);
  const holder = acquired(await locks.acquire(name, { ttlMs: 10_000 }));
  const waiting = locks.acquire(name, { waitMs: 20_000 });
  await queued(redis, name, 1);
  // The queue's keys outlive the ticket, and no ticket can live past MAX_TICKET_MS.
  const [seconds, micros] = (await redis.time()).map(Number) as [number, number];
  const deadline = Number(
    (await redis.zrange(`${lockKey}:tickets`, 0, 0, { withScores: true }))[1],
  );
  const ticketMs = deadline - (seconds * 1000 + Math.floor(micros / 1000));
  for (const key of ["offers", "queue", "tickets"]) {
    const ttl = await redis.pttl(`${lockKey}:${key}`);
    assert.ok(
      ttl >= ticketMs && ttl <= MAX_TICKET_MS,
      `${key} lives ${ttl} ms; ticket ${ticketMs}`,
    );
  }
  await locks.release(holder);
  await locks.release(acquired(await waiting));
  const left = await redis.keys(`${lockKey}:*`);
  assert.deepEqual(left.filter((key) => /:(offers|queue|tickets)/.test(key)), []);
  // The hand-off's receipt stays on the wake key, no longer than that lease's TTL.
  for (const key of left.filter((key) => key.includes(":wake:"))) {
    const ttl = await redis.pttl(key);
    assert.ok(ttl > 0 && ttl <= 10_000, `${key} lives ${ttl} ms`);
  }
});

Deno.test("semaphore waiters are handed permits in arrival order, without a second look", async () => {
  const { backend } = await fixture();
  const { locks, looks } = tracked(backend.redis);
  const name = keygen("h");
  const sem = { limit: 2, permits: 1, ttlMs: 10_000 };
  const holders = [
    acquired(await locks.acquire(name, sem)),
    acquired(await locks.acquire(name, sem)),
  ];
  const order: { i: number; fence: number }[] = [];
  const waiters: Promise<void>[] = [];
  for (let i = 0; i < 4; i++) {
    waiters.push((async () => {
      const lease = acquired(await locks.acquire(name, { ...sem, waitMs: 20_000 }));
      assert.equal(lease.mode, "semaphore");
      assert.equal(lease.permits, 1);
      order.push({ i, fence: lease.fence });
      await locks.release(lease);
    })());
    await queued(backend.redis, name, i + 1);
  }
  for (const lease of holders) await locks.release(lease);
  await Promise.all(waiters);
  // Two holders' releases may race, and their waiters wake in either order; the grants, by fence,
  // go in arrival order.
  assert.deepEqual(order.sort((a, b) => a.fence - b.fence).map(({ i }) => i), [0, 1, 2, 3]);
  assert.equal(looks(), 4, "each waiter looked once, then was handed its permits");
});

Deno.test("two holders releasing at once hand a semaphore's permits to two waiters", async () => {
  const { backend } = await fixture();
  const { client, blocks } = blocksOf(backend.redis, "BLPOP");
  const locks = new Locks(client);
  const name = keygen("h");
  const sem = { limit: 2, permits: 1, ttlMs: 60_000 };
  // Both acquired before anyone queued: their releases know no head, and both name the first.
  const holders = [
    acquired(await locks.acquire(name, sem)),
    acquired(await locks.acquire(name, sem)),
  ];
  const waiters = [0, 1].map(() => locks.acquire(name, { ...sem, waitMs: 20_000 }));
  await queued(backend.redis, name, 2);
  await Promise.all(holders.map((lease) => locks.release(lease)));
  const leases = (await Promise.all(waiters)).map(acquired);
  assert.deepEqual(
    blocks,
    { answered: 2, empty: 0 },
    "both handed their permits, none left waiting",
  );
  for (const lease of leases) await locks.release(lease);
});

// A client that counts hand-overs in a second request (`steps`), after a release that could not
// name the head's wake key.
async function countingSteps(redis: Redis) {
  const handOverSha = await HAND_OVER.sha1();
  const counter = { steps: 0, client: redis };
  counter.client = new Proxy(redis, {
    get(target, property, receiver) {
      if (property !== "evalsha") return Reflect.get(target, property, receiver);
      return (sha: string, keys: string[], args: unknown[]) => {
        if (sha === handOverSha) counter.steps++;
        return target.evalsha(sha, keys, args);
      };
    },
  });
  return counter;
}

Deno.test("two waiters behind a lease granted with none waiting: each release hands over in place", async () => {
  const { backend } = await fixture();
  const counter = await countingSteps(backend.redis);
  const { locks, looks } = tracked(counter.client);
  const name = keygen("h");
  const holder = acquired(await locks.acquire(name, { ttlMs: 10_000 }));
  const first = locks.acquire(name, { ttlMs: 10_000, waitMs: 20_000 });
  await queued(backend.redis, name, 1);
  const second = locks.acquire(name, { ttlMs: 10_000, waitMs: 20_000 });
  await queued(backend.redis, name, 2);
  // The first blocks on the holder's successor key, the second on its own: one key, one waiter.
  const { lockKey, offersKey } = keysOf(name);
  const offers: unknown[] = await backend.redis.hvals(offersKey);
  const wakes = offers.map((offer) => String(offer).split("|")[2]);
  assert.equal(wakes.filter((id) => id === `f${holder.fence}`).length, 1, wakes.join());
  await locks.release(holder);
  const lease = acquired(await first);
  // Granted with the second waiting: its grant names the second's key.
  await locks.release(lease);
  await locks.release(acquired(await second));
  assert.equal(counter.steps, 0, "no release needed a second step");
  assert.equal(looks(), 2, "each waiter looked once");
  assert.equal((await backend.redis.keys(`${lockKey}:wake:f*`)).length, 1, "the successor key");
});

Deno.test("the first semaphore waiter is handed its permits by the latest holder's release", async () => {
  const { backend } = await fixture();
  const counter = await countingSteps(backend.redis);
  const { locks, looks } = tracked(counter.client);
  const name = keygen("h");
  const sem = { limit: 2, permits: 1, ttlMs: 60_000 };
  const earlier = acquired(await locks.acquire(name, sem));
  const latest = acquired(await locks.acquire(name, sem));
  const waiting = locks.acquire(name, { ...sem, waitMs: 20_000 });
  await queued(backend.redis, name, 1);
  const before = backend.requests();
  await new Locks(backend.redis).release(latest); // another instance: only the lease
  const lease = acquired(await waiting);
  assert.equal(backend.requests() - before, 1, "the release alone");
  assert.equal(counter.steps, 0);
  assert.equal(looks(), 1);
  assert.ok(lease.fence > latest.fence);
  await locks.release(earlier);
  await locks.release(lease);
});

Deno.test("a semaphore holder's release hands over in place to whichever next waiter is the head", async () => {
  const { backend } = await fixture();
  const counter = await countingSteps(backend.redis);
  const locks = new Locks(counter.client);
  const name = keygen("h");
  const sem = { limit: 2, permits: 1, ttlMs: 60_000 };
  const holders = [
    acquired(await locks.acquire(name, sem)),
    acquired(await locks.acquire(name, sem)),
  ];
  const waiters: Promise<AcquireResult>[] = [];
  for (let i = 0; i < 4; i++) {
    waiters.push(locks.acquire(name, { ...sem, waitMs: 20_000 }));
    await queued(backend.redis, name, i + 1);
  }
  // The first holders knew no waiter when granted: their releases hand over in a second step.
  for (const lease of holders) await locks.release(lease);
  const [first, second] = [acquired(await waiters[0]!), acquired(await waiters[1]!)];
  assert.ok(counter.steps > 0);
  counter.steps = 0;
  // Each grant named the waiters then first in line, so each release finds the head among them:
  // the first's release, made while the second holds, grants the third waiter, not the second.
  await locks.release(first);
  const third = acquired(await waiters[2]!);
  await locks.release(second);
  const fourth = acquired(await waiters[3]!);
  assert.equal(counter.steps, 0, "both handed over by the release itself");
  assert.ok(first.fence < second.fence && second.fence < third.fence && third.fence < fourth.fence);
  for (const lease of [third, fourth]) await locks.release(lease);
});

Deno.test("a release that frees two permits hands them to the two waiters they fit", async () => {
  const { backend } = await fixture();
  const { client, blocks } = blocksOf(backend.redis, "BLPOP");
  const locks = new Locks(client);
  const name = keygen("h");
  const holder = acquired(await locks.acquire(name, { limit: 2, permits: 2, ttlMs: 60_000 }));
  const sem = { limit: 2, permits: 1, ttlMs: 60_000, waitMs: 20_000 };
  const first = locks.acquire(name, sem);
  await queued(backend.redis, name, 1);
  const second = locks.acquire(name, sem);
  await queued(backend.redis, name, 2);
  await locks.release(holder);
  const leases = [acquired(await first), acquired(await second)];
  assert.ok(leases[1]!.fence > leases[0]!.fence, "in arrival order");
  assert.deepEqual(blocks, { answered: 2, empty: 0 }, "the second too was handed its permit");
  for (const lease of leases) await locks.release(lease);
});

Deno.test("a semaphore waiter is handed permits only once enough are free", async () => {
  const { backend } = await fixture();
  const locks = new Locks(backend.redis);
  const name = keygen("h");
  const one = acquired(await locks.acquire(name, { limit: 3, permits: 1, ttlMs: 10_000 }));
  const two = acquired(await locks.acquire(name, { limit: 3, permits: 2, ttlMs: 10_000 }));
  let granted = false;
  const waiting = locks.acquire(name, { limit: 3, permits: 2, waitMs: 20_000 }).then((r) => {
    granted = true;
    return r;
  });
  await queued(backend.redis, name, 1);
  await locks.release(one); // 1 permit free: the head needs 2
  await new Promise((resolve) => setTimeout(resolve, 100));
  assert.equal(granted, false, "not handed permits that do not fit");
  await locks.release(two);
  const lease = acquired(await waiting);
  assert.equal(lease.permits, 2);
  const info = await locks.inspect(name);
  assert.ok(info.held && info.permits === 2, "the holder's 2 permits, no more");
  await locks.release(lease);
});

Deno.test("with the permits check removed, a release hands over permits that do not fit", async () => {
  const { backend } = await fixture();
  // The broken variant of the torture run (`--broken permits`), caught here for certain.
  const locks = new Locks(withBroken(backend.redis, "permits"));
  const name = keygen("h");
  const one = acquired(await locks.acquire(name, { limit: 3, permits: 1, ttlMs: 10_000 }));
  const two = acquired(await locks.acquire(name, { limit: 3, permits: 2, ttlMs: 10_000 }));
  const waiting = locks.acquire(name, { limit: 3, permits: 2, waitMs: 20_000 });
  await queued(backend.redis, name, 1);
  await locks.release(one); // 1 permit free; the broken hand-off gives the head its 2
  const lease = acquired(await waiting);
  const info = await locks.inspect(name);
  assert.ok(info.held && info.permits === 4, `4 of 3 permits held: ${JSON.stringify(info)}`);
  await locks.release(lease);
  await locks.release(two);
});

Deno.test("a token that holds a semaphore's permits is not handed more by a release", async () => {
  const { backend } = await fixture();
  const locks = new Locks(backend.redis);
  const name = keygen("h");
  const token = "holds-and-waits-again-01";
  const two = acquired(await locks.acquire(name, { limit: 3, permits: 2, ttlMs: 10_000 }));
  const one = acquired(await locks.acquire(name, { limit: 3, permits: 1, ttlMs: 10_000 }));
  const first = locks.acquire(name, { token, limit: 3, permits: 1, waitMs: 20_000 });
  await queued(backend.redis, name, 1);
  const more = locks.acquire(name, { token, limit: 3, permits: 2, waitMs: 20_000 })
    .then(() => "granted", (error) => (error as { code?: string }).code);
  await until("the second call's look", async () => {
    const offer = await backend.redis.hget(`${lockKeys(name)[0]}:offers`, `${token}~2`);
    return offer !== null;
  });
  await locks.release(two); // the head (token, 1 permit) fits
  const held = acquired(await first);
  await locks.release(one); // 2 permits free, but the next head's token holds already
  assert.equal(await more, "permits_mismatch", "its own look decides: other permits");
  const info = await locks.inspect(name);
  assert.ok(info.held && info.permits === 1, `only the token's 1 permit: ${JSON.stringify(info)}`);
  assert.equal(await locks.release(held), true);
});

// Starts `count` waiters on `first`'s name in a known order (each queues before the next comes),
// then releases `first` through `locks` and waits for every waiter.
async function inArrivalOrder(
  redis: Redis,
  locks: Locks,
  first: Lease,
  count: number,
  start: (i: number) => Promise<void>,
): Promise<void> {
  const started: Promise<void>[] = [];
  for (let i = 0; i < count; i++) {
    started.push(start(i));
    await queued(redis, first.name, i + 1);
  }
  await locks.release(first);
  await Promise.all(started);
}

// Random queues of writers and readers (and a semaphore-free name), most waiters blocking, some
// polling, some releasing through another Locks (which knows no hint: its release names no wake
// key): the history checker finds no overlap and no fence out of order, and grants keep arrival
// order (a waiter is never granted before an earlier arrival it conflicts with).
Deno.test("random queues of readers and writers: exclusion, fences and arrival order hold", async () => {
  const { backend } = await fixture();
  const runs = Number(Deno.env.get("HANDOFF_RUNS") ?? 15);
  await fc.assert(
    fc.asyncProperty(
      fc.array(
        fc.record({
          shared: fc.boolean(),
          holdMs: fc.integer({ min: 0, max: 15 }),
          polls: fc.integer({ min: 0, max: 4 }).map((n) => n === 0),
          elsewhere: fc.boolean(),
        }),
        { minLength: 2, maxLength: 9 },
      ),
      async (waiters) => {
        const locks = new Locks(backend.redis);
        const polling = new Locks(backend.redis, { blocking: false });
        const other = new Locks(backend.redis);
        const name = keygen("rq");
        const history: Operation[] = [];
        const grants: number[] = []; // arrival indexes, in grant order
        const first = acquired(await locks.acquire(name, { ttlMs: 30_000 }));
        const wait = async (
          { shared, holdMs, polls, elsewhere }: (typeof waiters)[number],
          i: number,
        ) => {
          const invokedAt = Date.now();
          const result = await (polls ? polling : locks).acquire(name, {
            ttlMs: 30_000,
            waitMs: 20_000,
            ...(shared && { mode: "shared" as const }),
          });
          const lease = acquired(result);
          grants.push(i);
          const kind = shared ? { mode: "shared" as const } : {};
          const releaser = elsewhere ? other : polls ? polling : locks;
          await holdAndRelease(history, `c${i}`, [lease], invokedAt, kind, holdMs, releaser);
        };
        await inArrivalOrder(
          backend.redis,
          locks,
          first,
          waiters.length,
          (i) => wait(waiters[i]!, i),
        );
        assert.deepEqual(check(history), []);
        // A waiter is granted after every earlier arrival it conflicts with (a writer with anyone,
        // a reader with a writer).
        for (const [at, i] of grants.entries()) {
          for (const j of grants.slice(at + 1)) {
            const conflict = !waiters[i]!.shared || !waiters[j]!.shared;
            assert.ok(!(conflict && j < i), `waiter ${i} granted before ${j}: ${grants}`);
          }
        }
      },
    ),
    { numRuns: runs },
  );
});

// Random queues of a semaphore's waiters, each blocking behind a holder of every permit, taking
// 1 to `limit` permits and some releasing through another Locks (no hints): the history checker
// finds no more permits held than the limit and no fence out of order, and the permits go in
// arrival order (a waiter that does not fit stops those behind it).
Deno.test("random queues of a semaphore's waiters: the limit, fences and arrival order hold", async () => {
  const { backend } = await fixture();
  const runs = Number(Deno.env.get("HANDOFF_RUNS") ?? 15);
  await fc.assert(
    fc.asyncProperty(
      fc.integer({ min: 2, max: 5 }).chain((limit) =>
        fc.record({
          limit: fc.constant(limit),
          waiters: fc.array(
            fc.record({
              permits: fc.integer({ min: 1, max: limit }),
              holdMs: fc.integer({ min: 0, max: 15 }),
              elsewhere: fc.boolean(),
            }),
            { minLength: 2, maxLength: 9 },
          ),
        })
      ),
      async ({ limit, waiters }) => {
        const locks = new Locks(backend.redis);
        const other = new Locks(backend.redis);
        const name = keygen("sq");
        const history: Operation[] = [];
        const fences: number[] = []; // by arrival
        const first = acquired(await locks.acquire(name, { limit, permits: limit, ttlMs: 30_000 }));
        const wait = async (
          { permits, holdMs, elsewhere }: (typeof waiters)[number],
          i: number,
        ) => {
          const invokedAt = Date.now();
          const lease = acquired(
            await locks.acquire(name, { limit, permits, ttlMs: 30_000, waitMs: 20_000 }),
          );
          fences[i] = lease.fence;
          const kind = { mode: "semaphore" as const, limit, permits };
          await holdAndRelease(
            history,
            `c${i}`,
            [lease],
            invokedAt,
            kind,
            holdMs,
            elsewhere ? other : locks,
          );
        };
        await inArrivalOrder(
          backend.redis,
          locks,
          first,
          waiters.length,
          (i) => wait(waiters[i]!, i),
        );
        assert.deepEqual(check(history), []);
        assert.deepEqual([...fences].sort((a, b) => a - b), fences, "granted in arrival order");
      },
    ),
    { numRuns: runs },
  );
});
