// Quorum locks over 5 independent redis-servers, each behind its own REST bridge, with the
// unmodified @upstash/redis client: majorities, databases down, partial holds cleaned up, and the
// fence argument attacked where it could break (two majorities sharing one database, another
// database's data lost, clocks behind).
import assert from "node:assert/strict";
import { QuorumLocks } from "@edgelock/edgelock/quorum";
import { runScript } from "../src/core/_runner.ts";
import { FENCE_GRACE_MS } from "../src/core/_validate.ts";
import { Q_ACQUIRE, Q_COMMIT, Q_RELEASE, Q_RENEW } from "../src/quorum/scripts.ts";
import type {
  CallOf,
  Contract,
  ContractScript,
  Script,
  ScriptCall,
} from "../src/core/lua/_define.ts";
import { type ShiftedRedisServer, startShiftedRedisServer } from "../dev/clock_shift.ts";
import { acquired, type Backend, keygen, shared, startBackend, until } from "./_backend.ts";
import type { Lease, RedisLike } from "@edgelock/edgelock";

// Holds `name` on database `db` for another token, as a competing acquire would.
const FOREIGN = "foreign-holder-token-01";
const hold = (db: Backend, name: string, ttlMs = 30_000) =>
  runCall(
    db,
    Q_ACQUIRE,
    Q_ACQUIRE.call({
      keys: { key: `edgelock:qlock:{${name}}` },
      args: { token: FOREIGN, ttlMs, graceMs: FENCE_GRACE_MS },
    }),
  );
const unhold = (db: Backend, name: string) =>
  runCall(
    db,
    Q_RELEASE,
    Q_RELEASE.call({
      keys: { key: `edgelock:qlock:{${name}}` },
      args: { token: FOREIGN, graceMs: FENCE_GRACE_MS, fence: 0, at: 0, seen: 0 },
    }),
  );
const runCall = (db: Backend, script: Script, { keys, args }: ScriptCall) =>
  runScript(db.redis, script, keys, args);
// A quorum script on database `db`, on the record `key`, with its arguments by name.
const on =
  (db: Backend, key: string) =>
  <C extends Contract>(script: ContractScript<C>, args: CallOf<C>["args"]) =>
    runCall(db, script, script.call({ keys: { key }, args } as CallOf<C>));

// Loads every script on every database `locks` reaches: an EVALSHA before the first load answers
// NOSCRIPT, which a test that delays a script's replies would take for a late answer.
const loadScripts = async (locks: QuorumLocks) =>
  void await locks.release(acquired(await locks.acquire(keygen("q"))));

// Each database's client, its acquires sent through `send` where `slow(i)` says so (asked once per
// acquire, in the order they are sent).
async function slowAcquires(
  plain: RedisLike[],
  send: (request: () => Promise<unknown>) => Promise<unknown>,
  slow: (i: number) => boolean,
): Promise<RedisLike[]> {
  const acquireSha = await Q_ACQUIRE.sha1();
  return plain.map((redis, i) => ({
    evalsha: (sha, keys, args) =>
      sha === acquireSha && slow(i)
        ? send(() => redis.evalsha(sha, keys, args))
        : redis.evalsha(sha, keys, args),
    eval: (source, keys, args) => redis.eval(source, keys, args),
  }));
}

// The broken variant: the commit does nothing, so fences rest on the databases' clocks alone.
async function withoutCommit(redis: RedisLike): Promise<RedisLike> {
  const sha = await Q_COMMIT.sha1();
  return {
    evalsha: (s, keys, args) => s === sha ? Promise.resolve(1) : redis.evalsha(s, keys, args),
    eval: (source, keys, args) => redis.eval(source, keys, args),
  };
}

// Five databases; 2, 3 and 4 with clocks of their own, to be set behind.
async function startFive(): Promise<{ dbs: Backend[]; shifted: ShiftedRedisServer[] }> {
  const dbs: Backend[] = [];
  const shifted: ShiftedRedisServer[] = [];
  try {
    for (let i = 0; i < 5; i++) {
      if (i < 2) dbs.push(await startBackend());
      else {
        const server = await startShiftedRedisServer();
        shifted.push(server);
        dbs.push(await startBackend([], server));
      }
    }
  } catch (error) {
    await Promise.all(dbs.map((db) => db.stop()));
    throw error;
  }
  return { dbs, shifted };
}

