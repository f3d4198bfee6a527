// The scripts' own contract, checked on a real redis-server: declared keys in one slot, a TTL on
// every key written, SHA-1s, and sane answers under a stepped server clock, on keys that lost
// their TTL and on records this code did not write.
import assert from "node:assert/strict";
import { Redis as IORedis } from "ioredis";
import { Locks } from "../src/core/locks.ts";
import { Jobs } from "../src/uses/jobs.ts";
import { recordId, Records } from "../src/uses/records.ts";
import * as scripts from "../src/core/lua/mod.ts";
import * as useScripts from "../src/uses/scripts.ts";
import * as quorumScripts from "../src/quorum/scripts.ts";
import type { Script } from "../src/core/lua/_define.ts";
import { MIN_RETRY_MS } from "../src/core/lua/lib.ts";
import { FENCE_GRACE_MS } from "../src/core/_validate.ts";
import { startShiftedRedisServer } from "../dev/clock_shift.ts";
import { slotOf } from "../dev/redis_cluster.ts";
import { type Backend, keygen, shared, startBackend, takeTicket, until } from "./_backend.ts";
import { everyOperation } from "./_every_operation.ts";

const lockKey = (name: string) => `edgelock:lock:{${name}}`;

const PREFIX_KEY = /^edgelock:(stats|held|held:ends|audit)$/;
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Every script of both script modules. */
const ALL = [scripts, useScripts, quorumScripts].flatMap(
  Object.values,
).filter((
  value,
): value is Script =>
  typeof value === "object" && value !== null && "source" in value && "sha1" in value
);

/**
 * What a script's source says about its keys: the key of every `redis.call`/`redis.pcall` must
 * be `KEYS[…]`, a variable, or a helper returning `KEYS[…]`, and every assignment to such a
 * variable must be `KEYS[…]` (a function parameter gets what its caller passes, checked there).
 * Returns the offences; a key built in the script (`KEYS[1] .. ':deadline'`) is one.
 */
function undeclaredKeys(source: string): string[] {
  const offences: string[] = [];
  const variables = new Set<string>();
  for (
    const [, command, key] of source.matchAll(
      /redis\.p?call\(\s*'(\w+)'\s*,\s*([^,()]+(?:\([^()]*\))?)/g,
    )
  ) {
    const arg = key!.trim();
    if (/^KEYS\[[^\]]+\]$/.test(arg)) continue;
    const helper = /^(\w+)\(\w*\)$/.exec(arg)?.[1];
    if (helper) {
      const body = new RegExp(`local function ${helper}\\(\\w*\\) return (KEYS\\[[^\\]]+\\]) end`);
      if (!body.test(source)) offences.push(`${command} on ${arg}: not a KEYS helper`);
    } else if (/^\w+$/.test(arg)) variables.add(arg);
    else offences.push(`${command} on ${arg}: a key built in the script`);
  }
  for (const line of source.split("\n")) {
    const assignment = /^\s*(?:local\s+)?(\w+(?:\s*,\s*\w+)*)\s*=(?!=)\s*(.*?)\s*(?:--.*)?$/.exec(
      line,
    );
    if (!assignment) continue;
    const names = assignment[1]!.split(",").map((name) => name.trim());
    const values = assignment[2]!.split(/,\s*(?![^\[]*\])/).map((value) => value.trim());
    names.forEach((name, i) => {
      if (variables.has(name) && !/^KEYS\[[^\]]+\]$/.test(values[i] ?? "")) {
        offences.push(`${name} = ${values[i] ?? "nothing"}: not a declared key`);
      }
    });
  }
  return offences;
}

/**
 * Runs every operation under MONITOR: each command a script runs (COMMAND GETKEYS) must touch only
 * the keys its call declared, and the declared keys must share one slot (in the single layout,
 * except the prefix's stats, held index and audit stream, which are its own keys).
 */
