/**
 * `deno task bench:edge`: what edge users pay, and the performance targets as rows with their
 * ratios, all measured in one run. Round trips to Redis go through a proxy that adds a fixed
 * one-way delay (0, 5 and 20 ms each way); loopback hides what an edge function pays.
 *
 * Writes edge.json and edge.md to bench/tmp/, or with `--update` to bench/ (tracked).
 *
 * @module
 */
import { AsyncLocalStorage } from "node:async_hooks";
import { Lock as UpstashLock } from "@upstash/lock";
import { Redis } from "@upstash/redis";
import { Redis as IORedis } from "ioredis";
import { Miniflare } from "miniflare";
import { createClient } from "@edgelock/edgelock/client";
import { type LockEvent, Locks } from "@edgelock/edgelock";
import { createApp } from "@edgelock/edgelock/service";
import { gzipSize, minifiedBundle } from "./_bundle.ts";
import { buildWorker } from "../dev/build_worker.ts";
import { cli } from "../bridge/_cli.ts";
import { commandStats } from "./_commandstats.ts";
import { startBridge } from "../bridge/mod.ts";
import { startLatencyProxy } from "../dev/latency_proxy.ts";
import { startRedisServer } from "../dev/redis_server.ts";

const flags = cli("edgelock bench:edge", "deno task bench:edge [flags]", {
  delays: { type: "string", default: "0,5,20", help: "one-way delays to Redis, ms" },
  update: { type: "boolean", help: "write the tracked bench/edge.* (else bench/tmp/)" },
});
const DELAYS = flags.delays.split(",").map(Number);
if (DELAYS.some((d) => !Number.isInteger(d) || d < 0 || d > 200)) {
  console.error("edgelock bench:edge: --delays takes whole numbers of ms from 0 to 200");
  Deno.exit(2);
}
const OUT = new URL(flags.update ? "./" : "./tmp/", import.meta.url);
const SECRET = "edge-bench-secret-0123456789";
const HOLD_MS = 10;
// How many times each contention case runs; its row is the median run.
const REPEATS = 3;

interface Target {
  target: string;
  measured: string;
  ratio: number;
  limit: string;
  met: boolean;
}
const targets: Target[] = [];
const tables: string[] = [];
const round = (value: number, digits = 2) => Number(value.toFixed(digits));
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
// A hold of `ms`, as the bench's holders take it, and how long it took: Deno's setTimeout fires
// about 1.3 ms late, which the bound (10 ms holds) does not count. The table shows the mean.
async function hold(ms: number): Promise<number> {
  const started = performance.now();
  await sleep(ms);
  return performance.now() - started;
}
const median = (values: number[]) =>
  [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]!;
/** Of several runs of one case, the one with the median `by`. */
const medianRun = <T>(runs: T[], by: (run: T) => number) =>
  [...runs].sort((a, b) => by(a) - by(b))[Math.floor(runs.length / 2)]!;

const server = await startRedisServer();
const token = crypto.randomUUID();
const bridge = await startBridge({ redisUrl: server.url, token, port: 0, poolSize: 8 });
const tcp = new IORedis(server.url);
const cleanups: (() => Promise<unknown>)[] = [() => tcp.quit()];

const redisStats = () => commandStats(tcp);

type Cycle = (name: string) => Promise<void>;

function cyclesFor(redis: Redis, service?: string) {
  const locks = new Locks(redis);
  const bare = new Locks(redis, { stats: false });
  const floorSha = redis.scriptLoad(
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
  );
  const cycles: Record<string, Cycle> = {
    floor: async (name) => {
      const owner = crypto.randomUUID();
      if (await redis.set(`floor:${name}`, owner, { nx: true, px: 10_000 }) !== "OK") {
        throw new Error("floor: busy");
      }
      await redis.evalsha(await floorSha, [`floor:${name}`], [owner]);
    },
    library: async (name) => {
      const result = await locks.acquire(name);
      if (!result.acquired) throw new Error("library: busy");
      await locks.release(result.lease);
    },
    "library, stats off": async (name) => {
      const result = await bare.acquire(name);
      if (!result.acquired) throw new Error("library: busy");
      await bare.release(result.lease);
    },
    "@upstash/lock": async (name) => {
      const lock = new UpstashLock({
        id: `ul:${name}`,
        redis: redis as never,
        lease: 10_000,
        retry: { attempts: 1, delay: 1 },
      });
      if (!(await lock.acquire())) throw new Error("@upstash/lock: busy");
      await lock.release();
    },
  };
  if (service) {
    const client = createClient({ baseUrl: service, apiKey: SECRET });
    cycles.service = async (name) => {
      const result = await client.acquire(name);
      if (!result.acquired) throw new Error("service: busy");
      await client.release(result.lease);
    };
  }
  return { locks, cycles };
}