// Five databases the tests share; a test that stops some starts five of its own.
const fixture = shared(async () => {
  const { dbs, shifted } = await startFive();
  const locks = new QuorumLocks(dbs.map((db) => db.redis), { timeoutMs: 300 });
  return { dbs, shifted, locks };
}, async ({ dbs }) => {
  await Promise.all(dbs.map((db) => db.stop()));
});

Deno.test("a majority grants the lease; a second caller is busy; fences increase", async () => {
  const { locks } = await fixture();
  assert.equal(locks.quorum, 3);
  const name = keygen("q");
  const first = acquired(await locks.acquire(name, { ttlMs: 5000 }));
  assert.ok(first.expiresAt - Date.now() <= 5000 - 50, "validity is less than the TTL");
  assert.equal((await locks.acquire(name)).acquired, false);
  const info = await locks.inspect(name);
  assert.ok(info.held && info.fence === first.fence);
  assert.ok((await locks.renew(first)).renewed);
  assert.equal(await locks.release(first), true);
  const second = acquired(await locks.acquire(name));
  assert.ok(second.fence > first.fence);
  await locks.release(second);
  const ran = await locks.withLock(name, { ttlMs: 600 }, async (lease) => {
    await new Promise((resolve) => setTimeout(resolve, 900)); // renewed on a majority
    return lease.fence;
  });
  assert.ok(ran > second.fence);
});

Deno.test("a late retry of an earlier lease's release or renew never acts on the same token's next lease", async () => {
  const { locks } = await fixture();
  const name = keygen("q");
  const token = "chosen-quorum-token-0001"; // the README's choose-your-token retry pattern
  const first = acquired(await locks.acquire(name, { token, ttlMs: 5000 }));
  assert.equal(await locks.release(first), true);
  const second = acquired(await locks.acquire(name, { token, ttlMs: 5000 }));
  assert.ok(second.fence > first.fence);
  assert.equal(await locks.release(first), false, "the first lease is gone");
  assert.equal((await locks.renew(first)).renewed, false, "and cannot be renewed");
  const info = await locks.inspect(name);
  assert.ok(info.held && info.fence === second.fence, "the second lease still holds");
  assert.equal((await locks.acquire(name)).acquired, false, "so another token is busy");
  assert.ok((await locks.renew(second)).renewed);
  assert.equal(await locks.release({ name, token }), true, "without a fence: the token's lease");
  for (const fence of [1.5, 0, "7"]) {
    await assert.rejects(locks.release({ ...second, fence } as Lease), /fence must be a positive/);
  }
});

// Requests a slow database answers too late: held until `open`, then sent (the runner counts the
// database down meanwhile, and does not cancel the request).
function lateGate() {
  let open!: () => void;
  const gate = new Promise<void>((resolve) => (open = resolve));
  const late: Promise<unknown>[] = [];
  const send = (request: () => Promise<unknown>) => {
    const landed = gate.then(request);
    late.push(landed);
    return landed;
  };
  return { send, late, landAll: () => (open(), Promise.allSettled(late)) };
}

