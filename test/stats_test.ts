// The stats the scripts keep, the held index, break and audit: counts compared exactly with what
// a scripted workload did, against a real redis-server through the bridge.
import assert from "node:assert/strict";
import { startShiftedRedisServer } from "../dev/clock_shift.ts";
import { LockOps, Locks } from "../src/core/mod.ts";
import type { LockEvent } from "../src/core/types.ts";
import { type Counts, STATS_RETENTION_MS, toStats } from "../src/core/stats.ts";
import { Jobs, recordId, Records } from "../src/uses/mod.ts";
import fc from "fast-check";
import { acquired, keygen, shared, startBackend, until } from "./_backend.ts";

// The counters of a Counts, flat (`acquire.granted` …), without the histograms' buckets.
function flat(counts: Counts): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [op, value] of Object.entries(counts)) {
    if (typeof value === "number") out[op] = value;
    else if (op === "wait" || op === "hold") out[`${op}.count`] = value.count;
    else for (const [k, n] of Object.entries(value)) out[`${op}.${k}`] = n as number;
  }
  return out;
}

const fixture = shared(async () => {
  const backend = await startBackend();
  const { redis } = backend;
  return { backend, redis };
}, ({ backend }) => backend.stop());

Deno.test("count exactly what a scripted workload did, in the totals, the last hour and its minutes", async () => {
  const { redis } = await fixture();
  const prefix = keygen("stats");
  const events: LockEvent[] = [];
  const locks = new Locks(redis, { prefix, maxWaiters: 1, onEvent: (e) => events.push(e) });
  const ops = new LockOps(redis, { prefix, onEvent: (e) => events.push(e) });
  const records = new Records(redis, { prefix });
  const jobs = new Jobs(redis, { prefix });

  const a = acquired(await locks.acquire("a", { ttlMs: 5000 })); // granted 1
  const b = acquired(await locks.acquire("b", { ttlMs: 5000 })); // granted 2
  assert.equal((await locks.acquire("a")).acquired, false); // busy 1
  assert.equal((await locks.acquire("a")).acquired, false); // busy 2
  const waiter = locks.acquire("a", { waitMs: 3000 }); // queued, the only waiter allowed
  await until("the waiter queued", async () =>
    (await locks.inspect("a")).held &&
    ((await locks.inspect("a")) as { waiters: number }).waiters === 1);
  const full = await locks.acquire("a", { waitMs: 200 }); // queue_full 1
  assert.ok(!full.acquired && full.reason === "queue_full");
  assert.equal((await locks.renew(a)).renewed, true); // renewed 1
  assert.equal(await locks.release(a), true); // released 1
  const w = acquired(await waiter); // granted 3, after a wait
  assert.equal(
    (await locks.renew({ name: "a", token: "not-the-holder-0001" })).renewed,
    false,
  ); // renew lost 1
  assert.deepEqual(await ops.break("a", { by: "ops", reason: "stuck" }), {
    broken: true,
    fence: w.fence,
  }); // broken 1
  assert.equal(await locks.release(w), false); // release lost 1
  const timedOut = await locks.acquire("b", { waitMs: 150 }); // timeout 1
  assert.ok(!timedOut.acquired && timedOut.reason === "busy");
  const aborted = new AbortController();
  const gone = locks.acquire("b", { waitMs: 3000, signal: aborted.signal });
  setTimeout(() => aborted.abort(new Error("caller left")), 50);
  await assert.rejects(gone, /caller left/); // aborted 1

  const id = recordId("user", keygen("k"));
  const claim = await records.claim("idempotency", id, { fingerprint: "f" }); // first
  assert.equal(claim.state, "claimed");
  await records.claim("idempotency", id); // conflict
  await records.claim("idempotency", id, { fingerprint: "g" }); // mismatch
  await records.complete("idempotency", id, (claim as { token: string }).token, {});
  await records.claim("idempotency", id); // replay
  await records.claim("idempotency", id); // replay
  const hook = recordId("stripe", keygen("evt"));
  const first = await records.claim("dedupe", hook); // first
  await records.claim("dedupe", hook); // conflict (in progress)
  await records.complete("dedupe", hook, (first as { token: string }).token);
  await records.claim("dedupe", hook); // replay (a duplicate delivery)
  await records.noteSignatureFailure(); // signature_failed

  const job = keygen("job");
  const run = await jobs.start(job, { atMostMs: 5000, atLeastMs: 1000, tick: 7 }); // run
  assert.ok(run.run);
  await jobs.start(job, { atMostMs: 5000, tick: 7 }); // tick_done
  await jobs.start(job, { atMostMs: 5000 }); // running
  await jobs.finish(job, run.token);
  await jobs.start(job, { atMostMs: 5000 }); // too_soon

  const expected = {
    "acquire.granted": 3,
    "acquire.busy": 2,
    "acquire.timeout": 1,
    "acquire.queue_full": 1,
    "acquire.aborted": 1,
    "renew.renewed": 1,
    "renew.lost": 1,
    "release.released": 1,
    "release.lost": 1,
    "lease_lost": 2,
    "break.broken": 1,
    "idempotency.first": 1,
    "idempotency.replay": 2,
    "idempotency.conflict": 1,
    "idempotency.mismatch": 1,
    "dedupe.first": 1,
    "dedupe.replay": 1,
    "dedupe.conflict": 1,
    "dedupe.mismatch": 0,
    "dedupe.signature_failed": 1,
    "cron.run": 1,
    "cron.running": 1,
    "cron.too_soon": 1,
    "cron.tick_done": 1,
    "wait.count": 3,
    "hold.count": 1,
  };
  const stats = await ops.stats();
  assert.deepEqual(flat(stats.total), expected);
  assert.deepEqual(flat(stats.last_hour), expected);
  assert.equal(stats.locks_held, 1, "b is held; a was broken");
  const minutes = stats.minutes.reduce(
    (sum, m) => ({
      granted: sum.granted + m.granted,
      busy: sum.busy + m.busy,
      timeout: sum.timeout + m.timeout,
      lease_lost: sum.lease_lost + m.lease_lost,
    }),
    { granted: 0, busy: 0, timeout: 0, lease_lost: 0 },
  );
  assert.deepEqual(minutes, { granted: 3, busy: 2, timeout: 1, lease_lost: 2 });
  assert.equal(stats.minutes.length, 60);
  assert.ok(stats.total.wait.sum_ms! >= 1, "the waiter's wait counted");
  assert.ok(stats.total.wait.p99_ms! > 0);

  const outcomes = events.map((e) => `${e.type}${"outcome" in e ? `:${e.outcome}` : ""}`)
    .filter((e) => e !== "wait");
  assert.deepEqual(outcomes.sort(), [
    "acquire:aborted",
    "acquire:busy",
    "acquire:busy",
    "acquire:granted",
    "acquire:granted",
    "acquire:granted",
    "acquire:queue_full",
    "acquire:timeout",
    "release:lost",
    "release:released",
    "renew:lost",
    "renew:renewed",
  ]);
  assert.ok(events.some((e) => e.type === "wait"), "each busy look while waiting is told");
  assert.ok(events.every((e) => e.durationMs >= 0 && e.at > 0));

  const audit = await ops.audit();
  assert.equal(audit.length, 1);
  assert.deepEqual({ ...audit[0], id: undefined, at: undefined }, {
    id: undefined,
    at: undefined,
    action: "break",
    name: "a",
    fence: w.fence,
    by: "ops",
    reason: "stuck",
  });
  const next = acquired(await locks.acquire("a"));
  assert.ok(next.fence > w.fence, "after a break the next fence is higher");
  await locks.release(next);
  await locks.release(b);
});