/** What the issue measured a TIME+GET+SET script at, µs: its script-time targets' yardstick. */
const REFERENCE_ISSUE_US = 4.9;

/**
 * Redis time of a TIME+GET+SET script that writes a lock's record, µs per call, sent the way the
 * concurrency-16 cycles send theirs: 4000 calls through the bridge, 16 at a time, on 16 keys.
 * (Sent down one TCP connection instead, Redis runs them back to back, in a third of the time.)
 */
async function referenceScriptUsec(redis: Redis): Promise<number> {
  const record = "X1796649038310943|30000|0|20|0|AY-vbAa-A9epxXZ57qv5NQ||1|";
  const sha = await redis.scriptLoad(
    `local t = redis.call('TIME') redis.call('GET', KEYS[1]) ` +
      `redis.call('SET', KEYS[1], '${record}', 'PX', 3630000) return 1`,
  );
  const count = 4000;
  const before = await redisStats();
  let next = 0;
  await Promise.all(Array.from({ length: 16 }, async (_, i) => {
    while (next++ < count) await redis.evalsha(sha, [`bench:reference:${i}`], []);
  }));
  const after = await redisStats();
  return (after.scriptUsec - before.scriptUsec) / count;
}

async function measure(cycle: Cycle, count: number, concurrency = 1) {
  const names = Array.from({ length: concurrency }, () => `bench:${crypto.randomUUID()}`);
  for (const name of names) await cycle(name); // warm-up
  const latencies: number[] = [];
  const requests = bridge.stats().requests;
  const before = await redisStats();
  const started = performance.now();
  let next = 0;
  await Promise.all(names.map(async (name) => {
    while (next++ < count) {
      const t0 = performance.now();
      await cycle(name);
      latencies.push(performance.now() - t0);
    }
  }));
  const elapsed = performance.now() - started;
  const after = await redisStats();
  return {
    opsPerSec: latencies.length / (elapsed / 1000),
    p50Ms: median(latencies),
    requests: (bridge.stats().requests - requests) / latencies.length,
    commands: (after.commands - before.commands) / latencies.length,
    usec: (after.usec - before.usec) / latencies.length,
    scriptUsec: (after.scriptUsec - before.scriptUsec) / latencies.length,
  };
}

/**
 * `waiters` callers on one name, each acquiring `rounds` times and holding HOLD_MS. The first
 * round arrives in a known order: each waiter starts once the previous ones were answered
 * (`arrived`, where the case can tell; else 1 ms apart), since two requests sent within a
 * millisecond on different connections reach Redis in either order. Each acquire runs in its
 * waiter's `caller` context, so an answer counts once per waiter: the first waiters' next rounds,
 * which begin while the last ones are still arriving, do not let two start at once.
 */
async function contend(
  { acquire, arrived }: Waiting,
  waiters: number,
  rounds: number,
) {
  const name = `contend:${crypto.randomUUID()}`;
  const arrivals: number[] = [];
  const holds: number[] = [];
  let next = 0;
  const requests = bridge.stats().requests;
  const before = await redisStats();
  const started = performance.now();
  answeredBy.clear();
  await Promise.all(Array.from({ length: waiters }, async (_, waiter) => {
    if (!arrived) await sleep(waiter);
    // At 20 ms each way 50 arrivals take over 2 s; a case that never answers goes on after 30 s.
    const giveUp = performance.now() + 30_000;
    while (arrived && arrived() < waiter && performance.now() < giveUp) await sleep(1);
    for (let r = 0; r < rounds; r++) {
      const arrival = next++;
      const release = await caller.run(waiter, () => acquire(name));
      arrivals.push(arrival);
      holds.push(await hold(HOLD_MS));
      await release();
    }
  }));
  const elapsed = performance.now() - started;
  const after = await redisStats();
  const sorted = [...arrivals].sort((a, b) => a - b);
  const rank = new Map(sorted.map((a, i) => [a, i]));
  const displacement = arrivals.reduce((sum, a, i) => sum + Math.abs(rank.get(a)! - i), 0) /
    arrivals.length;
  return {
    perSec: arrivals.length / (elapsed / 1000),
    requests: (bridge.stats().requests - requests) / arrivals.length,
    commands: (after.commands - before.commands) / arrivals.length,
    displacement,
    holdMs: holds.reduce((sum, h) => sum + h, 0) / holds.length,
  };
}

interface Waiting {
  acquire: (name: string) => Promise<() => Promise<unknown>>;
  arrived?: () => number;
  /** How many hold the name at once (a semaphore's permits); 1 for a lock. */
  capacity?: number;
}