Deno.test("a failed attempt's clean-up that lands after the same acquire's next attempt won frees nothing", async () => {
  const { dbs } = await fixture();
  const name = keygen("q");
  const plain = dbs.map((db) => db.redis as RedisLike);
  for (const db of dbs.slice(2)) await hold(db, name);
  const release = await Q_RELEASE.sha1();
  const { send, late, landAll } = lateGate();
  let acquiring = true;
  let freed: Promise<unknown> | undefined;
  // This caller's releases during its acquire (an attempt's clean-up) land late; at the first,
  // the other holder lets go, so the next attempt wins.
  const slow = (redis: RedisLike): RedisLike => ({
    evalsha: (sha, keys, args) => {
      if (sha !== release || !acquiring) return redis.evalsha(sha, keys, args);
      freed ??= Promise.all(dbs.slice(2).map((db) => unhold(db, name)));
      return send(() => redis.evalsha(sha, keys, args));
    },
    eval: (source, keys, args) => redis.eval(source, keys, args),
  });
  const mine = new QuorumLocks(plain.map(slow), { timeoutMs: 300 });
  const lease = acquired(await mine.acquire(name, { ttlMs: 10_000, waitMs: 10_000 }));
  acquiring = false;
  await landAll();
  assert.ok(late.length > 0, "an attempt failed and cleaned up");
  const other = new QuorumLocks(plain, { timeoutMs: 300 });
  assert.equal((await other.acquire(name)).acquired, false, "no one else takes the name");
  assert.ok((await mine.renew(lease)).renewed, "the lease still renews");
  assert.equal(await mine.release(lease), true);
});

Deno.test("a failed attempt's commit that lands after the next attempt won leaves its lease renewable", async () => {
  const { dbs, shifted } = await fixture();
  const name = keygen("q");
  const plain = dbs.map((db) => db.redis as RedisLike);
  // Database 4 runs 10 minutes ahead, so the first attempt's fence is above the next one's.
  await shifted[2]!.shift(600_000);
  try {
    const commit = await Q_COMMIT.sha1();
    const { send, landAll } = lateGate();
    const gated = new Set<number>();
    let down = false;
    // The first commit to each of databases 0 to 3 lands late; database 4 is down from its first.
    const wrap = (redis: RedisLike, i: number): RedisLike => ({
      evalsha: (sha, keys, args) => {
        if (i === 4 && sha === commit) down = true;
        if (i === 4 && down) return Promise.reject(new Error("database 4 unreachable"));
        if (sha !== commit || i === 4 || gated.has(i)) return redis.evalsha(sha, keys, args);
        gated.add(i);
        return send(() => redis.evalsha(sha, keys, args));
      },
      eval: (source, keys, args) => redis.eval(source, keys, args),
    });
    const locks = new QuorumLocks(plain.map(wrap), { timeoutMs: 300 });
    const lease = acquired(await locks.acquire(name, { ttlMs: 10_000, waitMs: 10_000 }));
    await landAll();
    assert.equal(gated.size, 4, "the first attempt's commits landed late");
    assert.ok((await locks.renew(lease)).renewed, "its renew");
    assert.equal(await locks.release(lease), true, "its release");
  } finally {
    await shifted[2]!.shift(0);
  }
});

Deno.test("a failed attempt's acquire that lands late never shortens the lease the call returned", async () => {
  const { dbs } = await fixture();
  const name = keygen("q");
  const plain = dbs.map((db) => db.redis as RedisLike);
  const acquireSha = await Q_ACQUIRE.sha1();
  const { send, landAll } = lateGate();
  const gated = new Set<number>();
  // The first acquire to databases 0, 1 and 2 lands late (helper-48).
  const wrap = (redis: RedisLike, i: number): RedisLike => ({
    evalsha: (sha, keys, args) => {
      if (sha !== acquireSha || i > 2 || gated.has(i)) return redis.evalsha(sha, keys, args);
      gated.add(i);
      return send(() => redis.evalsha(sha, keys, args));
    },
    eval: (source, keys, args) => redis.eval(source, keys, args),
  });
  const mine = new QuorumLocks(plain.map(wrap), { timeoutMs: 300 });
  const lease = acquired(await mine.acquire(name, { ttlMs: 1000, waitMs: 5000 }));
  assert.equal(gated.size, 3, "the first attempt's acquires to 0, 1 and 2 were slow");
  const renewal = await mine.renew(lease, { ttlMs: 60_000 });
  assert.ok(renewal.renewed);
  await landAll(); // they land now, asking for 1000 ms again
  await new Promise((resolve) => setTimeout(resolve, 1200));
  assert.ok(renewal.lease.expiresAt > Date.now(), "the renewed lease is valid");
  const other = new QuorumLocks(plain, { timeoutMs: 300 });
  assert.equal((await other.acquire(name)).acquired, false, "no one else takes the name");
  // A database keeps no lease's fence (helper-49: the highest floor was another lease's).
  await assert.rejects(mine.renew({ name, token: lease.token }), TypeError);
  assert.equal(await mine.release({ name, token: lease.token }), true, "a release by token");
});