async function sweep(backend: Backend, cluster: boolean) {
  const monitor = await new IORedis(backend.server.url, { retryStrategy: () => null }).monitor();
  const seen: { source: string; args: string[] }[] = [];
  monitor.on("monitor", (_time: string, args: string[], source: string) => {
    seen.push({ source, args });
  });
  try {
    await everyOperation(backend, cluster);
    await sleep(100); // MONITOR lines arrive after the replies
  } finally {
    monitor.disconnect();
  }
  const query = new IORedis(backend.server.url, { retryStrategy: () => null });
  try {
    let declared: string[] | undefined;
    let scriptCalls = 0;
    const failures: string[] = [];
    for (const { source, args } of seen) {
      const command = args[0]!.toLowerCase();
      if (source !== "lua") {
        declared = command === "eval" || command === "evalsha"
          ? args.slice(3, 3 + Number(args[2]))
          : undefined;
        if (declared) {
          scriptCalls++;
          const own = cluster ? declared : declared.filter((key) => !PREFIX_KEY.test(key));
          const slots = new Set(own.map(slotOf));
          if (slots.size > 1) failures.push(`${args[0]} ${declared} spans ${slots.size} slots`);
          if (own.some((key) => !key.includes("{"))) failures.push(`${declared} untagged`);
        }
        continue;
      }
      const keys = await query.call("COMMAND", "GETKEYS", ...args).catch(() => []);
      for (const key of keys as string[]) {
        if (!declared?.includes(key)) failures.push(`${args.join(" ")}: ${key} not in KEYS`);
      }
    }
    assert.ok(scriptCalls > 40, `saw ${scriptCalls} script calls`);
    assert.deepEqual(failures, []);
  } finally {
    query.disconnect();
  }
}

const fixture = shared(async () => {
  const backend = await startBackend();
  const { redis } = backend;
  return { backend, redis };
}, ({ backend }) => backend.stop());

Deno.test("no script source builds a key: each is read from KEYS", () => {
  assert.ok(ALL.length > 20, `${ALL.length} scripts`);
  for (const script of ALL) assert.deepEqual(undeclaredKeys(script.source), [], script.name);
  // The scan itself catches the forms it looks for.
  const built = "local q = KEYS[1]\nlocal d = q .. ':deadline'\nredis.call('HGET', d, 'x')";
  assert.deepEqual(undeclaredKeys(built), ["d = q .. ':deadline': not a declared key"]);
  assert.equal(undeclaredKeys("redis.call('GET', KEYS[1] .. ':x')").length, 1);
  assert.equal(
    undeclaredKeys("local function k(i) return 'x' .. i end\nredis.call('GET', k(1))")
      .length,
    1,
  );
});

for (const cluster of [false, true]) {
  Deno.test(
    cluster
      ? "in the cluster layout, every script's keys, stats included, share one hash slot"
      : "every script touches only keys it declares in KEYS; a name's keys share one hash slot",
    async () => {
      const { backend } = await fixture();
      await sweep(backend, cluster);
    },
  );
}

Deno.test("a lock record written in an earlier form (H, with or without a hold count) is read as held", async () => {
  const { redis } = await fixture();
  const locks = new Locks(redis);
  // Without a hold count, and with one: each `H` record, its times in ms since the epoch.
  for (
    const [count, meta] of [["", ""], ["", '{"by":"old"}'], ["1|", ""], ["1|", '{"by":"old"}']]
  ) {
    const name = keygen();
    const token = "old-version-token-00001";
    const [seconds, micros] = (await redis.time()).map(Number);
    const now = seconds! * 1000 + Math.floor(micros! / 1000);
    await redis.set(
      lockKey(name),
      `H${now * 1000}|${now + 5000}|${now}|20|0|${token}||${count}${meta}`,
      {
        px: 60_000,
      },
    );
    const info = await locks.inspect(name);
    assert.ok(info.held && info.fence === now * 1000, JSON.stringify(info));
    assert.equal(await locks.release({ name, token }), true, "its holder releases it");
    const next = await locks.acquire(name);
    assert.ok(next.acquired && next.lease.fence > now * 1000);
    await locks.release(next.lease);
  }
});

async function serverMs(redis: { time(): Promise<number[] | string[]> }): Promise<number> {
  const [seconds, micros] = (await redis.time()).map(Number);
  return seconds! * 1000 + Math.floor(micros! / 1000);
}

