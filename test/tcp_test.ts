// The library over TCP clients (ioredis and node-redis, standalone and cluster) through the
// adapters of `@edgelock/edgelock/tcp`: the same scenario as over REST, with the same answers.
import assert from "node:assert/strict";
import { Cluster, Redis as IORedis } from "ioredis";
import { createClient, createCluster } from "redis";
import { type Lease, LockOps, Locks, type RedisLike } from "@edgelock/edgelock";
import { Jobs, recordId, Records } from "@edgelock/edgelock/uses";
import { fromIORedis, fromNodeRedis, fromNodeRedisCluster } from "@edgelock/edgelock/tcp";
import { startRedisCluster } from "../dev/redis_cluster.ts";
import { acquired, keygen, shared, sharedBackend } from "./_backend.ts";

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

// What each call answered; names, tokens, fences and times differ between runs, so only their
// presence counts.
function shape(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(shape);
  if (value === null || typeof value !== "object") return value;
  const vary = [
    "name",
    "token",
    "hold",
    "fence",
    "ttlMs",
    "expiresAt",
    "serverTime",
    "retryAfterMs",
  ];
  return Object.fromEntries(
    Object.entries(value).filter(([key]) => key !== "lockExpiresAt").map(([k, v]) => [
      k,
      vary.includes(k) ? typeof v : shape(v),
    ]),
  );
}

/** Every primitive and use once; `flush` empties the script cache midway. */
async function scenario(redis: RedisLike, flush: () => Promise<unknown>, stats: boolean) {
  const prefix = `tcp-${crypto.randomUUID()}`;
  const locks = new Locks(redis, { stats, prefix });
  const ops = new LockOps(redis, { prefix });
  const out: unknown[] = [];
  const name = keygen("x");
  const lease = acquired(await locks.acquire(name, { ttlMs: 5000, meta: { by: "a" } }));
  out.push(await locks.acquire(name));
  const waiter = locks.acquire(name, { waitMs: 3000 });
  await sleep(50);
  out.push(await locks.inspect(name));
  out.push(await locks.renew(lease));
  const others = await Promise.all(
    [1, 2, 3].map(async () => acquired(await locks.acquire(keygen("x")))),
  );
  out.push(await locks.renewMany([lease, ...others]));
  out.push(await locks.release(lease));
  out.push(await locks.release(lease)); // a retry
  const next = acquired(await waiter);
  assert.ok(next.fence > lease.fence, "fences increase");
  await flush(); // NOSCRIPT from here on: EVAL takes over
  out.push(await locks.release(next));
  for (const other of others) await locks.release(other);
  const rw = keygen("x");
  const readers = await Promise.all(
    [1, 2].map(async () => acquired(await locks.acquire(rw, { mode: "shared" }))),
  );
  out.push(await locks.acquire(rw));
  out.push(await locks.inspect(rw));
  await locks.acquire(rw, { limit: 2 }).catch((error) => out.push(error.code));
  for (const reader of readers) out.push(await locks.release(reader));
  const sem = keygen("x");
  const permits = acquired(await locks.acquire(sem, { limit: 3, permits: 2 }));
  out.push(await locks.acquire(sem, { limit: 3, permits: 2 }));
  out.push(await locks.release(permits));
  const tag = `{${keygen("g")}}`;
  const all = await locks.acquireAll([`${tag}a`, `${tag}b`]);
  out.push(all);
  if (all.acquired) { for (const l of all.leases as Lease[]) out.push(await locks.release(l)); }
  const twice = acquired(await locks.acquire(sem, { reentrant: true }));
  out.push(await locks.acquire(sem, { reentrant: true, token: twice.token }));
  out.push(await locks.release(twice), await locks.release(twice), await locks.inspect(sem));
  if (stats) {
    const held = acquired(await locks.acquire(keygen("x")));
    out.push((await ops.list()).locks.length, (await ops.stats()).locks_held);
    await locks.release(held);
  }
  const records = new Records(redis, { stats, prefix: `tcp-${crypto.randomUUID()}` });
  const id = recordId("user-1", keygen("k"));
  const claim = await records.claim("idempotency", id, { fingerprint: "f" });
  out.push(claim.state);
  if (claim.state === "claimed") {
    out.push(await records.complete("idempotency", id, claim.token, { status: 201, body: "ok" }));
  }
  out.push(await records.claim("idempotency", id, { fingerprint: "f" }));
  const jobs = new Jobs(redis, { stats, prefix: `tcp-${crypto.randomUUID()}` });
  const job = keygen("job");
  out.push((await jobs.start(job, { atMostMs: 2000, tick: 1 })).run);
  out.push(await jobs.start(job, { atMostMs: 2000, tick: 1 }));
  return shape(out);
}