Deno.test("a majority that answers an acquire after its deadline frees those holds once it answers", async () => {
  const { dbs } = await fixture();
  const name = keygen("q");
  const plain = dbs.map((db) => db.redis as RedisLike);
  const { send, landAll } = lateGate();
  // The acquires to databases 0, 1 and 2 land after the deadline: no majority in time.
  const mine = new QuorumLocks(await slowAcquires(plain, send, (i) => i <= 2), { timeoutMs: 300 });
  const other = new QuorumLocks(plain, { timeoutMs: 300 });
  await loadScripts(other);
  assert.equal((await mine.acquire(name, { ttlMs: 60_000 })).acquired, false);
  // They grant now, for a minute: the attempt frees them as their answers come.
  const landed = await landAll();
  assert.deepEqual(landed.map((l) => l.status === "fulfilled" && (l.value as number[])[0]), [
    1,
    1,
    1,
  ]);
  await until("the late holds are freed", async () => !(await other.inspect(name)).held);
  const lease = acquired(await other.acquire(name));
  assert.equal(await other.release(lease), true);
});

// Requests land at once, but their replies come only at `open` (a slow network back): the
// runner's deadline passes first.
function replyGate() {
  let open!: () => void;
  const gate = new Promise<void>((resolve) => (open = resolve));
  const landed: Promise<unknown>[] = [];
  const send = (request: () => Promise<unknown>) => {
    const reply = request();
    landed.push(reply);
    return reply.then(async (value) => (await gate, value));
  };
  return { send, open: () => (open(), Promise.allSettled(landed)) };
}

// A name whose leader database (the one a retry asks first) is `leader`, as QuorumLocks picks it.
function nameLedBy(leader: number): string {
  for (;;) {
    const name = keygen("q");
    let hash = 0x811c9dc5;
    for (let i = 0; i < name.length; i++) hash = Math.imul(hash ^ name.charCodeAt(i), 0x01000193);
    if ((hash >>> 0) % 5 === leader) return name;
  }
}

Deno.test("a slow majority on every attempt of a waiting acquire leaves the name free once it answers", async () => {
  // helper-56: each retry reached the slow databases before the earlier attempt's clean-up and
  // only extended its hold, which was then left to the TTL.
  const { dbs } = await fixture();
  const name = keygen("q");
  const plain = dbs.map((db) => db.redis as RedisLike);
  const other = new QuorumLocks(plain, { timeoutMs: 2000 });
  await loadScripts(other);
  const { send, open } = replyGate();
  let slow = 0;
  const clients = await slowAcquires(plain, send, (i) => i >= 2 && slow++ >= 0);
  const mine = new QuorumLocks(clients, { timeoutMs: 200 });
  assert.equal((await mine.acquire(name, { ttlMs: 60_000, waitMs: 500 })).acquired, false);
  assert.ok(slow >= 6, `${slow} slow acquires: two attempts at least`);
  await open();
  await until("the late holds are freed", async () => !(await other.inspect(name)).held);
  assert.equal(await other.release(acquired(await other.acquire(name))), true);
});

Deno.test("a retry that asks a slow leader twice frees both holds once they answer", async () => {
  // helper-56: the leader asked first, late, then again with the others: the second hold extends
  // the first, and was left to the TTL, making every contender's retry busy at that leader.
  const { dbs } = await fixture();
  const name = nameLedBy(0);
  const plain = dbs.map((db) => db.redis as RedisLike);
  const other = new QuorumLocks(plain, { timeoutMs: 2000 });
  await loadScripts(other);
  for (const db of dbs.slice(2)) await hold(db, name);
  try {
    const { send, open } = replyGate();
    let asked = 0;
    // slow from the first retry on
    const clients = await slowAcquires(plain, send, (i) => i === 0 && asked++ >= 1);
    const mine = new QuorumLocks(clients, { timeoutMs: 200 });
    assert.equal((await mine.acquire(name, { ttlMs: 60_000, waitMs: 1000 })).acquired, false);
    assert.ok(asked >= 3, `the leader asked ${asked} times: first, then twice in a retry`);
    await open();
    const key = `edgelock:qlock:{${name}}`;
    await until("the leader's holds are freed", async () => {
      return String(await dbs[0]!.redis.get(key)).split("|")[1] === "";
    });
  } finally {
    for (const db of dbs.slice(2)) await unhold(db, name);
  }
});