Deno.test("a stats hash with 9,000 slot fields (a hand edit) never stops a decision", async () => {
  const { redis } = await fixture();
  const prefix = keygen("bighash");
  const key = `${prefix}:stats`;
  // Unmarked, as an earlier build's: its slots go at this build's first count, past Lua's limit
  // of 8,000 values to unpack.
  for (let i = 0; i < 9; i++) {
    await redis.hset(
      key,
      Object.fromEntries(Array.from({ length: 1000 }, (_, j) => [`${i}:x${j}`, 1])),
    );
  }
  const locks = new Locks(redis, { prefix });
  assert.equal(await locks.release(acquired(await locks.acquire("x"))), true);
  assert.equal(String(await redis.hget(key, "v")), "2");
  assert.ok(await redis.hlen(key) < 20, "the slot fields are gone");
  assert.equal((await new LockOps(redis, { prefix }).stats()).total.acquire.granted, 1);
});

Deno.test("the totals count whole numbers only, and a hash's slots only when it is marked v 2", () => {
  const nowMs = 100 * 60_000; // minute 100: slot 40
  const hash = (v: unknown) => ({
    v,
    "t:wait.0": "5",
    "40:m": "100",
    "40:wait.0": "2",
    "41:wait.0": "1.5",
  });
  assert.equal(toStats([hash("2")], nowMs, 0).total.acquire.granted, 7);
  assert.equal(
    toStats([hash(2)], nowMs, 0).total.acquire.granted,
    7,
    "as @upstash/redis parses it",
  );
  for (const v of [undefined, "02", "3", "2.0"]) {
    const stats = toStats([hash(v)], nowMs, 0);
    assert.equal(
      stats.total.acquire.granted,
      5,
      `v ${v}: an earlier build's totals hold its slots`,
    );
    assert.equal(stats.last_hour.acquire.granted, 2);
  }
});