// An earlier build's records (H) count their times from the epoch: fences here are not their
// grant times, so reading them as X (from the fence's millisecond) would be caught.
Deno.test("an H lease ends at its own end, and stays H while it lasts", async () => {
  const { redis } = await fixture();
  const locks = new Locks(redis);
  const token = "old-version-token-00001";
  const now = await serverMs(redis);
  const ended = keygen();
  await redis.set(
    lockKey(ended),
    `H${(now - 6000) * 1000}|${now - 1000}|${now - 6000}|20|0|${token}||1|`,
    { px: 60_000 },
  );
  assert.equal((await locks.inspect(ended)).held, false, "ended a second ago");
  const next = await locks.acquire(ended);
  assert.ok(next.acquired, "free: its lease ended");
  assert.match(String(await redis.get(lockKey(ended))), /^X/, "a new grant is written X");
  await locks.release(next.lease);

  const live = keygen();
  const end = now + 5000;
  await redis.set(
    lockKey(live),
    `H${(now - 1000) * 1000}|${end}|${now - 1000}|20|0|${token}||1|`,
    { px: 60_000 },
  );
  const info = await locks.inspect(live);
  assert.ok(info.held && info.ttlMs > 4000 && info.ttlMs <= 5000, JSON.stringify(info));
  const busy = await locks.acquire(live);
  assert.ok(!busy.acquired && busy.retryAfterMs <= 5000, JSON.stringify(busy));
  // The busy look noted contention in the record: still H, with its end, so the earlier build's
  // holder still reads its lease; so after a renew.
  assert.match(
    String(await redis.get(lockKey(live))),
    new RegExp(`^H\\d+\\|${end}\\|\\d+\\|20\\|1\\|`),
  );
  const renewed = await locks.renew({ name: live, token }, { ttlMs: 8000 });
  assert.ok(renewed.renewed);
  assert.match(String(await redis.get(lockKey(live))), /^H\d+\|\d{13}\|/);
  assert.equal(await locks.release({ name: live, token }), true);
});

// A waiter that gives up as a release hands it the lock finds its lease in the record: in either
// form, and with the X form's times negative (a fence ahead of a stepped-back clock).
Deno.test("a waiter leaving finds the lease handed to it in an H record or an X one before its fence", async () => {
  const { redis } = await fixture();
  const now = await serverMs(redis);
  const ahead = (now + 600_000) * 1000 + 7; // a fence 10 minutes ahead of the clock
  for (
    const [fence, record] of [
      [(now - 1000) * 1000, (f: number) => `H${f}|${now + 3000}|${now - 1000}|20|0|`],
      [ahead, (f: number) => `X${f}|${now + 3000 - Math.floor(f / 1000)}|-600000|20|0|`],
    ] as const
  ) {
    const name = keygen();
    const token = "handed-waiter-token-0001";
    const key = lockKey(name);
    const wakeId = "wTestWake0001";
    const wakeKey = `${key}:wake:${wakeId}`;
    await redis.set(key, `${record(fence)}${token}||1|`, { px: 60_000 });
    await redis.rpush(wakeKey, `${fence}:${now + 3000}:${now}:`, `r${fence}`);
    await redis.pexpire(wakeKey, 10_000);
    const { keys, args } = scripts.LEAVE_QUEUE.call({
      keys: {
        queueKey: `${key}:queue`,
        ticketsKey: `${key}:tickets`,
        offersKey: `${key}:offers`,
        lockKey: key,
        wakeKey,
        holdersKey: `${key}:holders`,
      },
      args: { member: token, outcome: "", wakeId, ticketEnd: "", seenFence: 0, hold: "" },
    });
    const reply = await redis.eval(scripts.LEAVE_QUEUE.source, keys, args) as number[];
    assert.equal(reply[0], 2, `${record(fence)}: ${JSON.stringify(reply)}`);
    assert.equal(reply[1], fence);
    assert.ok(reply[2]! > 2000 && reply[2]! <= 3000, `lease left ${reply[2]}`);
    await redis.del(key, wakeKey);
  }
});

Deno.test("every key the scripts write carries a TTL", async () => {
  const { backend, redis } = await fixture();
  await everyOperation(backend);
  const keys = await redis.keys("edgelock:*");
  assert.ok(keys.length > 5);
  const forever = [];
  for (const key of keys) if (await redis.pttl(key) < 0) forever.push(key);
  assert.deepEqual(forever, [], "keys without a TTL");
});