// The waiters of the running `contend` answered so far (a look answered busy, or a grant).
const answeredBy = new Set<number>();
const caller = new AsyncLocalStorage<number>();

function waitersFor(redis: Redis): Record<string, Waiting> {
  const answered = () => answeredBy.size;
  const onEvent = (event: LockEvent) => {
    const waiter = caller.getStore();
    if ((event.type === "wait" || event.type === "acquire") && waiter !== undefined) {
      answeredBy.add(waiter);
    }
  };
  const locks = new Locks(redis, { onEvent });
  const polling = new Locks(redis, { onEvent, blocking: false });
  // One caller in five a writer: in arrival order a writer, then four readers that hold together,
  // so five acquisitions take two holds and two round trips at best.
  let arrivals = 0;
  const readersAndWriters = (locks: Locks): Waiting => ({
    acquire: async (name: string) => {
      const mode = arrivals++ % 5 === 0 ? "exclusive" : "shared";
      const result = await locks.acquire(name, { mode, ttlMs: 10_000, waitMs: 30_000 });
      if (!result.acquired) throw new Error("edgelock readers and writers: gave up");
      return () => locks.release(result.lease);
    },
    arrived: answered,
    capacity: 2.5,
  });
  return {
    edgelock: {
      acquire: async (name: string) => {
        const result = await locks.acquire(name, { ttlMs: 10_000, waitMs: 30_000 });
        if (!result.acquired) throw new Error("edgelock: gave up");
        return () => locks.release(result.lease);
      },
      arrived: answered,
    },
    "edgelock, semaphore of 2 permits": {
      acquire: async (name: string) => {
        const options = { limit: 2, permits: 1, ttlMs: 10_000, waitMs: 30_000 };
        const result = await locks.acquire(name, options);
        if (!result.acquired) throw new Error("edgelock semaphore: gave up");
        return () => locks.release(result.lease);
      },
      arrived: answered,
      capacity: 2,
    },
    "edgelock, multi-name (2 names each)": {
      acquire: async (name: string) => {
        const result = await locks.acquireAll([`${name}:a`, `${name}:b`], {
          ttlMs: 10_000,
          waitMs: 30_000,
        });
        if (!result.acquired) throw new Error("edgelock multi-name: gave up");
        return () => Promise.all(result.leases.map((lease) => locks.release(lease)));
      },
      arrived: answered,
    },
    "edgelock, 1 writer : 4 readers": readersAndWriters(locks),
    "edgelock, 1 writer : 4 readers, polling": readersAndWriters(polling),
    "@upstash/lock": {
      acquire: async (name: string) => {
        const lock = new UpstashLock({
          id: `ul:${name}`,
          redis: redis as never,
          lease: 10_000,
          retry: { attempts: 3000, delay: 10 },
        });
        if (!(await lock.acquire())) throw new Error("@upstash/lock: gave up");
        return () => lock.release();
      },
    },
  };
}

function target(name: string, measured: string, ratio: number, limit: string, met: boolean) {
  targets.push({ target: name, measured, ratio: round(ratio), limit, met });
  console.log(`${met ? "met " : "MISS"} ${name}: ${measured} (${round(ratio)}; target ${limit})`);
}

function startService(redis: Redis): { url: string; stop: () => Promise<void> } {
  const app = createApp({ redis, apiKeys: [{ tenant: "b", secret: SECRET }], log: () => {} });
  const http = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, app.fetch);
  return { url: `http://127.0.0.1:${http.addr.port}`, stop: () => http.shutdown() };
}

// CPU of a Worker bundle's import, first request and warm requests, median of 3 fresh processes.
async function cpuProbe(
  file: string,
  kind: string,
  url: string,
  token: string,
  secret: string,
): Promise<{ importMs: number; firstRequestMs: number; warmRequestMs: number }> {
  const runs: Record<"importMs" | "firstRequestMs" | "warmRequestMs", number>[] = [];
  for (let i = 0; i < 3; i++) {
    const { success, stderr } = await new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "-A",
        new URL("./_cpu_probe.ts", import.meta.url).pathname,
        `file://${file}`,
        url,
        token,
        secret,
        kind,
      ],
      stdout: "null",
      stderr: "piped",
    }).output();
    const text = new TextDecoder().decode(stderr).trim();
    if (!success) throw new Error(`cpu probe failed: ${text}`);
    runs.push(JSON.parse(text.split("\n").at(-1)!));
  }
  const mid = (key: "importMs" | "firstRequestMs" | "warmRequestMs") =>
    median(runs.map((run) => run[key]));
  return {
    importMs: mid("importMs"),
    firstRequestMs: mid("firstRequestMs"),
    warmRequestMs: mid("warmRequestMs"),
  };
}