Deno.test("a renew's length is the lease's own ttlMs within the limits, and checked", async () => {
  const { locks } = await fixture();
  const name = keygen("q");
  const lease = acquired(await locks.acquire(name, { ttlMs: 5000 }));
  await assert.rejects(locks.renew({ ...lease, ttlMs: "7" as unknown as number }), TypeError);
  const long = await locks.renew({ ...lease, ttlMs: 1e12 });
  assert.ok(long.renewed && long.lease.ttlMs === 300_000, "cut to the longest lease");
  const short = await locks.renew({ ...lease, ttlMs: -1000 });
  // 100 ms may be spent before the reply comes: then it is not renewed, never freed
  if (short.renewed) assert.equal(short.lease.ttlMs, 100, "raised to the shortest");
  assert.ok((await locks.inspect(name)).held, "a negative ttlMs never frees it");
  const given = await locks.renew({ ...lease, ttlMs: null as unknown as number }, { ttlMs: 5000 });
  assert.ok(given.renewed && given.lease.ttlMs === 5000, "a given ttlMs wins, the lease's unread");
  // helper-51: every lease is checked before any is renewed, and unknown options are refused
  await assert.rejects(locks.renewMany([lease, { name, token: lease.token }]), TypeError);
  await assert.rejects(locks.renewMany([]), RangeError);
  await assert.rejects(locks.renew(lease, { ttl: 5000 } as never), /no option "ttl"/);
  await assert.rejects(locks.acquire(keygen("q"), { ttl: 5000 } as never), /did you mean "ttlMs"/);
  assert.equal(await locks.release(lease), true);
});

Deno.test("a late commit or clean-up never acts on a later hold of the token that ends in the same millisecond", async () => {
  const { dbs } = await fixture();
  const db = dbs[0]!;
  const name = keygen("q");
  const key = `edgelock:qlock:{${name}}`;
  const token = "chosen-quorum-token-0002";
  const run = on(db, key);
  // The earlier attempt's acquire: its hold ends at E, under floor 0.
  const [ok, seen, , at] = await run(
    Q_ACQUIRE,
    { token, ttlMs: 30_000, graceMs: FENCE_GRACE_MS },
  ) as number[];
  assert.equal(ok, 1);
  const earlier = {
    token,
    graceMs: FENCE_GRACE_MS,
    fence: 1_000_000_000_000_001,
    at: at!,
    seen: seen!,
  };
  // A later call of the token holds it now, by a hold that ends in the same millisecond (a shorter
  // TTL after a release, helper-49), and committed its fence there.
  const later = 1_000_000_000_000_002;
  await db.redis.set(key, `${later}|${token}|${at}`, { px: 60_000 });
  assert.equal(await run(Q_RELEASE, earlier), 0, "the earlier clean-up frees nothing");
  assert.equal(await run(Q_COMMIT, earlier), 0, "the earlier commit raises nothing");
  assert.equal(await db.redis.get(key), `${later}|${token}|${at}`);
  // Before the later commit, the earlier clean-up may free the hold: the later commit then fails
  // there, so that database never counts for the later lease.
  await db.redis.set(key, `${seen}|${token}|${at}`, { px: 60_000 });
  assert.equal(await run(Q_RELEASE, earlier), 1);
  assert.equal(await run(Q_COMMIT, { ...earlier, fence: later }), 0);
  // Two attempts that saw the same floors pick the same fence (floor + 1, the clocks behind): a
  // later hold committed with the earlier attempt's very fence is not taken for its own
  // (helper-52), nor counted as its commit (helper-53: the later lease and this attempt were both
  // valid, with one fence). So an attempt's clean-up frees nothing where its commit landed, and a
  // duplicate of its commit answers 0: those holds stay to the TTL.
  await db.redis.set(key, `${earlier.fence}|${token}|${at}`, { px: 60_000 });
  assert.equal(await run(Q_RELEASE, earlier), 0, "a later hold at the same fence stays");
  assert.equal(await run(Q_COMMIT, earlier), 0, "and is not taken for this attempt's commit");
  assert.equal(await db.redis.get(key), `${earlier.fence}|${token}|${at}`, "unchanged");
});

