import assert from "node:assert/strict";
import { Locks } from "@edgelock/edgelock";
import { createApp } from "../src/service/mod.ts";
import { parseApiKeys } from "../src/service/auth.ts";
import { LEAVE_QUEUE } from "../src/core/lua/leave_queue.ts";
import { ACQUIRE_ALL } from "../src/core/lua/acquire_all.ts";
import { FENCE_GRACE_MS } from "../src/core/_validate.ts";
import { runScript } from "../src/core/_runner.ts";
import {
  acquired,
  keygen,
  keysOf,
  lockKeys,
  shared,
  startBackend,
  takeSharedTicket,
  takeTicket,
  ticketCall,
  until,
} from "./_backend.ts";
import { ACQUIRE } from "../src/core/lua/acquire.ts";

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

const keys = (name: string) => lockKeys(name);

const fixture = shared(async () => {
  const backend = await startBackend();
  const { redis } = backend;
  const locks = new Locks(redis);
  const ticket = (name: string, token: string, ticketMs: number) =>
    takeTicket(redis, name, token, ticketMs);
  return { backend, redis, locks, ticket };
}, ({ backend }) => backend.stop());

Deno.test("waiters are granted the lock in the order they arrived", async () => {
  const { redis, locks } = await fixture();
  const name = keygen("q");
  const holder = await locks.acquire(name, { ttlMs: 10_000 });
  assert.ok(holder.acquired);
  const granted: number[] = [];
  const waiters: Promise<void>[] = [];
  for (let i = 0; i < 10; i++) {
    waiters.push((async () => {
      const result = await locks.acquire(name, { ttlMs: 10_000, waitMs: 20_000 });
      assert.ok(result.acquired);
      granted.push(i);
      await sleep(10);
      await locks.release(result.lease);
    })());
    // A known arrival order: the next waiter starts once this one holds its ticket.
    await until(`waiter ${i} is queued`, async () => await redis.zcard(keys(name)[1]!) > i);
  }
  await locks.release(holder.lease);
  await Promise.all(waiters);
  assert.deepEqual(granted, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
  assert.equal(await redis.zcard(keys(name)[1]!), 0, "the queue is empty afterwards");
});

Deno.test("a free lock is kept for the head of the queue; others cannot cut in", async () => {
  const { locks, ticket } = await fixture();
  const name = keygen("q");
  const holder = await locks.acquire(name, { ttlMs: 10_000 });
  assert.ok(holder.acquired);
  const head = "queue-head-token-000001";
  await ticket(name, head, 5000);
  await locks.release(holder.lease);
  const cutIn = await locks.acquire(name);
  assert.equal(cutIn.acquired, false, "a caller that did not queue waits its turn");
  const mine = await locks.acquire(name, { token: head });
  assert.ok(mine.acquired, "the head takes the lock");
});

Deno.test("a waiter that gives up leaves the queue, and the next one is not stranded", async () => {
  const { redis, locks } = await fixture();
  const name = keygen("q");
  const holder = await locks.acquire(name, { ttlMs: 10_000 });
  assert.ok(holder.acquired);
  const quitter = locks.acquire(name, { waitMs: 150, token: "gives-up-token-0000001" });
  await until(
    "the quitter is queued",
    async () => await redis.zscore(keys(name)[1]!, "gives-up-token-0000001") !== null,
  );
  const patient = locks.acquire(name, { waitMs: 10_000 });
  assert.equal((await quitter).acquired, false);
  assert.equal(await redis.zscore(keys(name)[1]!, "gives-up-token-0000001"), null);
  const controller = new AbortController();
  const aborted = locks.acquire(name, {
    waitMs: 10_000,
    token: "aborts-token-000000001",
    signal: controller.signal,
  });
  await until(
    "the aborting waiter is queued",
    async () => await redis.zscore(keys(name)[1]!, "aborts-token-000000001") !== null,
  );
  controller.abort(new Error("gave up"));
  await assert.rejects(aborted, /gave up/);
  assert.equal(await redis.zscore(keys(name)[1]!, "aborts-token-000000001"), null);
  await locks.release(holder.lease);
  const result = await patient;
  assert.ok(result.acquired, "the patient waiter got the lock");
});

Deno.test("a crashed head's ticket lapses and the lock passes to the next waiter", async () => {
  const { redis, locks, ticket } = await fixture();
  const name = keygen("q");
  const holder = await locks.acquire(name, { ttlMs: 10_000 });
  assert.ok(holder.acquired);
  await ticket(name, "crashed-head-token-0001", 300); // never looks again
  const next = locks.acquire(name, { waitMs: 10_000 });
  await sleep(20);
  await locks.release(holder.lease);
  const result = await next;
  assert.ok(result.acquired && result.lease.fence > holder.lease.fence);
  assert.equal(await redis.zscore(keys(name)[1]!, "crashed-head-token-0001"), null);
});

Deno.test("crashed waiters anywhere in the queue are dropped: a new waiter counts only live ones", async () => {
  const { redis, locks, ticket } = await fixture();
  const name = keygen("q");
  const holder = await locks.acquire(name, { ttlMs: 10_000 });
  assert.ok(holder.acquired);
  await ticket(name, "live-head-token-0000001", 10_000);
  for (let i = 0; i < 120; i++) {
    await ticket(name, `crashed-waiter-${String(i).padStart(8, "0")}`, 1500);
  }
  // All queued at once (1.5 s tickets outlast the inserts, also on a loaded machine).
  assert.equal(await redis.zcard(keys(name)[1]!), 121);
  // Each look of the head drops whatever lapsed; wait until the crashed ones have.
  await until("the crashed tickets lapse", async () => {
    await ticket(name, "live-head-token-0000001", 10_000);
    return await redis.zcard(keys(name)[1]!) === 1;
  });
  const reply = await ticket(name, "new-waiter-token-000001", 1000);
  assert.equal(reply[3], 1, "the new waiter is second, behind the live head");
  assert.equal(await redis.zcard(keys(name)[1]!), 2, "no dead ticket is left");
  assert.equal(await redis.zcard(keys(name)[2]!), 2);
  assert.ok(reply[1]! <= 10_000);
});

Deno.test("places follow arrival whether a look read the whole queue or only its first waiters", async () => {
  const { redis, locks, ticket } = await fixture();
  const name = keygen("q");
  const holder = await locks.acquire(name, { ttlMs: 10_000 });
  assert.ok(holder.acquired);
  // A look reads the first 32 waiters: a queue shorter than that is joined from what it read.
  const token = (i: number) => `arrival-token-${String(i).padStart(8, "0")}`;
  for (let i = 0; i < 40; i++) {
    const reply = await ticket(name, token(i), 10_000);
    assert.deepEqual([reply[0], reply[3]], [0, i], `waiter ${i} is ${i}th`);
  }
  // A look again keeps the place, among the first 32 or past them.
  for (const i of [0, 3, 31, 32, 39]) assert.equal((await ticket(name, token(i), 10_000))[3], i);
  const queue = await redis.zrange<string[]>(keys(name)[1]!, 0, -1);
  assert.deepEqual(queue, Array.from({ length: 40 }, (_, i) => token(i)));
  await locks.release(holder.lease);
  // Each is granted in turn, the queue shrinking below 32; a newcomer now and then joins last.
  const waiting = queue.slice();
  for (let step = 0; waiting.length > 0; step++) {
    const next = waiting.shift()!;
    const reply = await ticket(name, next, 10_000);
    assert.equal(reply[0], 1, `${next} is granted in its turn`);
    if (step % 4 === 0) {
      const late = `late-token-${String(step).padStart(11, "0")}`;
      const joined = await ticket(name, late, 10_000);
      assert.deepEqual([joined[0], joined[3]], [0, waiting.length], "a newcomer joins last");
      waiting.push(late);
    }
    await locks.release({ name, token: next, fence: reply[1]! });
  }
  assert.equal(await redis.zcard(keys(name)[1]!), 0);
});

// Callers whose maxWaiters is below the queue's length still see all of it: who is ahead of them,
// who comes next after their grant (the record's contention flag, the grant's hint).
Deno.test("a reader granted by a caller with maxWaiters 1 leaves the writer behind it in charge", async () => {
  const { redis, locks } = await fixture();
  const name = keygen("q");
  const holder = await locks.acquire(name, { ttlMs: 10_000 });
  assert.ok(holder.acquired);
  const small = { maxWaiters: 1 };
  assert.equal((await takeSharedTicket(redis, name, "reader-small-000001", 30_000, small))[3], 0);
  assert.equal((await takeTicket(redis, name, "writer-behind-00001", 30_000))[3], 1);
  await locks.release(holder.lease);
  assert.equal((await takeSharedTicket(redis, name, "reader-small-000001", 30_000, small))[0], 1);
  // The writer still waits: a later reader comes after it, and so does a release's hand-off.
  const late = await takeSharedTicket(redis, name, "reader-later-000001", 0);
  assert.equal(late[0], 0, "a later reader is not granted past the queued writer");
  assert.match(String(await redis.get(keys(name)[0]!)), /^S\d+\|\d+\|\d+\|\d+\|1\|/);
});

Deno.test("a semaphore's caller with maxWaiters 1 leaves the waiter behind it first in line", async () => {
  const { redis } = await fixture();
  const name = keygen("q");
  const sem = { limit: 2, permits: 1 };
  const holder = await takeSharedTicket(redis, name, "holder-token-000001", 0, {
    limit: 2,
    permits: 2,
  });
  assert.equal(holder[0], 1);
  const small = { ...sem, maxWaiters: 1 };
  assert.equal((await takeSharedTicket(redis, name, "small-token-0000001", 30_000, small))[3], 0);
  const two = { limit: 2, permits: 2 };
  assert.equal((await takeSharedTicket(redis, name, "two-permits-000001", 30_000, two))[3], 1);
  const { locks } = await fixture();
  await locks.release({ name, token: "holder-token-000001", fence: holder[1] as number });
  assert.equal((await takeSharedTicket(redis, name, "small-token-0000001", 30_000, small))[0], 1);
  const late = await takeSharedTicket(redis, name, "late-token-00000001", 0, sem);
  assert.equal(late[0], 0, "the permit left is the queued waiter's, not a later caller's");
});

Deno.test("a grant names the next waiters whatever its caller's maxWaiters", async () => {
  const { redis, locks } = await fixture();
  const name = keygen("q");
  const sem = { limit: 1, permits: 1 };
  const holder = await takeSharedTicket(redis, name, "holder-token-000001", 0, sem);
  assert.equal(holder[0], 1);
  const small = { ...sem, maxWaiters: 2 };
  assert.equal((await takeSharedTicket(redis, name, "small-token-0000001", 30_000, small))[3], 0);
  for (const [i, t] of ["a", "b", "c"].entries()) {
    const look = await takeSharedTicket(redis, name, `waiter-${t}-00000001`, 30_000, {
      ...sem,
      wakeId: `${t}w`,
    });
    assert.equal(look[3], i + 1);
  }
  await locks.release({ name, token: "holder-token-000001", fence: holder[1] as number });
  const granted = await takeSharedTicket(redis, name, "small-token-0000001", 30_000, small);
  assert.deepEqual([granted[0], granted[5]], [1, "aw,bw,cw"]);
});

Deno.test("a reader that does not queue waits behind a writer past its own maxWaiters", async () => {
  const { redis, locks } = await fixture();
  const name = keygen("q");
  const holder = await locks.acquire(name, { ttlMs: 10_000 });
  assert.ok(holder.acquired);
  for (const t of ["reader-one-00000001", "reader-two-00000001"]) {
    await takeSharedTicket(redis, name, t, 30_000);
  }
  assert.equal((await takeTicket(redis, name, "writer-third-000001", 30_000))[3], 2);
  await locks.release(holder.lease);
  const late = await takeSharedTicket(redis, name, "reader-late-0000001", 0, { maxWaiters: 2 });
  assert.equal(late[0], 0, "the queued writer keeps it out");
});

Deno.test("lapsed waiters go at any caller's look: a reader behind a live one is granted", async () => {
  const { redis, locks } = await fixture();
  const name = keygen("q");
  const holder = await locks.acquire(name, { ttlMs: 10_000 });
  assert.ok(holder.acquired);
  assert.equal((await takeSharedTicket(redis, name, "reader-live-0000001", 30_000))[3], 0);
  for (const [i, t] of ["writer-gone-0000001", "writer-gone-0000002"].entries()) {
    assert.equal((await takeTicket(redis, name, t, 30_000))[3], i + 1);
  }
  await locks.release(holder.lease);
  // The writers crash: their tickets lapse.
  for (const member of ["writer-gone-0000001", "writer-gone-0000002"]) {
    await redis.zadd(keys(name)[2]!, { xx: true }, { score: 1, member });
  }
  const reader = await takeSharedTicket(redis, name, "reader-late-0000001", 0, { maxWaiters: 1 });
  assert.equal(reader[0], 1, "only a live reader is ahead of it");
  assert.deepEqual(await redis.zrange(keys(name)[1]!, 0, -1), ["reader-live-0000001~s"]);
});

Deno.test("a queue whose waiters all lapsed is not full, whatever the caller's maxWaiters", async () => {
  const { redis, locks } = await fixture();
  for (const look of ["exclusive", "shared"] as const) {
    const name = keygen("q");
    const holder = await locks.acquire(name, { ttlMs: 10_000 });
    assert.ok(holder.acquired);
    const gone = ["waiter-gone-0000001", "waiter-gone-0000002", "waiter-gone-0000003"];
    for (const token of gone) await takeTicket(redis, name, token, 30_000);
    for (const member of gone) await redis.zadd(keys(name)[2]!, { xx: true }, { score: 1, member });
    const reply = look === "exclusive"
      ? await takeTicket(redis, name, "newcomer-token-0001", 30_000, { maxWaiters: 1 })
      : await takeSharedTicket(redis, name, "newcomer-token-0001", 30_000, { maxWaiters: 1 });
    assert.deepEqual([reply[0], reply[3]], [0, 0], `${look}: first in line, not queue_full`);
    await locks.release(holder.lease);
  }
});

Deno.test("a full queue answers queue_full at once, and the waiters in it keep their places", async () => {
  const { redis, ticket } = await fixture();
  const name = keygen("q");
  const small = new Locks(redis, { maxWaiters: 3 });
  const holder = await small.acquire(name, { ttlMs: 10_000 });
  assert.ok(holder.acquired);
  for (let i = 0; i < 3; i++) await ticket(name, `waiting-token-${i}-000000`, 10_000);
  const started = performance.now();
  const full = await small.acquire(name, { waitMs: 5000 });
  assert.deepEqual(
    { acquired: full.acquired, reason: !full.acquired && full.reason },
    { acquired: false, reason: "queue_full" },
  );
  assert.ok(performance.now() - started < 2000, "it does not wait for a place");
  assert.equal(await redis.zcard(keys(name)[1]!), 3);
  assert.equal(await redis.zscore(keys(name)[1]!, "waiting-token-0-000000") !== null, true);
  const busy = await small.acquire(name);
  assert.ok(!busy.acquired && busy.reason === "busy", "a caller that does not wait is busy");
  assert.throws(() => new Locks(redis, { maxWaiters: 0 }), /maxWaiters must be/);
  assert.throws(() => new Locks(redis, { maxWaiters: 1001 }), RangeError);
});

Deno.test("busy replies estimate when to look again from recent hold times", async () => {
  const { locks } = await fixture();
  const name = keygen("q");
  let longest = 0; // the longest hold as the client saw it: the server's holds are shorter
  for (let i = 0; i < 5; i++) {
    const started = performance.now();
    const r = await locks.acquire(name);
    assert.ok(r.acquired);
    await sleep(40);
    await locks.release(r.lease);
    longest = Math.max(longest, performance.now() - started);
  }
  const holder = await locks.acquire(name, { ttlMs: 60_000 });
  assert.ok(holder.acquired);
  const busy = await locks.acquire(name);
  assert.ok(
    !busy.acquired && busy.retryAfterMs >= 10 && busy.retryAfterMs <= longest + 10,
    `${!busy.acquired && busy.retryAfterMs} ms after holds of at most ${longest} ms`,
  );
});

// One call's leave of `name`'s queue (see `waitFor`): `ticketEnd` the end of its last look's ticket.
async function leave(
  redis: Parameters<typeof takeTicket>[0],
  name: string,
  token: string,
  { wakeId = "", ticketEnd = "" } = {},
) {
  const k = keysOf(name);
  const { keys, args } = LEAVE_QUEUE.call({
    keys: { ...k, wakeKey: k.wakeKey(wakeId) },
    args: { member: token, outcome: "timeout", wakeId, ticketEnd, seenFence: 0, hold: "" },
  });
  return await runScript(redis, LEAVE_QUEUE, keys, args);
}
// The end of the ticket a look took, as its busy reply tells it.
const ticketEndOf = (reply: unknown[]) => String(reply[8]);

// A multi-name waiter's look at `names` through the acquire_all script (a 30 s ticket).
async function lookAll(
  redis: Parameters<typeof takeTicket>[0],
  names: string[],
  token: string,
  maxWaiters = 128,
) {
  const { keys, args } = ACQUIRE_ALL.call({
    each: names.map((name) => keysOf(name)),
    keys: { wakeKey: keysOf(names[0]!).wakeKey("") },
    args: {
      token,
      ttlMs: 5_000,
      meta: "",
      graceMs: FENCE_GRACE_MS,
      ticketMs: 30_000,
      maxWaiters,
      fresh: false,
      n: names.length,
      waitedMs: 0,
      waiting: true,
      wakeId: "",
    },
    rest: names,
  });
  return await runScript(redis, ACQUIRE_ALL, keys, args) as number[];
}

Deno.test("two calls with one token share a place: one that leaves after the other looked keeps it", async () => {
  const { redis, locks } = await fixture();
  const name = keygen("q");
  const holder = acquired(await locks.acquire(name, { ttlMs: 10_000 }));
  const token = "two-calls-token-000001";
  const first = await takeTicket(redis, name, token, 5_000, { wakeId: "wFirstCall000001" });
  await takeTicket(redis, name, "behind-token-00000001", 5_000);
  // The retry looks: it shares the place (at the head, it keeps the offer's wake key).
  const retry = await takeTicket(redis, name, token, 5_000, { wakeId: "wRetryCall000001" });
  assert.equal(retry[3], 0, "the retry is at the head");
  const wakeId = String(retry[7]);
  assert.equal(wakeId, String(first[7]), "on the first call's wake key");
  // The first call leaves: the retry looked since, so the place and its offer stay.
  assert.equal(
    await leave(redis, name, token, { wakeId, ticketEnd: ticketEndOf(first) }),
    0,
  );
  assert.deepEqual(await redis.zrange(keys(name)[1]!, 0, -1), [token, "behind-token-00000001"]);
  // The release hands the lock over in place, on the key the retry blocks on.
  await locks.release(holder);
  const grant = await redis.lpop<string>(keysOf(name).wakeKey(wakeId));
  assert.match(String(grant), /^\d+:\d+:\d+:/, "a grant on the retry's wake key");
  assert.equal((await locks.inspect(name)).held, true);
  assert.equal(await locks.release({ name, token }), true);
});

Deno.test("a call that gives up after another call of its token looked leaves the place to it", async () => {
  const { redis, locks } = await fixture();
  const name = keygen("q");
  const [, queueKey, ticketsKey] = keys(name);
  const holder = acquired(await locks.acquire(name, { ttlMs: 10_000 }));
  const token = "two-waits-token-000001";
  const abort = new AbortController();
  const first = locks.acquire(name, { token, waitMs: 20_000, signal: abort.signal });
  await until(
    "the first call is queued",
    async () => await redis.zscore(ticketsKey, token) !== null,
  );
  const ticket = await redis.zscore(ticketsKey, token);
  const second = locks.acquire(name, { token, ttlMs: 10_000, waitMs: 20_000 });
  await until(
    "the second call looked",
    async () => await redis.zscore(ticketsKey, token) !== ticket,
  );
  abort.abort(new Error("abandoned"));
  await assert.rejects(first, /abandoned/);
  assert.equal(await redis.zrank(queueKey, token), 0, "the place is the second call's");
  await locks.release(holder);
  await locks.release(acquired(await second));
});

Deno.test("two looks of one token in the same millisecond take tickets of their own", async () => {
  const { redis, locks } = await fixture();
  const name = keygen("q");
  const holder = acquired(await locks.acquire(name, { ttlMs: 10_000 }));
  const token = "same-ms-token-00000001";
  await takeTicket(redis, name, "ahead-token-000000001", 30_000);
  // A request and its duplicate, one pipeline: the same millisecond, the same ticket asked for.
  const { keys, args } = ticketCall(name, token, 30_000);
  const pipeline = redis.pipeline();
  pipeline.eval(ACQUIRE.source, keys, args);
  pipeline.eval(ACQUIRE.source, keys, args);
  const [first, second] = await pipeline.exec<[unknown[], unknown[]]>();
  assert.notEqual(ticketEndOf(first), ticketEndOf(second));
  // The first call leaves: the second looked since, and keeps the place.
  assert.equal(await leave(redis, name, token, { ticketEnd: ticketEndOf(first) }), 0);
  assert.deepEqual(await redis.zrange(keys[1]!, 0, -1), ["ahead-token-000000001", token]);
  await locks.release(holder);
});

Deno.test("a call that leaves keeps its token's place until its ticket ends, for a retry to take back", async () => {
  const { redis, locks } = await fixture();
  const name = keygen("q");
  const holder = acquired(await locks.acquire(name, { ttlMs: 10_000 }));
  const token = "comes-back-token-00001";
  const look = await takeTicket(redis, name, token, 30_000);
  const behind = "behind-token-00000002";
  await takeTicket(redis, name, behind, 30_000);
  assert.equal(await leave(redis, name, token, { ticketEnd: ticketEndOf(look) }), 1);
  // A copy of the leave (its reply lost, and the client's retry) ends nothing.
  assert.equal(await leave(redis, name, token, { ticketEnd: ticketEndOf(look) }), 0);
  // Left: no one waits behind it, and it is no waiter.
  assert.deepEqual(await redis.zrange(keys(name)[1]!, 0, -1), [behind]);
  const info = await locks.inspect(name);
  assert.equal(info.held && info.waiters, 1);
  // A call with the token takes the place back, ahead of the waiter that came after it.
  const back = locks.acquire(name, { token, ttlMs: 10_000, waitMs: 20_000 });
  await until(
    "the token is back in the queue",
    async () => await redis.zscore(keys(name)[1]!, token) !== null,
  );
  assert.deepEqual(await redis.zrange(keys(name)[1]!, 0, -1), [token, behind]);
  await locks.release(holder);
  const got = acquired(await back);
  assert.equal(got.token, token);
  await locks.release(got);
  // Once its ticket ends, a place left is gone: the token comes back at the end.
  const other = keygen("q");
  const held = acquired(await locks.acquire(other, { ttlMs: 10_000 }));
  const short = await takeTicket(redis, other, token, 300);
  await takeTicket(redis, other, behind, 30_000);
  assert.equal(await leave(redis, other, token, { ticketEnd: ticketEndOf(short) }), 1);
  await until(
    "the ticket ended",
    async () => Number((await redis.time())[0]) * 1000 > short[2]! + 1_300,
  );
  await takeTicket(redis, other, token, 30_000);
  assert.deepEqual(await redis.zrange(keys(other)[1]!, 0, -1), [behind, token]);
  await locks.release(held);
});

Deno.test("an HTTP acquire abandoned before its retry arrives leaves the retry its place", async () => {
  const { backend, redis } = await fixture();
  const secret = "place-secret-0123456789";
  const apiKeys = parseApiKeys(`p:${secret}`);
  const app = createApp({ redis: backend.client(), apiKeys, log: () => {} });
  const tenant = new Locks(redis, { prefix: "edgelock:p" });
  const acquire = async (name: string, body: Record<string, unknown>, signal?: AbortSignal) => {
    const res = await app.request(`/v1/locks/${name}/acquire`, {
      method: "POST",
      headers: { authorization: `Bearer ${secret}`, "content-type": "application/json" },
      body: JSON.stringify(body),
      signal,
    });
    return await res.json() as { token: string; fence: number };
  };
  const name = keygen("q");
  const queueKey = lockKeys(name, "edgelock:p")[1];
  const holder = acquired(await tenant.acquire(name, { ttlMs: 10_000 }));
  const token = "abandoned-token-000001";
  const abandon = new AbortController();
  const first = acquire(name, { token, ttlMs: 5_000, waitMs: 20_000 }, abandon.signal)
    .catch(() => null);
  await until("the first request is queued", async () => await redis.zcard(queueKey) === 1);
  const order: string[] = [];
  const other = acquire(name, { ttlMs: 5_000, waitMs: 20_000 }).then(async (lease) => {
    order.push("other");
    await tenant.release({ name, ...lease });
  });
  await until("the other waiter is queued", async () => await redis.zcard(queueKey) === 2);
  abandon.abort();
  await first;
  await until("the first request left", async () => await redis.zscore(queueKey, token) === null);
  const retry = acquire(name, { token, ttlMs: 5_000, waitMs: 20_000 }).then(async (lease) => {
    order.push("retry");
    await tenant.release({ name, ...lease });
  });
  await until(
    "the retry took the place back",
    async () => await redis.zrank(queueKey, token) === 0,
  );
  await tenant.release(holder);
  await Promise.all([retry, other]);
  assert.deepEqual(order, ["retry", "other"]);
  assert.equal((await tenant.inspect(name)).held, false);
});

Deno.test("a grant that leaves no one waiting ends the places left: a token served never jumps back", async () => {
  const { redis, locks } = await fixture();
  const name = keygen("q");
  const [, queueKey, ticketsKey] = keys(name);
  const token = "served-once-token-0001";
  const holder = acquired(await locks.acquire(name, { ttlMs: 10_000 }));
  const look = await takeTicket(redis, name, token, 30_000);
  assert.equal(await leave(redis, name, token, { ticketEnd: ticketEndOf(look) }), 1);
  assert.ok(Number(await redis.zscore(ticketsKey, token)) < 0, "a place left");
  // The queue is empty: the token's plain acquire is granted at once, and that ends the place.
  await locks.release(holder);
  const served = acquired(await locks.acquire(name, { token, ttlMs: 10_000 }));
  assert.equal(await redis.zscore(ticketsKey, token), null);
  // Waiters that queue while it holds come before its next wait.
  const order: string[] = [];
  let open = () => {};
  const gate = new Promise<void>((resolve) => open = resolve);
  const waiter = (id: string, token?: string) =>
    locks.acquire(name, { ttlMs: 10_000, waitMs: 20_000, ...(token && { token }) }).then(
      async (result) => {
        order.push(id);
        if (id === "first") await gate;
        await locks.release(acquired(result));
      },
    );
  const first = waiter("first");
  await until("one waiter", async () => await redis.zcard(queueKey) === 1);
  const second = waiter("second");
  await until("two waiters", async () => await redis.zcard(queueKey) === 2);
  await locks.release(served);
  await until("the first holds", () => Promise.resolve(order.length === 1));
  const again = waiter("again", token);
  await until("the token waits again", async () => await redis.zcard(queueKey) === 2);
  assert.equal(await redis.zrank(queueKey, token), 1, "behind the second waiter");
  open();
  await Promise.all([first, second, again]);
  assert.deepEqual(order, ["first", "second", "again"]);
});

Deno.test("a multi-name waiter takes no place back: its places in every queue date from one look", async () => {
  const { redis, locks } = await fixture();
  const names = [keygen("x"), keygen("y")];
  const holder = await locks.acquireAll(names, { ttlMs: 10_000 });
  assert.ok(holder.acquired);
  const [a, b] = ["multi-token-aaaaaaaa01", "multi-token-bbbbbbbb01"];
  const look = await lookAll(redis, names, a);
  // a's leave is one script per name: another waiter and a's retry look between the two.
  assert.equal(await leave(redis, names[0]!, a, { ticketEnd: ticketEndOf(look) }), 1);
  await lookAll(redis, names, b);
  await lookAll(redis, names, a);
  assert.equal(await leave(redis, names[1]!, a, { ticketEnd: ticketEndOf(look) }), 0);
  for (const name of names) assert.deepEqual(await redis.zrange(keys(name)[1]!, 0, -1), [b, a]);
  for (const lease of holder.leases) await locks.release(lease);
});

Deno.test("only a grant ends the places left: a multi-name caller refused as the queue is full does not", async () => {
  const { redis, locks } = await fixture();
  const [x, y] = [keygen("x"), keygen("y")];
  const held = [x, y].map(async (name) => acquired(await locks.acquire(name, { ttlMs: 10_000 })));
  const token = "place-left-token-00001";
  const look = await takeTicket(redis, x, token, 30_000);
  assert.equal(await leave(redis, x, token, { ticketEnd: ticketEndOf(look) }), 1);
  await takeTicket(redis, y, "y-waiter-token-000001", 30_000);
  // Refused on y, the multi-name caller leaves x's queue (empty again): no grant, nothing ended.
  const refused = await lookAll(redis, [x, y], "multi-token-00000001", 1);
  assert.equal(refused[3], -2, "queue_full");
  await takeTicket(redis, x, "later-token-000000001", 30_000);
  const retry = await takeTicket(redis, x, token, 30_000);
  assert.equal(retry[3], 0, "the retry takes its place back, ahead of the later waiter");
  for (const lease of await Promise.all(held)) await locks.release(lease);
});