Deno.test("list exactly the held locks, by prefix and page, never an expired one", async () => {
  const { redis } = await fixture();
  const prefix = keygen("list");
  const locks = new Locks(redis, { prefix });
  const ops = new LockOps(redis, { prefix });
  const names = Array.from({ length: 25 }, (_, i) => `job:${String(i).padStart(2, "0")}`);
  const leases = [];
  for (const name of names) {
    leases.push(acquired(await locks.acquire(name, { ttlMs: 10_000, meta: { i: name } })));
  }
  const short = acquired(await locks.acquire("job:short", { ttlMs: 150 }));
  acquired(await locks.acquire("other:1", { ttlMs: 10_000 }));
  await locks.release(leases[3]!);
  const pages: string[][] = [];
  let cursor: string | undefined;
  do {
    const page = await ops.list({ prefix: "job:", limit: 10, ...(cursor && { cursor }) });
    pages.push(page.locks.map((l) => l.name));
    for (const lock of page.locks) {
      assert.ok(lock.expiresAt > Date.now() - 1000 && lock.fence > 0);
    }
    cursor = page.cursor;
  } while (cursor);
  const held = names.filter((_, i) => i !== 3);
  assert.deepEqual(pages.flat(), [...held, "job:short"].sort());
  assert.ok(pages.every((p) => p.length <= 10));
  await until(
    "the short lease ran out",
    async () => !(await locks.inspect("job:short")).held,
  );
  const after = await ops.list({ prefix: "job:", limit: 1000 });
  assert.deepEqual(
    after.locks.map((l) => l.name),
    held,
    "the expired one is gone",
  );
  assert.equal(after.cursor, undefined);
  assert.deepEqual(after.locks[0]!.meta, { i: "job:00" });
  assert.equal((await ops.stats()).locks_held, 25, "24 job: locks and other:1");
  assert.equal(short.name, "job:short");
  await assert.rejects(ops.list({ limit: 0 }), RangeError);
  await assert.rejects(ops.list({ prefix: "a b" }), RangeError);
  await assert.rejects(ops.list({ cursor: "../x" }), RangeError);
});