Deno.test("the lock scripts' replies say none with nil, never an empty string", async () => {
  // @upstash/redis parses each text of a reply with JSON.parse, which throws on '' (about 5 µs
  // of the client's CPU each): an uncontended cycle's replies had two. The operators' reads
  // (a list's cursor, an audit entry's reason) may. Replies by EVALSHA, by EVAL (after a SCRIPT
  // FLUSH) and in pipelines (renewMany, a multi-name release) are all read.
  const { backend } = await fixture();
  const lockScripts = new Map<string, string>();
  const reads = ["list", "read_audit", "read_stats"];
  for (const script of Object.values(scripts) as Script[]) {
    if (typeof script !== "object" || !("sha1" in script) || reads.includes(script.name)) continue;
    for (const form of [script, script.keyLocked]) {
      lockScripts.set(await form.sha1(), script.name);
      lockScripts.set(form.source, script.name);
    }
  }
  const empty: string[] = [];
  const seen = { evalsha: 0, eval: 0, pipeline: 0 };
  const note = (via: keyof typeof seen, script: string, reply: unknown) => {
    const name = lockScripts.get(script);
    if (!name) return;
    seen[via]++;
    if (JSON.stringify(reply).includes('""')) empty.push(`${name}: ${JSON.stringify(reply)}`);
  };
  const target = backend.redis;
  type Run = (script: string, keys: string[], args: unknown[]) => Promise<unknown>;
  const redis = new Proxy(target, {
    get(_, property) {
      const value = Reflect.get(target, property);
      if (property === "evalsha" || property === "eval") {
        return async (script: string, keys: string[], args: unknown[]) => {
          const reply = await (value as Run).call(target, script, keys, args);
          note(property, script, reply);
          return reply;
        };
      }
      if (property === "pipeline") {
        return () => {
          const pipeline = target.pipeline();
          const sent: string[] = [];
          return {
            evalsha(sha: string, keys: string[], args: unknown[]) {
              sent.push(sha);
              pipeline.evalsha(sha, keys, args);
            },
            eval(source: string, keys: string[], args: unknown[]) {
              sent.push(source);
              pipeline.eval(source, keys, args);
            },
            async exec(options: { keepErrors: true }) {
              const replies = await pipeline.exec(options);
              replies.forEach(({ result }, i) => note("pipeline", sent[i]!, result));
              return replies;
            },
          };
        };
      }
      return typeof value === "function" ? value.bind(target) : value;
    },
  });
  await everyOperation(backend, false, { redis });
  await target.scriptFlush();
  await everyOperation(backend, false, { redis });
  assert.ok(seen.evalsha > 30 && seen.eval > 5 && seen.pipeline > 5, JSON.stringify(seen));
  assert.deepEqual(empty, []);
});

Deno.test("a busy look names the wake key to block on only when it is not the waiter's own", async () => {
  const { backend } = await fixture();
  const name = keygen();
  const holder = await takeTicket(backend.redis, name, "holder-token-00000001", 0);
  assert.equal(holder[0], 1);
  // The first waiter behind a lease granted with none waiting blocks on its successor key.
  const first = await takeTicket(backend.redis, name, "waiter-token-00000001", 2000, {
    wakeId: "wOwnWakeIdFirst1",
  });
  assert.deepEqual([first[0], first[3]], [0, 0]);
  assert.equal(first[7], `f${holder[1]}`, "the successor key's id");
  // The next one blocks on its own: the reply leaves it out (a text is a thrown JSON.parse).
  const second = await takeTicket(backend.redis, name, "waiter-token-00000002", 2000, {
    wakeId: "wOwnWakeIdNext02",
  });
  assert.deepEqual([second[0], second[3]], [0, 1]);
  assert.ok(!second[7], `no wake id: ${JSON.stringify(second)}`);
  assert.ok(second[8], "the ticket still comes after it");
});

Deno.test("each script's SHA-1 matches what SCRIPT LOAD returns", async () => {
  const { redis } = await fixture();
  assert.ok(ALL.length >= 14, `${ALL.length} scripts`);
  for (const script of ALL) {
    assert.equal(await script.sha1(), await redis.scriptLoad(script.source), script.name);
  }
});