// From `new Miniflare` to the first reply: what a cold isolate costs before it answers. The
// bundle goes in as a list of one module: given `modules: true` and a script, Miniflare parses the
// bundle with acorn in this process to find its imports (60–90 ms for the service's 265 KB), a
// cost of the harness that Cloudflare's runtime never pays.
async function coldStart(script: string, path: string, bindings: Record<string, string>) {
  const times: number[] = [];
  for (let i = 0; i < 3; i++) {
    const t0 = performance.now();
    const mf = new Miniflare({
      modules: [{ type: "ESModule", path: "worker.js", contents: script }],
      compatibilityDate: "2026-08-01",
      bindings,
    });
    try {
      const res = await mf.dispatchFetch(`http://bench.test${path}`);
      await res.arrayBuffer();
      times.push(performance.now() - t0);
    } finally {
      await mf.dispose();
    }
  }
  return median(times);
}

interface Point {
  delay: number;
  ours: number;
  theirs: number;
  bound: number;
}

// Contended acquisitions per second against the one-way delay: edgelock, @upstash/lock, bound.
function chart(points: Point[]): string {
  const [w, h, left, bottom] = [560, 320, 60, 40];
  const maxX = Math.max(...points.map((p) => p.delay), 1);
  const maxY = Math.ceil(Math.max(...points.flatMap((p) => [p.ours, p.theirs, p.bound])) / 20) * 20;
  const x = (d: number) => left + (d / maxX) * (w - left - 20);
  const y = (v: number) => h - bottom - (v / maxY) * (h - bottom - 20);
  const line = (key: "ours" | "theirs" | "bound", color: string, dash = "") =>
    `<polyline fill="none" stroke="${color}" stroke-width="2" ${dash} points="${
      points.map((p) => `${x(p.delay).toFixed(1)},${y(p[key]).toFixed(1)}`).join(" ")
    }"/>` +
    points.map((p) =>
      `<circle cx="${x(p.delay).toFixed(1)}" cy="${y(p[key]).toFixed(1)}" r="3" fill="${color}"/>`
    ).join("");
  const ticksY = Array.from({ length: 5 }, (_, i) => (maxY / 4) * i);
  return [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${w}" height="${h}" font-family="sans-serif" font-size="12">`,
    `<rect width="${w}" height="${h}" fill="white"/>`,
    ...ticksY.map((v) =>
      `<line x1="${left}" x2="${w - 20}" y1="${y(v)}" y2="${y(v)}" stroke="#ddd"/>` +
      `<text x="${left - 6}" y="${y(v) + 4}" text-anchor="end">${Math.round(v)}</text>`
    ),
    ...points.map((p) =>
      `<text x="${x(p.delay)}" y="${h - bottom + 16}" text-anchor="middle">${p.delay}</text>`
    ),
    `<text x="${(w + left) / 2}" y="${
      h - 6
    }" text-anchor="middle">one-way delay to Redis, ms</text>`,
    `<text transform="translate(14 ${
      (h - bottom) / 2
    }) rotate(-90)" text-anchor="middle">acquisitions/s (20 waiters, 10 ms holds)</text>`,
    line("bound", "#888", 'stroke-dasharray="5 4"'),
    line("theirs", "#d95f02"),
    line("ours", "#1b9e77"),
    `<text x="${w - 170}" y="30" fill="#1b9e77">edgelock (hand-off)</text>`,
    `<text x="${w - 170}" y="46" fill="#d95f02">@upstash/lock, 10 ms retry</text>`,
    `<text x="${w - 170}" y="62" fill="#888">bound 1/(hold + RTT)</text>`,
    "</svg>",
    "",
  ].join("\n");
}