Deno.test("paging the list gives every held name with the prefix once, in order, in both key layouts (fast-check)", async () => {
  const { redis } = await fixture();
  // Names of one {g} share a bucket, so one bucket's index can fill with released names
  // (it stops looking after 4 × limit + 16) while other buckets list names past its stop.
  const name = fc.stringMatching(/^(\{g\})?[ab]{1,3}:[0-9]{1,2}$/);
  const scenario = fc.record({
    names: fc.uniqueArray(name, { maxLength: 60 }),
    released: fc.array(fc.nat(4).map((n) => n > 0), { minLength: 60, maxLength: 60 }),
    prefix: fc.constantFrom("", "a", "ab", "b:", "ba:1", "{g}", "{g}a"),
    limit: fc.integer({ min: 1, max: 12 }),
    cluster: fc.boolean(),
  });
  // The case itself: 30 released names fill {g}'s bucket; a page must not list {z}, past
  // where that bucket stopped looking, or the next page would list it again.
  const edgePrefix = keygen("page");
  const edge = new Locks(redis, { prefix: edgePrefix, cluster: true });
  const edgeOps = new LockOps(redis, { prefix: edgePrefix, cluster: true });
  const dead = Array.from({ length: 30 }, (_, i) => `{g}a:${String(i).padStart(2, "0")}`);
  for (const n of dead) await edge.release(acquired(await edge.acquire(n)));
  acquired(await edge.acquire("{z}"));
  const seen: string[] = [];
  let next: string | undefined;
  do {
    const page = await edgeOps.list({ limit: 1, ...(next && { cursor: next }) });
    seen.push(...page.locks.map((lock) => lock.name));
    next = page.cursor;
  } while (next);
  assert.deepEqual(seen, ["{z}"]);

  await fc.assert(
    fc.asyncProperty(scenario, async ({ names, released, prefix, limit, cluster }) => {
      const options = { prefix: keygen("page"), cluster };
      const locks = new Locks(redis, options);
      const ops = new LockOps(redis, options);
      const leases = await Promise.all(
        names.map(async (n) => acquired(await locks.acquire(n, { ttlMs: 10_000 }))),
      );
      await Promise.all(leases.filter((_, i) => released[i]).map((l) => locks.release(l)));
      const listed: string[] = [];
      let cursor: string | undefined;
      for (let pages = 0;; pages++) {
        assert.ok(pages <= names.length + 1, "paging ends");
        const page = await ops.list({ prefix, limit, ...(cursor && { cursor }) });
        assert.ok(page.locks.length <= limit);
        listed.push(...page.locks.map((lock) => lock.name));
        cursor = page.cursor;
        if (!cursor) break;
      }
      const held = names.filter((n, i) => !released[i] && n.startsWith(prefix)).sort();
      assert.deepEqual(listed, held);
      assert.equal(
        (await ops.stats()).locks_held,
        released.slice(0, names.length)
          .filter((r) => !r).length,
      );
    }),
    { numRuns: 40 },
  );
});

Deno.test("with stats off, no stats or index key is written, and the operator's view finds nothing", async () => {
  const { redis } = await fixture();
  const prefix = keygen("off");
  const locks = new Locks(redis, { prefix, stats: false });
  const ops = new LockOps(redis, { prefix, stats: false });
  const lease = acquired(await locks.acquire("x"));
  await locks.renew(lease);
  await locks.release(lease);
  const held = acquired(await locks.acquire("y"));
  assert.deepEqual((await ops.list()).locks, [], "nothing indexed to list");
  assert.equal((await ops.stats()).locks_held, 0, "nothing counted");
  assert.equal((await ops.break("y", { by: "ops" })).broken, true);
  const kept = (await redis.keys(`${prefix}:*`)).filter((k) => !k.includes(":lock:"));
  assert.deepEqual(kept, [`${prefix}:audit`], "only the audit of the break");
  await locks.release(held);
  assert.throws(() => new Locks(redis, { stats: "yes" as unknown as boolean }), TypeError);
});

Deno.test("a damaged stats or index key stops the counting, never the decision, and reads as empty", async () => {
  const { redis } = await fixture();
  const prefix = keygen("damaged");
  await redis.set(`${prefix}:stats`, "not a hash");
  await redis.set(`${prefix}:held`, "not a zset");
  const locks = new Locks(redis, { prefix });
  const ops = new LockOps(redis, { prefix });
  const lease = acquired(await locks.acquire("x"));
  assert.equal((await locks.renew(lease)).renewed, true);
  assert.equal(await locks.release(lease), true);
  assert.equal(await redis.get(`${prefix}:stats`), "not a hash");
  const stats = await ops.stats();
  assert.equal(stats.total.acquire.granted, 0, "a damaged stats key reads as empty");
  assert.deepEqual((await ops.list()).locks, [], "a damaged index lists nothing");
});

for (
  const [label, mode] of [["shared", { mode: "shared" as const }], ["semaphore", {
    limit: 2,
  }]] as const
) {
  Deno.test(`locks_held counts a ${label} name only while one of its leases lasts`, async () => {
    const { redis } = await fixture();
    const prefix = keygen("held");
    const locks = new Locks(redis, { prefix });
    const ops = new LockOps(redis, { prefix });
    const long = acquired(await locks.acquire("r", { ...mode, ttlMs: 60_000 }));
    acquired(await locks.acquire("r", { ...mode, ttlMs: 300 }));
    assert.equal((await ops.stats()).locks_held, 1);
    assert.equal(await locks.release(long), true);
    await until("the short lease ran out", async () => !(await locks.inspect("r")).held);
    assert.deepEqual((await ops.list()).locks, []);
    assert.equal((await ops.stats()).locks_held, 0, "no lease lasts");
  });
}