Deno.test("a renew moves the end of every hold it counts, so a clean-up named by the old end frees nothing", async () => {
  // helper-57: a lease's renewal counted a hold an attempt's acquire had made (whose answer came
  // late, its commit never sent there) without moving its end (a shorter ttlMs, or a clock stepped
  // back), and the attempt's clean-up then freed it while the renewed lease was valid.
  const { dbs } = await fixture();
  const db = dbs[1]!;
  const name = keygen("q");
  const key = `edgelock:qlock:{${name}}`;
  const token = "chosen-quorum-token-0003";
  const run = on(db, key);
  const [ok, seen, , at] = await run(
    Q_ACQUIRE,
    { token, ttlMs: 30_000, graceMs: FENCE_GRACE_MS },
  ) as number[];
  assert.equal(ok, 1);
  const renewed = await run(
    Q_RENEW,
    { token, ttlMs: 1000, graceMs: FENCE_GRACE_MS, fence: seen! + 1 },
  );
  assert.equal(renewed, 1, "the renewal counts the hold");
  const cleanUp = { token, graceMs: FENCE_GRACE_MS, fence: 0, at: at!, seen: seen! };
  assert.equal(await run(Q_RELEASE, cleanUp), 0, "the clean-up frees nothing");
  const [, holder, end] = String(await db.redis.get(key)).split("|");
  assert.equal(holder, token);
  assert.ok(Number(end) > at!, "held past the old end");
});

Deno.test("a hold a renewal counts is the renewing lease's: an earlier lease's late release frees nothing", async () => {
  // helper-58: a chosen token's second lease L2 counted, at its renewal, a hold where its commit
  // had not landed (the floor still the first lease's fence F1), and L1's late release by F1 then
  // freed it while the renewed L2 was valid.
  const { dbs } = await fixture();
  const db = dbs[3]!;
  const name = keygen("q");
  const key = `edgelock:qlock:{${name}}`;
  const token = "chosen-quorum-token-0004";
  const [first, second] = [1_000_000_000_000_101, 1_000_000_000_000_102];
  // L1 committed here; L2's acquire extended that hold, and its commit never came.
  await db.redis.set(key, `${first}|${token}|${Date.now() + 30_000}`, { px: 60_000 });
  const run = on(db, key);
  const renew = { token, ttlMs: 1000, graceMs: FENCE_GRACE_MS, fence: second };
  assert.equal(await run(Q_RENEW, renew), 1, "L2's renewal counts the hold");
  const lateRelease = { token, graceMs: FENCE_GRACE_MS, fence: first, at: 0, seen: 0 };
  assert.equal(await run(Q_RELEASE, lateRelease), 0, "L1's late release frees nothing");
  const [floor, holder] = String(await db.redis.get(key)).split("|");
  assert.deepEqual([Number(floor), holder], [second, token]);
});