try {
  const profiles: string[] = [
    "| one-way delay | case | p50 ms | × floor p50 | ops/s | REST requests / cycle |",
    "| ---: | --- | ---: | ---: | ---: | ---: |",
  ];
  const contention: string[] = [
    "| one-way delay | waiters × rounds | case | acquisitions/s | bound 1/(hold + RTT) | of bound | requests / acquisition | Redis commands / acquisition | displacement | mean hold ms |",
    "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
  ];
  let loopback: Record<string, Awaited<ReturnType<typeof measure>>> = {};
  const plot: Point[] = [];
  for (const delay of DELAYS) {
    const proxy = delay > 0 ? startLatencyProxy(bridge.url, delay) : undefined;
    const redis = new Redis({ url: proxy?.url ?? bridge.url, token, enableTelemetry: false });
    const service = startService(redis);
    const { cycles } = cyclesFor(redis, service.url);
    const count = delay === 0 ? 400 : delay <= 5 ? 60 : 25;
    // A fresh process runs its first thousands of requests in spells half a millisecond slower
    // (two @upstash/redis PINGs through the bridge: 0.9 ms, and 1.4-1.9 ms for 100-300 cycles at
    // a time until about the 1,500th), which fell on whichever loopback case ran then.
    if (delay === 0) {
      for (const cycle of Object.values(cycles)) {
        for (let i = 0; i < 500; i++) await cycle("warm-up");
      }
    }
    const results: Record<string, Awaited<ReturnType<typeof measure>>> = {};
    for (const [label, cycle] of Object.entries(cycles)) {
      results[label] = await measure(cycle, count);
      const r = results[label]!;
      profiles.push(
        `| ${delay} ms | ${label} | ${round(r.p50Ms)} | ${
          round(r.p50Ms / results.floor!.p50Ms)
        } | ${round(r.opsPerSec, 0)} | ${round(r.requests)} |`,
      );
    }
    if (delay === 0) loopback = results;
    if (delay === Math.max(...DELAYS)) {
      const lib = results.library!;
      target(
        `library at ${delay} ms each way: p50 of a cycle vs the floor`,
        `${round(lib.p50Ms)} ms vs ${round(results.floor!.p50Ms)} ms`,
        lib.p50Ms / results.floor!.p50Ms,
        "≤ 1.02",
        lib.p50Ms / results.floor!.p50Ms <= 1.02,
      );
    }
    // Contention: 20 waiters × 3 on one name with 10 ms holds, and 50 waiters; a semaphore of
    // 2 permits too, whose bound is twice the lock's, and readers with writers (see waitersFor).
    const rtt = results.floor!.p50Ms / 2;
    const bound = 1000 / (HOLD_MS + rtt);
    // Two callers taking turns, the commonest contention, are shown without targets of their own.
    for (const [waiters, rounds] of [[20, 3], [50, delay === 0 ? 4 : 2], [2, 20]]) {
      // Each case REPEATS times, the cases taking turns (so a slow spell of the shared machine falls
      // on all of them); each row is the run with the median throughput.
      const cases = Object.entries(waitersFor(redis)).filter(([label]) =>
        waiters === 20 || !label.startsWith("edgelock, ")
      );
      const runs = new Map<string, Awaited<ReturnType<typeof contend>>[]>();
      for (let i = 0; i < REPEATS; i++) {
        for (const [label, waiting] of cases) {
          runs.set(label, [...runs.get(label) ?? [], await contend(waiting, waiters!, rounds!)]);
        }
      }
      const run: Record<string, Awaited<ReturnType<typeof contend>>> = {};
      for (const [label, waiting] of cases) {
        run[label] = medianRun(runs.get(label)!, (r) => r.perSec);
        const c = run[label]!;
        const caseBound = bound * (waiting.capacity ?? 1);
        contention.push(
          `| ${delay} ms | ${waiters} × ${rounds} | ${label} | ${round(c.perSec, 1)} | ${
            round(caseBound, 1)
          } | ${round(c.perSec / caseBound)} | ${round(c.requests, 2)} | ${
            round(c.commands, 1)
          } | ${round(c.displacement, 1)} | ${round(c.holdMs)} |`,
        );
      }
      const ours = run.edgelock!;
      const theirs = run["@upstash/lock"]!;
      if (waiters === 20) plot.push({ delay, ours: ours.perSec, theirs: theirs.perSec, bound });
      if (waiters === 2) continue;
      const at = `contention at ${delay} ms, ${waiters} waiters`;
      const least = delay === 0 ? 0.8 : 0.9;
      target(
        `${at}: throughput vs the bound 1/(hold + RTT)`,
        `${round(ours.perSec, 1)}/s vs ${round(bound, 1)}/s (@upstash/lock ${
          round(theirs.perSec, 1)
        }/s)`,
        ours.perSec / bound,
        `≥ ${least}`,
        ours.perSec >= least * bound,
      );
      if (delay === Math.max(...DELAYS)) {
        target(
          `${at}: throughput vs @upstash/lock (10 ms retry)`,
          `${round(ours.perSec, 1)}/s vs ${round(theirs.perSec, 1)}/s`,
          ours.perSec / theirs.perSec,
          "≥ 1.25",
          ours.perSec >= 1.25 * theirs.perSec,
        );
      }
      target(
        `${at}: REST requests and Redis commands per acquisition`,
        `${round(ours.requests, 2)} requests, ${round(ours.commands, 1)} commands (@upstash/lock ${
          round(theirs.requests, 1)
        }, ${round(theirs.commands, 1)})`,
        ours.requests,
        "≤ 3 requests, ≤ 25 commands",
        ours.requests <= 3 && ours.commands <= 25,
      );
      const semaphore = run["edgelock, semaphore of 2 permits"];
      if (semaphore) {
        target(
          `${at}, semaphore of 2 permits: throughput vs the bound 2/(hold + RTT)`,
          `${round(semaphore.perSec, 1)}/s vs ${round(2 * bound, 1)}/s; ${
            round(semaphore.requests, 2)
          } requests per acquisition`,
          semaphore.perSec / (2 * bound),
          `≥ ${least}`,
          semaphore.perSec >= least * 2 * bound,
        );
      }
      const mixed = run["edgelock, 1 writer : 4 readers"];
      if (mixed) {
        const polled = run["edgelock, 1 writer : 4 readers, polling"]!;
        target(
          `${at}, 1 writer : 4 readers: throughput vs the bound 2.5/(hold + RTT)`,
          `${round(mixed.perSec, 1)}/s vs ${round(2.5 * bound, 1)}/s (polling ${
            round(polled.perSec, 1)
          }/s); ${round(mixed.requests, 2)} requests per acquisition`,
          mixed.perSec / (2.5 * bound),
          `≥ ${least}`,
          mixed.perSec >= least * 2.5 * bound,
        );
      }
      target(
        `${at}: grants in arrival order`,
        `mean displacement ${round(ours.displacement, 1)}`,
        ours.displacement,
        "0",
        ours.displacement === 0,
      );
    }
    await service.stop();
    await proxy?.close();
  }
  tables.push(
    "Uncontended acquire+release, concurrency 1, by one-way delay to Redis:",
    "",
    ...profiles,
    "",
    `Contention: waiters on one name, each holding ${HOLD_MS} ms; RTT is half the floor's cycle; each row the median of ${REPEATS} runs, the cases taking turns.`,
    "",
    ...contention,
  );

  // Redis work and loopback throughput at concurrency 16.
  const redis = new Redis({ url: bridge.url, token, enableTelemetry: false });
  const { cycles } = cyclesFor(redis);
  // Each case REPEATS times, the cases taking turns: one run each swung the library's ratio to the
  // floor between 0.36 and 0.65 across runs, and the floor alone by half within one process.
  // Each case's figures are those of its run with the median throughput.
  const c16: Record<string, Awaited<ReturnType<typeof measure>>> = {};
  const c16Runs = new Map<string, Awaited<ReturnType<typeof measure>>[]>();
  const c16Cases = ["floor", "library", "library, stats off", "@upstash/lock"];
  for (let i = 0; i < REPEATS; i++) {
    for (const label of c16Cases) {
      c16Runs.set(label, [...c16Runs.get(label) ?? [], await measure(cycles[label]!, 2000, 16)]);
    }
  }
  for (const label of c16Cases) c16[label] = medianRun(c16Runs.get(label)!, (r) => r.opsPerSec);
  const lib = c16.library!;
  const floor = c16.floor!;
  const bare = c16["library, stats off"]!;
  // The loopback profile's rows, when --delays ran 0 ms.
  const [loopLib, bareLoop, svc] = [
    loopback.library,
    loopback["library, stats off"],
    loopback.service,
  ];
  if (loopLib && bareLoop) {
    target(
      "stats' cost, loopback, concurrency 1: p50 of a cycle with stats vs without",
      `${round(loopLib.p50Ms, 3)} ms vs ${round(bareLoop.p50Ms, 3)} ms`,
      loopLib.p50Ms / bareLoop.p50Ms,
      "≤ 1.05",
      loopLib.p50Ms / bareLoop.p50Ms <= 1.05,
    );
  }
  target(
    "stats' cost, loopback, concurrency 16: throughput with stats vs without",
    `${round(lib.opsPerSec, 0)}/s vs ${round(bare.opsPerSec, 0)}/s`,
    lib.opsPerSec / bare.opsPerSec,
    "≥ 0.95",
    lib.opsPerSec / bare.opsPerSec >= 0.95,
  );
  target(
    "stats' cost: Redis commands and CPU per cycle with stats vs without",
    `${round(lib.commands, 1)} vs ${round(bare.commands, 1)} commands, ${round(lib.usec, 1)} vs ${
      round(bare.usec, 1)
    } µs`,
    lib.usec / bare.usec,
    "bounded (stated)",
    true,
  );
  target(
    "uncontended cycle: Redis commands (scripts' inner calls included)",
    `${round(lib.commands, 1)} vs the floor's ${round(floor.commands, 1)}`,
    lib.commands,
    "≤ 6",
    lib.commands <= 6,
  );
  // The issue set 15 and 25 µs where a TIME+GET+SET script of a lock's record took 4.9 µs; this
  // machine's Redis runs that script about three times slower, so the rows hold the cycle to the
  // same multiples of that script, measured in this run.
  const reference = await referenceScriptUsec(redis);
  for (const [label, run, issueUs] of [["off", bare, 15], ["on", lib, 25]] as const) {
    const most = issueUs / REFERENCE_ISSUE_US;
    target(
      `uncontended cycle: Redis time in scripts, stats ${label}, vs a TIME+GET+SET script`,
      `${round(run.scriptUsec, 1)} µs per acquire+release vs ${round(reference, 1)} µs`,
      run.scriptUsec / reference,
      `≤ ${round(most)} (${issueUs} µs at ${REFERENCE_ISSUE_US} µs)`,
      run.scriptUsec / reference <= most,
    );
  }
  target(
    "loopback, concurrency 16: throughput vs the floor",
    `${round(lib.opsPerSec, 0)}/s vs ${round(floor.opsPerSec, 0)}/s (@upstash/lock ${
      round(c16["@upstash/lock"]!.opsPerSec, 0)
    }/s)`,
    lib.opsPerSec / floor.opsPerSec,
    "≥ 0.75",
    lib.opsPerSec / floor.opsPerSec >= 0.75,
  );
  if (loopLib && svc) {
    target(
      "service on loopback, concurrency 1: p50 vs the library's",
      `${round(svc.p50Ms)} ms vs ${round(loopLib.p50Ms)} ms`,
      svc.p50Ms / loopLib.p50Ms,
      "≤ 1.5",
      svc.p50Ms / loopLib.p50Ms <= 1.5,
    );
  }

  // Memory: what a held lock and a released name leave in Redis.
  const usage = async (pattern: string) => {
    let bytes = 0;
    for (const key of await tcp.keys(pattern)) bytes += Number(await tcp.memory("USAGE", key));
    return bytes;
  };
  const locks = new Locks(redis);
  const name = `mem-${crypto.randomUUID().slice(0, 8)}`;
  const held = await locks.acquire(name, { ttlMs: 60_000 });
  const heldBytes = await usage(`*{${name}}*`);
  if (held.acquired) await locks.release(held.lease);
  const residue = await usage(`*{${name}}*`);
  // Taken again by another token: the record keeps nothing of the last release, which the marks
  // (counted apart) remember for retries.
  const again = await locks.acquire(name, { ttlMs: 60_000 });
  const againBytes = await usage(`edgelock:lock:{${name}}`);
  if (again.acquired) await locks.release(again.lease);
  const theirs = new UpstashLock({ id: `ul:${name}`, redis: redis as never, lease: 60_000 });
  await theirs.acquire();
  const theirBytes = await usage(`ul:${name}*`);
  await theirs.release();
  target(
    "memory: a held lock vs @upstash/lock's",
    `${heldBytes} B vs ${theirBytes} B`,
    heldBytes / theirBytes,
    "≤ 1.2",
    heldBytes / theirBytes <= 1.2,
  );
  target(
    "memory: the record of a lock held again after a release vs @upstash/lock's",
    `${againBytes} B vs ${theirBytes} B`,
    againBytes / theirBytes,
    "≤ 1.2",
    againBytes / theirBytes <= 1.2,
  );
  target(
    "memory: what a released name leaves (for the fence window)",
    `${residue} B`,
    residue,
    "≤ 100 B",
    residue <= 100,
  );

  // The Worker: size and cold start against a hello-world Worker.
  const dir = await Deno.makeTempDir({ prefix: "edgelock-edge-bench-" });
  cleanups.push(() => Deno.remove(dir, { recursive: true }));
  await Deno.writeTextFile(
    `${dir}/hello.ts`,
    `export default { fetch: () => new Response("ok") };\n`,
  );
  await Deno.writeTextFile(
    `${dir}/locks_only.ts`,
    `import { Locks } from "${new URL("../src/core/mod.ts", import.meta.url).pathname}";
import { Redis } from "@upstash/redis/cloudflare";
export default {
  fetch(_r: Request, env: Record<string, string>) {
    const locks = new Locks(new Redis({ url: env.UPSTASH_REDIS_REST_URL!, token: env.UPSTASH_REDIS_REST_TOKEN! }));
    return locks.inspect("x").then((info) => Response.json(info));
  },
};
`,
  );
  await Deno.writeTextFile(
    `${dir}/floor.ts`,
    `import { Redis } from "@upstash/redis/cloudflare";
export default {
  fetch(_r: Request, env: Record<string, string>) {
    const redis = new Redis({ url: env.UPSTASH_REDIS_REST_URL!, token: env.UPSTASH_REDIS_REST_TOKEN! });
    return redis.get("x").then((value) => Response.json(value));
  },
};
`,
  );
  const hello = await minifiedBundle(`${dir}/hello.ts`, dir);
  const service = await buildWorker(`${dir}/built.js`);
  const locksOnly = await minifiedBundle(`${dir}/locks_only.ts`, dir);
  const text = (bytes: Uint8Array) => new TextDecoder().decode(bytes);
  const bindings = {
    UPSTASH_REDIS_REST_URL: bridge.url,
    UPSTASH_REDIS_REST_TOKEN: token,
    LOCK_API_KEYS: `b:${SECRET}`,
  };
  const coldHello = await coldStart(text(hello), "/", {});
  const coldService = await coldStart(text(service), "/healthz", bindings);
  const scripts =
    [...text(locksOnly).matchAll(/"(acquire|renew|release|claim|start_job)"/g)].length;
  target(
    "Worker bundle (minified) gzip",
    `${gzipSize(service)} B (${service.length} B minified)`,
    gzipSize(service) / 1024,
    "≤ 80 KiB",
    gzipSize(service) <= 80 * 1024,
  );
  target(
    "a Locks-only Worker carries only the lock scripts",
    `${gzipSize(locksOnly)} B gzip; use scripts in it: ${
      /start_job|"claim"/.test(text(locksOnly))
    }`,
    scripts,
    "no use scripts",
    !/start_job|"claim"/.test(text(locksOnly)),
  );
  target(
    "Worker cold start in workerd vs a hello-world Worker",
    `${round(coldService, 0)} ms vs ${round(coldHello, 0)} ms`,
    coldService / coldHello,
    "≤ 1.7",
    coldService / coldHello <= 1.7,
  );
  await Deno.writeFile(`${dir}/service.js`, service);
  await Deno.writeFile(`${dir}/floor.js`, await minifiedBundle(`${dir}/floor.ts`, dir));
  const cpuOf = (kind: "service" | "floor") =>
    cpuProbe(`${dir}/${kind}.js`, kind, bridge.url, token, SECRET);
  const [ours, oneCommand] = [await cpuOf("service"), await cpuOf("floor")];
  // Deno's HTTP client costs its first request ~20 ms of CPU whatever the Worker: the target is
  // what the service adds to a one-command Worker's first request.
  const firstOver = ours.firstRequestMs - oneCommand.firstRequestMs;
  target(
    "Worker CPU: the first lock request, over a one-command Worker's first (Deno's process CPU)",
    `${round(firstOver, 1)} ms (${round(ours.firstRequestMs, 1)} ms vs ${
      round(oneCommand.firstRequestMs, 1)
    } ms; import ${round(ours.importMs, 1)} ms vs ${round(oneCommand.importMs, 1)} ms)`,
    round(firstOver, 1),
    "≤ 10 ms",
    firstOver <= 10,
  );
  target(
    "Worker CPU: a warm lock request (acquire or release)",
    `${round(ours.warmRequestMs, 2)} ms; a one-command Worker's: ${
      round(oneCommand.warmRequestMs, 2)
    } ms`,
    round(ours.warmRequestMs, 2),
    "≤ 2 ms",
    ours.warmRequestMs <= 2,
  );

  const date = new Date().toISOString();
  const machine = `${navigator.hardwareConcurrency} cores, Deno ${Deno.version.deno}`;
  await Deno.mkdir(OUT, { recursive: true });
  await Deno.writeTextFile(
    new URL("edge.json", OUT),
    JSON.stringify({ date, machine, targets }, null, 2) + "\n",
  );
  await Deno.writeTextFile(
    new URL("edge.md", OUT),
    [
      `Edge profiles (${machine}; ${date.slice(0, 10)}; \`deno task bench:edge\`).`,
      "",
      "| target | measured | ratio | target | met |",
      "| --- | --- | ---: | --- | --- |",
      ...targets.map((t) =>
        `| ${t.target} | ${t.measured} | ${t.ratio} | ${t.limit} | ${t.met ? "yes" : "**no**"} |`
      ),
      "",
      ...tables,
      "",
    ].join("\n"),
  );
  await Deno.writeTextFile(new URL("edge.svg", OUT), chart(plot));
  console.log(`wrote edge.json, edge.md and edge.svg to ${OUT.pathname}`);
} finally {
  for (const cleanup of cleanups.reverse()) await cleanup().catch(() => {});
  await bridge.close();
  await server.stop();
}