Deno.test("a lock record found without a TTL still ends at its lease, and gets its TTL back", async () => {
  const { redis } = await fixture();
  const locks = new Locks(redis);
  const name = keygen();
  const held = await locks.acquire(name, { ttlMs: 5000 });
  assert.ok(held.acquired);
  await redis.persist(lockKey(name));
  const busy = await locks.acquire(name);
  assert.ok(!busy.acquired);
  assert.ok(busy.retryAfterMs >= MIN_RETRY_MS, `hint ${busy.retryAfterMs}`);
  assert.ok(busy.retryAfterMs <= 5000, "never past the lease's own end");
  const pttl = await redis.pttl(lockKey(name));
  assert.ok(
    pttl > FENCE_GRACE_MS && pttl <= FENCE_GRACE_MS + 5000,
    `the record has its TTL again: ${pttl}`,
  );
  await redis.persist(lockKey(name));
  const info = await locks.inspect(name);
  assert.ok(info.held && info.ttlMs > 0 && info.ttlMs <= 5000, JSON.stringify(info));
  const short = await locks.acquire(keygen(), { ttlMs: 200 });
  assert.ok(short.acquired);
  await redis.persist(lockKey(short.lease.name));
  await until("the lease ends without a TTL on its record", async () => {
    return (await locks.acquire(short.lease.name)).acquired;
  });
  assert.ok(await redis.pttl(lockKey(short.lease.name)) > 0, "the next write gave it one");
});

Deno.test("a record or job found without a TTL gets one, and callers are not told to retry at once", async () => {
  const { redis } = await fixture();
  const records = new Records(redis);
  const jobs = new Jobs(redis);
  const id = recordId("user-2", keygen("k"));
  const claim = await records.claim("idempotency", id, { leaseMs: 5000 });
  assert.equal(claim.state, "claimed");
  const key = `edgelock:idempotency:{${id}}`;
  await redis.persist(key);
  const busy = await records.claim("idempotency", id, { leaseMs: 5000 });
  assert.ok(busy.state === "in_progress" && busy.retryAfterMs > 1000, JSON.stringify(busy));
  assert.ok(await redis.pttl(key) > 0);
  await redis.persist(key);
  const state = await records.get("idempotency", id);
  assert.ok(state.state === "in_progress" && state.leaseExpiresAt > Date.now() - 1000);
  assert.ok(await redis.pttl(key) > 0);

  const job = keygen("job");
  const start = await jobs.start(job, { atMostMs: 5000, tick: "t1" });
  assert.ok(start.run);
  await redis.persist(`edgelock:job:{${job}}`);
  await redis.persist(`edgelock:job:{${job}}:tick:t1`);
  const running = await jobs.start(job, { atMostMs: 5000 });
  assert.ok(!running.run && running.retryAfterMs > 1000, JSON.stringify(running));
  const ticked = await jobs.start(job, { atMostMs: 5000, tick: "t1" });
  assert.ok(!ticked.run && ticked.retryAfterMs > 1000, JSON.stringify(ticked));
  assert.ok(await redis.pttl(`edgelock:job:{${job}}`) > 0);
  assert.ok(await redis.pttl(`edgelock:job:{${job}}:tick:t1`) > 0);
});

Deno.test("records and jobs this code did not write answer not held, never a Redis error", async () => {
  const { redis } = await fixture();
  const records = new Records(redis);
  const jobs = new Jobs(redis);
  const token = "hand-written-token-0001";
  const id = recordId("user-3", keygen("k"));
  await redis.hset(`edgelock:idempotency:{${id}}`, { state: "claimed", token }); // no retentionMs
  await redis.pexpire(`edgelock:idempotency:{${id}}`, 5000);
  assert.equal(await records.complete("idempotency", id, token, { status: 200 }), false);
  const job = keygen("job");
  await redis.hset(`edgelock:job:{${job}}`, { token, finished: "0" }); // no fence, notBefore
  await redis.pexpire(`edgelock:job:{${job}}`, 5000);
  assert.deepEqual(await jobs.extend(job, token, 1000), { extended: false });
  assert.equal(await jobs.finish(job, token), false);
  const other = recordId("user-3", keygen("k"));
  await redis.hset(`edgelock:idempotency:{${other}}`, { state: "odd", token });
  await redis.pexpire(`edgelock:idempotency:{${other}}`, 5000);
  const claim = await records.claim("idempotency", other, { token });
  assert.equal(claim.state, "in_progress", "an unknown state is never handed out as a claim");
});

const stepped = shared(async () => {
  const server = await startShiftedRedisServer();
  const backend = await startBackend([], server);
  const { redis } = backend;
  const locks = new Locks(redis);
  return { server, backend, redis, locks };
}, ({ backend }) => backend.stop());