Deno.test("a retried break answers the same, and never ends a lease granted since", async () => {
  const { redis } = await fixture();
  const prefix = keygen("brk");
  const locks = new Locks(redis, { prefix });
  const ops = new LockOps(redis, { prefix });
  const first = acquired(await locks.acquire("x", { ttlMs: 60_000 }));
  const id = "break-id-000001";
  const once = await ops.break("x", { by: "ops", id });
  assert.deepEqual(once, { broken: true, fence: first.fence });
  const next = acquired(await locks.acquire("x", { ttlMs: 60_000 }));
  assert.deepEqual(await ops.break("x", { by: "ops", id }), once, "the same answer");
  const info = await locks.inspect("x");
  assert.ok(info.held && info.fence === next.fence, "the lease granted since stands");
  assert.equal((await ops.audit()).length, 1, "one break in the audit");
  assert.equal((await ops.stats()).total.break.broken, 1);
  await assert.rejects(ops.break("x", { by: "ops", id: "short" }), RangeError);
  // A break that found the name free is remembered too: its retry ends nothing.
  assert.equal(await locks.release(next), true);
  const free = await ops.break("x", { by: "ops", id: "break-id-000002" });
  assert.deepEqual(free, { broken: false });
  const later = acquired(await locks.acquire("x", { ttlMs: 60_000 }));
  assert.deepEqual(await ops.break("x", { by: "ops", id: "break-id-000002" }), free);
  assert.ok((await locks.inspect("x")).held, "the lease granted since stands");
  assert.equal(await locks.release(later), true);
});

Deno.test("a retried break ends no lease granted since, however many leases were released between", async () => {
  const { redis } = await fixture();
  const prefix = keygen("brk");
  const locks = new Locks(redis, { prefix });
  const ops = new LockOps(redis, { prefix });
  const marks = `${prefix}:lock:{x}:released`;
  // 1,000 later releases of the name, whose marks outrank every earlier one (helper-32's and
  // helper-33's cases); a release then trims the marks to them.
  const releasedSince = async () => {
    const fence = Date.now() * 1000 + 1_000_000;
    for (let i = 0; i < 1000; i += 250) {
      const batch = Array.from({ length: 250 }, (_, j) => ({
        score: fence + i + j,
        member: `released-token-${i + j}`,
      }));
      await redis.zadd(marks, batch[0]!, ...batch.slice(1));
    }
    assert.equal(await locks.release(acquired(await locks.acquire("x", { ttlMs: 60_000 }))), true);
  };
  const held = acquired(await locks.acquire("x", { ttlMs: 60_000 }));
  const broke = await ops.break("x", { by: "ops", id: "break-id-000003" });
  assert.deepEqual(broke, { broken: true, fence: held.fence });
  const free = await ops.break("x", { by: "ops", id: "break-id-000004" });
  assert.deepEqual(free, { broken: false });
  await releasedSince();
  const lease = acquired(await locks.acquire("x", { ttlMs: 60_000 }));
  assert.deepEqual(await ops.break("x", { by: "ops", id: "break-id-000003" }), broke);
  assert.deepEqual(await ops.break("x", { by: "ops", id: "break-id-000004" }), free);
  const info = await locks.inspect("x");
  assert.ok(info.held && info.fence === lease.fence, "the lease granted since stands");
  assert.equal(await locks.release(lease), true);
});

