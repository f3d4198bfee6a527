/**
 * `deno task bench:anatomy`: where the time of a lock operation goes, to find what to make faster.
 * Prints its findings; writes nothing.
 *
 * - `--part scripts`: the uncontended acquire and release scripts run straight to Redis (TCP, no
 *   bridge), cut short at each step, so each step's Redis time is the difference between two
 *   cuts. Each cut runs `--runs` times and the best run counts: Redis time on a shared machine only
 *   ever grows.
 * - `--part handoff`: 20 waiters × 3 on one name through the REST bridge and a proxy delaying each
 *   way by `--delay` ms, holding 10 ms each. Per grant, from the server's grant times (fences, µs)
 *   and the clients' clocks (the same machine's): the grant to the waiter having its lease, the
 *   hold, and the release's arrival at Redis. A plain `EVAL` sent alongside every 3 ms shows what
 *   any request's legs take meanwhile.
 *
 * @module
 */
import { Redis } from "@upstash/redis";
import { Redis as IORedis } from "ioredis";
import { Locks } from "@edgelock/edgelock";
import { fromIORedis } from "@edgelock/edgelock/tcp";
import { cli } from "../bridge/_cli.ts";
import { startBridge } from "../bridge/mod.ts";
import { startLatencyProxy } from "../dev/latency_proxy.ts";
import { startRedisServer } from "../dev/redis_server.ts";
import { ACQUIRE } from "../src/core/lua/acquire.ts";
import { RELEASE } from "../src/core/lua/release.ts";

const flags = cli("edgelock bench:anatomy", "deno task bench:anatomy [flags]", {
  part: { type: "string", default: "scripts", help: "scripts or handoff" },
  stats: { type: "boolean", help: "scripts: with stats on (else off)" },
  runs: {
    type: "number",
    default: 7,
    min: 1,
    max: 50,
    help: "scripts: runs per cut (best counts)",
  },
  calls: { type: "number", default: 1500, min: 100, max: 100_000, help: "scripts: calls per run" },
  delay: { type: "number", default: 0, min: 0, max: 200, help: "handoff: one-way delay, ms" },
  mode: {
    type: "string",
    default: "exclusive",
    help: "handoff: exclusive, semaphore (2 permits) or readers (1 writer : 4 readers)",
  },
});
if (!["scripts", "handoff"].includes(flags.part)) {
  console.error(`edgelock bench:anatomy: --part is scripts or handoff, not "${flags.part}"`);
  Deno.exit(2);
}
if (!["exclusive", "semaphore", "readers"].includes(flags.mode)) {
  console.error(`edgelock bench:anatomy: --mode is exclusive, semaphore or readers`);
  Deno.exit(2);
}

const server = await startRedisServer();
try {
  if (flags.part === "scripts") await scripts();
  else await handoff();
} finally {
  await server.stop({ remove: true });
}

// The scripts cut short at each step: a cut is the source up to a marker, then `return 1` (and
// the `end` of the block it is in).
async function scripts() {
  const tcp = new IORedis(server.url);
  try {
    // One real acquire and release, their calls captured as Locks makes them.
    const calls: string[][] = [];
    const redis = fromIORedis(tcp);
    const spy = {
      ...redis,
      evalsha: (sha: string, keys: string[], args: unknown[]) => {
        calls.push([String(keys.length), ...keys, ...args.map(String)]);
        return redis.evalsha(sha, keys, args);
      },
    };
    const locks = new Locks(spy, { stats: flags.stats });
    const held = await locks.acquire("anatomy");
    if (!held.acquired) throw new Error("anatomy: busy");
    await locks.release(held.lease);
    const acquire = calls[0]!;
    const release = calls.at(-1)!;
    // The release without its fence, so a replay matches whichever lease is held.
    const n = Number(release[0]);
    release[1 + n + 2] = "";
    const lockKey = acquire[1]!;
    const released = String(await tcp.get(lockKey));

    const usec = async () =>
      Number(/cmdstat_evalsha:calls=\d+,usec=(\d+)/.exec(await tcp.info("commandstats"))?.[1] ?? 0);
    // Redis µs per call of `source` in one run; `before` runs ahead of each call, not counted.
    const cost = async (sha: string, args: string[], before?: () => Promise<unknown>) => {
      let spent = 0;
      for (let i = 0; i < flags.calls; i++) {
        if (before) await before();
        const from = await usec();
        await tcp.call("EVALSHA", sha, ...args);
        spent += (await usec()) - from;
      }
      return spent / flags.calls;
    };
    const cut = (source: string, marker: string, close = "") => {
      const at = source.indexOf(marker);
      if (at < 0) throw new Error(`anatomy: the script no longer has ${JSON.stringify(marker)}`);
      return `${source.slice(0, at)}\nreturn 1\n${close}`;
    };
    const asReleased = () => tcp.set(lockKey, released, "PX", 60_000);
    const realAcquire = await ACQUIRE.sha1();
    await tcp.script("LOAD", ACQUIRE.source);
    const asHeld = () => tcp.call("EVALSHA", realAcquire, ...acquire);
    const A = ACQUIRE.source;
    const R = RELEASE.source;
    const rows: [string, string, string[], (() => Promise<unknown>) | undefined][] = [
      ["an empty script", "return 1", acquire, undefined],
      ["acquire: its header", cut(A, "local time  ="), acquire, undefined],
      ["acquire: + TIME", cut(A, "local fast, hold0"), acquire, undefined],
      [
        "acquire: + GET and the record",
        cut(A, "  redis.call('SET', lockKey", "end"),
        acquire,
        asReleased,
      ],
      ["acquire: + SET", cut(A, "  -- a release without a fence now", "end"), acquire, asReleased],
      ["acquire: all", A, acquire, asReleased],
      ["release: to its GET", cut(R, "local raw = redis.call('GET', lockKey)"), release, asHeld],
      [
        "release: + GET and SET",
        cut(R, "  redis.call('ZADD', marksKey, f, token)", "end"),
        release,
        asHeld,
      ],
      ["release: + the marks", cut(R, "  observe(statsKey", "end"), release, asHeld],
      ["release: all", R, release, asHeld],
    ];
    // The runs take turns over the cuts, so a slow spell of the machine falls on all of them.
    const shas = await Promise.all(rows.map(([, source]) => tcp.script("LOAD", source)));
    const best = rows.map(() => Infinity);
    for (let run = 0; run < flags.runs; run++) {
      for (const [i, [, , args, before]] of rows.entries()) {
        best[i] = Math.min(best[i]!, await cost(String(shas[i]), args, before));
      }
    }
    console.log(`Redis µs per call, stats ${flags.stats ? "on" : "off"}, best of ${flags.runs}:`);
    rows.forEach(([label], i) => console.log(`${label.padEnd(32)} ${best[i]!.toFixed(2)}`));
  } finally {
    tcp.disconnect();
  }
}