const backend = sharedBackend();
const cluster = shared(() => startRedisCluster(), (cluster) => cluster.stop());
const flushAll = async () => {
  const { nodes } = await cluster();
  return await Promise.all(
    nodes.map((node) =>
      new Deno.Command("redis-cli", { args: ["-p", String(node.port), "script", "flush"] })
        .output()
    ),
  );
};

// The answers over REST, which every TCP client must give.
const reference = shared(async () => {
  const { redis } = await backend();
  const rest = await scenario(redis, () => redis.scriptFlush(), true);
  const restNoStats = await scenario(redis, () => redis.scriptFlush(), false);
  return { rest, restNoStats };
});

Deno.test("the library over TCP clients answers as over REST: ioredis", async () => {
  const { rest } = await reference();
  const client = new IORedis((await backend()).server.url);
  try {
    const answers = await scenario(fromIORedis(client), () => client.script("FLUSH"), true);
    assert.deepEqual(answers, rest);
  } finally {
    client.disconnect();
  }
});

Deno.test("the library over TCP clients answers as over REST: node-redis", async () => {
  const { rest } = await reference();
  const client = createClient({ url: (await backend()).server.url });
  await client.connect();
  try {
    const answers = await scenario(fromNodeRedis(client), () => client.scriptFlush(), true);
    assert.deepEqual(answers, rest);
  } finally {
    client.destroy();
  }
});

Deno.test(
  "the library over TCP clients answers as over REST: ioredis Cluster (stats off)",
  async () => {
    const { restNoStats } = await reference();
    const [seed] = (await cluster()).nodes;
    const client = new Cluster([{ host: "127.0.0.1", port: seed!.port }]);
    try {
      await new Promise((resolve) => client.once("ready", resolve));
      assert.deepEqual(await scenario(fromIORedis(client), flushAll, false), restNoStats);
    } finally {
      client.disconnect();
    }
  },
);

Deno.test(
  "the library over TCP clients answers as over REST: node-redis cluster (stats off)",
  async () => {
    const { restNoStats } = await reference();
    const client = createCluster({ rootNodes: [{ url: (await cluster()).urls[0]! }] });
    await client.connect();
    try {
      assert.deepEqual(await scenario(fromNodeRedisCluster(client), flushAll, false), restNoStats);
    } finally {
      client.destroy();
    }
  },
);

Deno.test("a reply error fails only its own call of a batch; bad clients are refused", async () => {
  const client = new IORedis((await backend()).server.url);
  try {
    const pipeline = fromIORedis(client).pipeline!();
    pipeline.evalsha("0".repeat(40), [], []);
    pipeline.eval("return 7", [], []);
    const replies = await pipeline.exec({ keepErrors: true });
    assert.match(String(replies[0]!.error), /^NOSCRIPT /);
    assert.deepEqual(replies[1], { result: 7 });
    assert.throws(() => fromIORedis({} as never), TypeError);
    assert.throws(() => fromNodeRedis({} as never), TypeError);
    assert.throws(() => fromNodeRedisCluster({} as never), TypeError);
  } finally {
    client.disconnect();
  }
});