Deno.test("a retried break ends no lease granted since, after 1,000 other breaks of the name", async () => {
  const { redis } = await fixture();
  const prefix = keygen("brk");
  const locks = new Locks(redis, { prefix });
  const ops = new LockOps(redis, { prefix });
  // helper-34's cases: breaks of the name while held (higher fences), then free (fence 0), and the
  // newest id sorting first.
  for (let i = 0; i < 1000; i++) {
    const held = i % 2 === 0;
    if (held) acquired(await locks.acquire("x", { ttlMs: 60_000 }));
    const id = `seed-${String(i).padStart(6, "0")}`;
    assert.equal((await ops.break("x", { by: "ops", id })).broken, held);
  }
  const id = "AAAA-newest-01";
  assert.deepEqual(await ops.break("x", { by: "ops", id }), { broken: false });
  const lease = acquired(await locks.acquire("x", { ttlMs: 60_000 }));
  assert.deepEqual(await ops.break("x", { by: "ops", id }), { broken: false }, "the same answer");
  const info = await locks.inspect("x");
  assert.ok(info.held && info.fence === lease.fence, "the lease granted since stands");
  assert.equal(await redis.hlen(`${prefix}:lock:{x}:breaks`), 1001, "1,000 ids and the last seq");
  assert.ok(await redis.pttl(`${prefix}:lock:{x}:breaks`) > 0);
  assert.equal(await locks.release(lease), true);
});

Deno.test("a damaged breaks hash (a hand edit) neither fails a break after it ended the lease nor loses the break", async () => {
  const { redis } = await fixture();
  // helper-35's cases: the last seq not a number, at the 64-bit limit, huge, or gone.
  for (const last of ["abc", "9223372036854775807", "100000000000000", undefined]) {
    const prefix = keygen("brk");
    const locks = new Locks(redis, { prefix });
    const ops = new LockOps(redis, { prefix });
    const breaks = `${prefix}:lock:{x}:breaks`;
    await redis.hset(breaks, { "seed-000001": "0|7", ...(last !== undefined && { "#": last }) });
    await redis.pexpire(breaks, 600_000);
    const held = acquired(await locks.acquire("x", { ttlMs: 60_000 }));
    const once = await ops.break("x", { by: "ops", id: "break-id-000005" });
    assert.deepEqual(once, { broken: true, fence: held.fence }, `# ${last}`);
    const [seq, kept] = await redis.hmget<Record<string, string>>(breaks, "#", "break-id-000005")
      .then((got) => [got!["#"], got!["break-id-000005"]]);
    assert.match(String(seq), /^\d+$/, `a whole seq again after # ${last}`);
    assert.equal(kept, `${held.fence}|${seq}`);
    const lease = acquired(await locks.acquire("x", { ttlMs: 60_000 }));
    assert.deepEqual(await ops.break("x", { by: "ops", id: "break-id-000005" }), once);
    assert.ok((await locks.inspect("x")).held, "the lease granted since stands");
    assert.equal(await locks.release(lease), true);
  }
});

Deno.test("break refuses bad input and answers not held for a free name", async () => {
  const { redis } = await fixture();
  const prefix = keygen("brk");
  const ops = new LockOps(redis, { prefix });
  assert.deepEqual(await ops.break("free", { by: "ops" }), { broken: false });
  await assert.rejects(ops.break("x", { by: "" }), RangeError);
  await assert.rejects(ops.break("x", { by: "a\nb" }), RangeError);
  await assert.rejects(ops.break("x", { by: "ops", reason: "r".repeat(201) }), RangeError);
  await assert.rejects(ops.break("x", undefined as unknown as { by: string }), TypeError);
  assert.deepEqual(await ops.audit(), []);
});

Deno.test("the onEvent hook's own errors never break a lock operation", async () => {
  const { redis } = await fixture();
  const locks = new Locks(redis, {
    prefix: keygen("hook"),
    onEvent: () => {
      throw new Error("the hook failed");
    },
  });
  const lease = acquired(await locks.acquire("x"));
  assert.equal(await locks.release(lease), true);
});