async function handoff() {
  const token = crypto.randomUUID();
  const bridge = await startBridge({ redisUrl: server.url, token, port: 0, poolSize: 8 });
  const proxy = flags.delay > 0 ? startLatencyProxy(bridge.url, flags.delay) : undefined;
  try {
    const redis = new Redis({ url: proxy?.url ?? bridge.url, token, enableTelemetry: false });
    const locks = new Locks(redis);
    const name = `anatomy:${crypto.randomUUID()}`;
    const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
    const nowUs = () => (performance.timeOrigin + performance.now()) * 1000;
    const mean = (values: number[]) => values.reduce((a, b) => a + b, 0) / values.length / 1000;
    // Warm: the scripts loaded, the connections open.
    const warm = await locks.acquire(name);
    if (warm.acquired) await locks.release(warm.lease);

    let probing = true;
    const legs: [number, number][] = [];
    const probe = (async () => {
      while (probing) {
        const sent = nowUs();
        const at = Number(
          await redis.eval("local t = redis.call('TIME') return t[1] * 1000000 + t[2]", [], []),
        );
        legs.push([at - sent, nowUs() - at]);
        await sleep(3);
      }
    })();
    const grants: { fence: number; got: number; sent: number }[] = [];
    let arrivals = 0;
    const started = performance.now();
    await Promise.all(Array.from({ length: 20 }, async (_, waiter) => {
      await sleep(waiter * (2 * flags.delay + 2));
      for (let round = 0; round < 3; round++) {
        const options = flags.mode === "semaphore"
          ? { limit: 2, permits: 1 }
          : flags.mode === "readers"
          ? { mode: arrivals++ % 5 === 0 ? "exclusive" as const : "shared" as const }
          : {};
        const result = await locks.acquire(name, { ttlMs: 10_000, waitMs: 30_000, ...options });
        const got = nowUs();
        if (!result.acquired) throw new Error("anatomy: a waiter gave up");
        await sleep(10);
        const sent = nowUs();
        await locks.release(result.lease);
        grants.push({ fence: Number(result.lease.fence), got, sent });
      }
    }));
    const elapsed = performance.now() - started;
    probing = false;
    await probe;
    grants.sort((a, b) => a.fence - b.fence);
    // Past the first round's arrivals: the queue is full then.
    const steady = grants.slice(22);
    const gaps = steady.slice(1).map((g, i) => g.fence - steady[i]!.fence);
    console.log(
      `${flags.mode}, ${flags.delay} ms each way: ${(grants.length / elapsed * 1000).toFixed(1)} ` +
        "acquisitions/s; ms per grant, after the first round:",
    );
    console.log(
      `  grant at Redis -> the waiter has its lease  ${
        mean(steady.map((g) => g.got - g.fence)).toFixed(2)
      }`,
    );
    console.log(
      `  hold (the waiter's 10 ms sleep)             ${
        mean(steady.map((g) => g.sent - g.got)).toFixed(2)
      }`,
    );
    if (flags.mode !== "readers") {
      const capacity = flags.mode === "semaphore" ? 2 : 1;
      const arrive = steady.slice(capacity).map((g, i) => g.fence - steady[i]!.sent);
      console.log(`  release sent -> the next grant at Redis     ${mean(arrive).toFixed(2)}`);
    }
    console.log(`  between grants                              ${mean(gaps).toFixed(2)}`);
    console.log(
      `  a plain EVAL alongside: to Redis ${mean(legs.map((l) => l[0])).toFixed(2)}, back ${
        mean(legs.map((l) => l[1])).toFixed(2)
      } (${legs.length} probes)`,
    );
  } finally {
    await proxy?.close();
    await bridge.close();
  }
}