Deno.test("a clock step back while a lock is held does not make waiters poll hot", async () => {
  const { server, backend, locks } = await stepped();
  const name = keygen();
  for (let i = 0; i < 3; i++) {
    const lease = await locks.acquire(name);
    assert.ok(lease.acquired);
    await server.shift(-60_000 * (i + 1)); // the server clock steps back a minute each time
    await locks.release(lease.lease);
  }
  const holder = await locks.acquire(name, { ttlMs: 10_000 });
  assert.ok(holder.acquired);
  const busy = await locks.acquire(name);
  assert.ok(!busy.acquired && busy.retryAfterMs >= MIN_RETRY_MS);
  const before = backend.requests();
  const waited = await locks.acquire(name, { waitMs: 300 });
  assert.equal(waited.acquired, false);
  const polls = backend.requests() - before;
  // With the hold time clamped, the waiter backs off as the hold goes on: about 10 looks.
  // A negative estimate made it look every millisecond (over 100 requests).
  assert.ok(polls <= 25, `${polls} requests in 300 ms`);
  await locks.release(holder.lease);
  await server.shift(0);
});

Deno.test("a clock step forward never gives a hint past the lock's own deadlines", async () => {
  const { server, redis, locks } = await stepped();
  const name = keygen();
  const lease = await locks.acquire(name);
  assert.ok(lease.acquired);
  await server.shift(3_600_000); // an hour ahead: the hold looks an hour long
  await locks.release(lease.lease);
  const holder = await locks.acquire(name, { ttlMs: 2000 });
  assert.ok(holder.acquired);
  const busy = await locks.acquire(name);
  assert.ok(!busy.acquired && busy.retryAfterMs <= 2000, `hint ${JSON.stringify(busy)}`);
  // Free, but kept for the head of the queue: the hint is bounded by the head's ticket.
  const head = "queue-head-token-000001";
  await takeTicket(redis, name, head, 1000);
  await locks.release(holder.lease);
  const reserved = await locks.acquire(name);
  assert.ok(!reserved.acquired && reserved.retryAfterMs <= 1000, JSON.stringify(reserved));
  await server.shift(0);
});

Deno.test("fences keep increasing when the clock steps back within the grace", async () => {
  const { server, locks } = await stepped();
  const name = keygen();
  const fences: number[] = [];
  for (const offset of [0, -30_000, -600_000, -5_000]) {
    await server.shift(offset);
    const lease = await locks.acquire(name, { ttlMs: 100 });
    assert.ok(lease.acquired);
    fences.push(lease.lease.fence);
    await locks.release(lease.lease);
  }
  for (let i = 1; i < fences.length; i++) assert.ok(fences[i]! > fences[i - 1]!, `${fences}`);
  await server.shift(0);
});

Deno.test("a lease whose fence is ahead of a stepped-back clock holds for its TTL, no more", async () => {
  const { server, redis, locks } = await stepped();
  const name = keygen();
  const first = await locks.acquire(name);
  assert.ok(first.acquired);
  await locks.release(first.lease);
  // The fence stays above the last one, 10 minutes ahead of the clock: the record's times, which
  // count from the fence's millisecond, are then negative.
  await server.shift(-600_000);
  const lease = await locks.acquire(name, { ttlMs: 5000 });
  assert.ok(lease.acquired && lease.lease.fence > first.lease.fence);
  assert.match(String(await redis.get(lockKey(name))), /^X\d+\|-\d+\|-\d+\|/);
  const info = await locks.inspect(name);
  assert.ok(info.held && info.ttlMs! > 4000 && info.ttlMs! <= 5000, JSON.stringify(info));
  assert.equal((await locks.acquire(name)).acquired, false, "held: another caller is busy");
  const renewed = await locks.renew(lease.lease, { ttlMs: 8000 });
  assert.ok(renewed.renewed && renewed.lease.ttlMs > 7000, JSON.stringify(renewed));
  assert.equal(await locks.release(renewed.lease), true);
  assert.equal(await locks.release(renewed.lease), true, "a retry answers the same");
  const next = await locks.acquire(name, { ttlMs: 1000 });
  assert.ok(next.acquired, "free once released");
  // Never released: it ends 1 s later on the server clock, not 10 minutes later.
  await server.shift(-600_000 + 2000);
  const after = await locks.acquire(name);
  assert.ok(after.acquired && after.lease.fence > next.lease.fence, "free once its lease ended");
  await locks.release(after.lease);
  await server.shift(0);
});