Deno.test("a failed acquire with a live lease's token never frees that lease", async () => {
  const { dbs } = await fixture();
  const name = keygen("q");
  const token = "chosen-quorum-token-0003";
  const plain = dbs.map((db) => db.redis as RedisLike);
  const locks = new QuorumLocks(plain, { timeoutMs: 300 });
  acquired(await locks.acquire(name, { token, ttlMs: 30_000 }));
  // Another call with the token beside it (a retry): its commits land late everywhere but on
  // database 4, so it fails (helper-52). Its clean-up would have freed the first lease's holds,
  // which its acquire only extended.
  const commit = await Q_COMMIT.sha1();
  const { send, landAll } = lateGate();
  const slow = (redis: RedisLike, i: number): RedisLike => ({
    evalsha: (sha, keys, args) =>
      sha === commit && i < 4
        ? send(() => redis.evalsha(sha, keys, args))
        : redis.evalsha(sha, keys, args),
    eval: (source, keys, args) => redis.eval(source, keys, args),
  });
  const retry = new QuorumLocks(plain.map(slow), { timeoutMs: 300 });
  assert.equal((await retry.acquire(name, { token, ttlMs: 30_000 })).acquired, false);
  await landAll();
  const other = new QuorumLocks(plain, { timeoutMs: 300 });
  assert.equal((await other.acquire(name)).acquired, false, "no one else takes the name");
  // Its late commits may have raised the floors past the first lease's fence (a repeated acquire is
  // a new lease): the token's release still ends it.
  assert.equal(await locks.release({ name, token }), true);
  assert.ok((await other.acquire(name)).acquired, "free after the release");
});

Deno.test("a failed acquire frees the databases it held", async () => {
  const { dbs, locks } = await fixture();
  const name = keygen("q");
  for (const db of dbs.slice(0, 3)) await hold(db, name);
  const result = await locks.acquire(name, { token: "loser-token-0000000001" });
  assert.equal(result.acquired, false);
  for (const db of dbs.slice(3)) {
    const value = await db.redis.get(`edgelock:qlock:{${name}}`);
    assert.ok(!String(value).includes("loser-token"), `left held: ${value}`);
  }
  for (const db of dbs.slice(0, 3)) await unhold(db, name);
  const free = acquired(await locks.acquire(name));
  await locks.release(free);
});

Deno.test("two databases down: still a majority; three down: no lease", async () => {
  const { dbs, shifted } = await startFive();
  const locks = new QuorumLocks(dbs.map((db) => db.redis), { timeoutMs: 300 });
  try {
    const name = keygen("q");
    await dbs[0]!.server.stop({ remove: false });
    await dbs[1]!.server.stop({ remove: false });
    const lease = acquired(await locks.acquire(name));
    await locks.release(lease);
    await shifted[0]!.stop({ remove: false });
    assert.equal((await locks.acquire(keygen("q"))).acquired, false, "2 of 5 is no majority");
  } finally {
    await Promise.all(dbs.map((db) => db.stop()));
  }
});

// A takes {0, 1, 2}; then B takes {2, 3, 4}: they share only database 2, database 1 lost its
// data, and B's databases' clocks are 10 minutes behind A's.
async function scenario(locks: QuorumLocks) {
  const { dbs, shifted } = await fixture();
  const name = keygen("q");
  for (const db of dbs.slice(3)) await hold(db, name);
  const a = acquired(await locks.acquire(name));
  await locks.release(a);
  for (const db of dbs.slice(3)) await unhold(db, name);
  for (const server of shifted) await server.shift(-600_000);
  await dbs[1]!.redis.flushall();
  await hold(dbs[0]!, name);
  await hold(dbs[1]!, name);
  const b = acquired(await locks.acquire(name));
  await locks.release(b);
  for (const server of shifted) await server.shift(0);
  return { a: a.fence, b: b.fence };
}

Deno.test("a quorum fence is above every earlier one, even when the majorities share one database: with the commit, B's fence is above A's", async () => {
  const { dbs } = await fixture();
  const { a, b } = await scenario(new QuorumLocks(dbs.map((db) => db.redis)));
  assert.ok(b > a, `A ${a}, B ${b}`);
});

Deno.test("a quorum fence is above every earlier one, even when the majorities share one database: without it (the broken variant), B's fence falls below A's", async () => {
  const { dbs } = await fixture();
  const broken = await Promise.all(dbs.map((db) => withoutCommit(db.redis)));
  const { a, b } = await scenario(new QuorumLocks(broken));
  assert.ok(b <= a, `the broken variant went unnoticed: A ${a}, B ${b}`);
});