Deno.test("the stats' minute ring under a stepping server clock", async (t) => {
  const server = await startShiftedRedisServer();
  const backend = await startBackend([], server);
  const { redis } = backend;
  // The server clock 30 s into the given minute after a whole one: the real time a step takes
  // (long on a loaded machine) never carries its counts into the next minute.
  const base = Math.ceil(Date.now() / 60_000) * 60_000;
  const atMinute = (minute: number) => server.shift(base + minute * 60_000 + 30_000 - Date.now());

  try {
    await t.step(
      "keeps the last 60 minutes, clears a slot that turns over, and stays bounded",
      async () => {
        const prefix = keygen("ring");
        const locks = new Locks(redis, { prefix });
        const ops = new LockOps(redis, { prefix });
        // 90 minutes, two grants and one busy each: the ring turns over one and a half times.
        for (let minute = 0; minute < 90; minute++) {
          await atMinute(minute);
          const lease = acquired(await locks.acquire("x", { ttlMs: 1000 }));
          assert.equal((await locks.acquire("x")).acquired, false);
          await locks.release(lease);
          acquired(await locks.acquire(`y${minute}`, { ttlMs: 100 }));
        }
        const stats = await ops.stats();
        assert.equal(stats.total.acquire.granted, 180);
        assert.equal(stats.total.acquire.busy, 90);
        assert.equal(stats.last_hour.acquire.granted, 120, "only the last 60 minutes");
        assert.equal(stats.last_hour.acquire.busy, 60);
        assert.ok(stats.minutes.every((m) => m.granted === 2 && m.busy === 1));
        const fields = await redis.hlen(`${prefix}:stats`);
        assert.ok(fields <= 60 * 6 + 10, `${fields} fields`);
        const pttl = await redis.pttl(`${prefix}:stats`);
        assert.ok(pttl > STATS_RETENTION_MS - 60_000 && pttl <= STATS_RETENTION_MS);
        // One y<minute> lease runs out unreleased each minute: the first grant of each minute
        // prunes those that ran out, so at most the last minute's two are left.
        assert.ok(await redis.zcard(`${prefix}:held:ends`) <= 2, "pruned each minute");
        assert.equal(await redis.zcard(`${prefix}:held`), await redis.zcard(`${prefix}:held:ends`));
        await server.shift(0);
      },
    );
    await t.step(
      "prunes the held index at a minute's first grant, whatever counted first that minute",
      async () => {
        const prefix = keygen("prune");
        const locks = new Locks(redis, { prefix });
        const ends = `${prefix}:held:ends`;
        await atMinute(0);
        await locks.release(acquired(await locks.acquire("x", { ttlMs: 1000 })));
        acquired(await locks.acquire("y", { ttlMs: 100 })); // runs out unreleased
        await atMinute(2);
        // The minute's first count is a lost renew, not a grant.
        assert.equal(
          (await locks.renew({ name: "z", token: "not-the-holder-0001" })).renewed,
          false,
        );
        // x is in the index already: its grant prunes nothing of its own.
        await locks.release(acquired(await locks.acquire("x", { ttlMs: 1000 })));
        assert.equal(await redis.zscore(ends, "y"), null, "y, ended two minutes ago, is pruned");
        await server.shift(0);
      },
    );
    await t.step(
      "reads an earlier build's hash as it is, then counts each grant once, folded exactly",
      async () => {
        const prefix = keygen("upgrade");
        const key = `${prefix}:stats`;
        // An earlier build counted each grant in its totals and its minute's slot: 5 grants, 2
        // of them in a slot of a long-gone minute not yet turned over, and damaged values.
        await redis.hset(key, {
          "t:wait.0": 5,
          "7:m": 7,
          "7:wait.0": 2,
          "t:hold.0": "abc",
          "8:m": 8,
          "8:hold.0": "1.5",
        });
        const locks = new Locks(redis, { prefix });
        const ops = new LockOps(redis, { prefix });
        await atMinute(0);
        const before = await ops.stats();
        assert.equal(before.total.acquire.granted, 5, "read as it is, before this build counts");
        assert.equal(before.total.release.released, 0, "whole numbers only");
        await locks.release(acquired(await locks.acquire("x", { ttlMs: 1000 })));
        assert.equal(
          (await ops.stats()).total.acquire.granted,
          6,
          "its slots went, its totals kept",
        );
        assert.equal(String(await redis.hget(key, "v")), "2");
        // An hour on, the same slot turns over: its grant and release join the totals.
        await atMinute(60);
        await locks.release(acquired(await locks.acquire("x", { ttlMs: 1000 })));
        const after = await ops.stats();
        assert.equal(after.total.acquire.granted, 7);
        assert.equal(after.total.release.released, 2);
        assert.equal(after.last_hour.acquire.granted, 1);
        assert.equal(Number(await redis.hget(key, "t:wait.0")), 6, "folded into the totals");
        assert.equal(Number(await redis.hget(key, "t:hold.0")), 1, "a damaged total replaced");
        await server.shift(0);
      },
    );
  } finally {
    await backend.stop();
  }
});