Deno.test("a name's first lease has a record within Redis's 64-byte allocation (60 characters)", async () => {
  const { redis } = await fixture();
  const locks = new Locks(redis);
  const name = keygen();
  const held = await locks.acquire(name, { ttlMs: 60_000 });
  assert.ok(held.acquired);
  const record = String(await redis.get(lockKey(name)));
  assert.ok(record.length <= 60, `${record.length}: ${record}`);
  await locks.release(held.lease);
});

Deno.test("shared and semaphore fences keep increasing, and leases end, across clock steps", async () => {
  const { server, locks } = await stepped();
  const name = keygen();
  const fences: number[] = [];
  for (
    const [offset, options] of [
      [0, { mode: "shared" }],
      [-30_000, { mode: "shared" }],
      [-600_000, {}],
      [-5_000, { mode: "shared" }],
    ] as const
  ) {
    await server.shift(offset);
    const lease = await locks.acquire(name, { ttlMs: 5000, ...options });
    assert.ok(lease.acquired, `at ${offset}`);
    fences.push(lease.lease.fence);
    await locks.release(lease.lease);
  }
  const other = keygen();
  for (const offset of [0, -600_000]) {
    await server.shift(offset);
    const lease = await locks.acquire(other, { limit: 2, ttlMs: 5000 });
    assert.ok(lease.acquired);
    fences.push(lease.lease.fence);
    // The holder never releases: a step forward past its lease frees the permit.
  }
  await server.shift(10_000); // past both leases' ends on the server clock
  const after = await locks.acquire(other, { limit: 2, permits: 2 });
  assert.ok(after.acquired, "the stepped-over leases ended: both permits are free");
  fences.push(after.lease.fence);
  for (let i = 1; i < 4; i++) assert.ok(fences[i]! > fences[i - 1]!, `${fences}`);
  for (let i = 5; i < 7; i++) assert.ok(fences[i]! > fences[i - 1]!, `${fences}`);
  await locks.release(after.lease);
  await server.shift(0);
});

Deno.test("a script's call puts named keys and arguments where its generated header reads them", () => {
  const { keys, args } = scripts.ACQUIRE_ALL.call({
    each: ["a", "b"].map((n) => ({
      lockKey: `${n}:l`,
      queueKey: `${n}:q`,
      ticketsKey: `${n}:t`,
      marksKey: `${n}:m`,
      offersKey: `${n}:o`,
    })),
    keys: { wakeKey: "w", statsKey: "s", namesKey: "n", endsKey: "e" },
    args: {
      token: "tok",
      ttlMs: 100,
      meta: "",
      graceMs: 5,
      ticketMs: 0,
      maxWaiters: 9,
      fresh: false,
      n: 2,
      waitedMs: 0,
      waiting: true,
      wakeId: "",
    },
    rest: ["a", "b"],
  });
  assert.deepEqual(keys, [
    ...["a:l", "a:q", "a:t", "a:m", "a:o", "b:l", "b:q", "b:t", "b:m", "b:o"],
    ...["w", "s", "n", "e"],
  ]);
  assert.deepEqual(args, ["tok", 100, "", 5, 0, 9, "0", 2, 0, "1", "", "a", "b"]);
  const source = scripts.ACQUIRE_ALL.source;
  assert.match(source, /local function marksKey\(i\) return KEYS\[5 \* i - 1\] end/);
  assert.match(source, /local statsKey = KEYS\[5 \* n \+ 2\]/);
  assert.match(source, /local fresh = ARGV\[7\] == '1'/);
  assert.match(source, /local waiting = ARGV\[10\] == '1'/);
  assert.match(source, /for i = 12, #ARGV do names\[#names \+ 1\] = ARGV\[i\] end/);
  // Optional keys go all or none: one after a gap would shift every later position.
  assert.throws(
    () =>
      scripts.LEAVE_QUEUE.call({
        keys: { queueKey: "q" } as never,
        args: { member: "m", outcome: "", wakeId: "", ticketEnd: "", seenFence: 0, hold: "" },
      }),
    /The leave_queue script's call lacks the key ticketsKey/,
  );
});
