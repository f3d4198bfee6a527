/**
 * `deno task bench`: acquire+release cycles against a private redis-server through the local
 * Upstash REST bridge, every case in one run so the ratios are comparable on a noisy machine.
 * Also: 50 waiters contending for one name (each holding 5 ms), and the cost of keeping 1,000
 * leases alive. Writes results.json, results.md and results.svg to bench/tmp/, or with
 * `--update` to bench/ (the tracked results the README shows). `--help` lists the flags.
 *
 * @module
 */
import { Lock as UpstashLock } from "@upstash/lock";
import { Redis } from "@upstash/redis";
import { Redis as IORedis } from "ioredis";
import { Miniflare } from "miniflare";
import { Mutex } from "redis-semaphore";
import Redlock from "redlock";
import { cli } from "../bridge/_cli.ts";
import { startBridge } from "../bridge/mod.ts";
import { freePort, startRedisServer } from "../dev/redis_server.ts";
import { createClient } from "@edgelock/edgelock/client";
import { type Lease, Locks } from "@edgelock/edgelock";

const flags = cli("edgelock bench", "deno task bench [flags]", {
  cycles: { type: "number", default: 1000, min: 10, max: 1_000_000, help: "cycles per case" },
  rounds: {
    type: "number",
    default: 4,
    min: 1,
    max: 1000,
    help: "acquisitions per waiter in the contention case",
  },
  update: { type: "boolean", help: "write the tracked bench/results.* (else bench/tmp/)" },
});
const CYCLES = flags.cycles;
const OUT = new URL(flags.update ? "./" : "./tmp/", import.meta.url);
const CONCURRENCY = [1, 32];
const SECRET = "bench-secret-0123456789abcdef";
const HOLD_MS = 5;
const WAITERS = 50;
const ROUNDS = flags.rounds;

interface ContentionRow {
  case: string;
  acquisitions: number;
  perSec: number;
  idealPerSec: number;
  ofIdeal: number;
  redisCommandsPerAcquisition: number;
  /** Commands sent over REST (what Upstash bills); undefined for the TCP peers. */
  restCommandsPerAcquisition?: number;
  waitP50Ms: number;
  waitP99Ms: number;
  /** Mean distance between a waiter's place in arrival order and in grant order (0 = FIFO). */
  meanDisplacement: number;
}

interface Row {
  case: string;
  concurrency: number;
  cycles: number;
  opsPerSec: number;
  p50Ms: number;
  p99Ms: number;
  requestsPerCycle: number;
  redisCommandsPerCycle: number;
  ratioToFloor?: number;
}

type Cycle = (name: string) => Promise<void>;

const server = await startRedisServer();
const token = crypto.randomUUID();
const bridge = await startBridge({ redisUrl: server.url, token, port: 0, poolSize: 8 });
const redis = new Redis({ url: bridge.url, token, enableTelemetry: false });
const cleanups: (() => Promise<unknown>)[] = [];
// @upstash/lock types its own copy of @upstash/redis; the client is the same at run time.
const peerRedis = redis as never;
const tcp = new IORedis(server.url, { lazyConnect: true });
await tcp.connect();
cleanups.push(() => tcp.quit());
// Commands Redis executed so far (scripts' inner calls included), less this INFO call itself.
let infoCalls = 0;
async function redisCommands(): Promise<number> {
  const info = await tcp.info("stats");
  infoCalls++;
  return Number(/total_commands_processed:(\d+)/.exec(info)?.[1]) - infoCalls;
}

try {
  // The floor: the least any lock can do over REST, SET NX PX plus one EVALSHA release.
  const releaseSha = await redis.scriptLoad(
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
  );
  const floor: Cycle = async (name) => {
    const owner = crypto.randomUUID();
    if (await redis.set(`floor:${name}`, owner, { nx: true, px: 10_000 }) !== "OK") {
      throw new Error("floor: busy");
    }
    await redis.evalsha(releaseSha, [`floor:${name}`], [owner]);
  };

  const locks = new Locks(redis);
  const library: Cycle = async (name) => {
    const result = await locks.acquire(name);
    if (!result.acquired) throw new Error("library: busy");
    await locks.release(result.lease);
  };

  const service = await startService();
  const client = createClient({ baseUrl: service, apiKey: SECRET });
  const overHttp: Cycle = async (name) => {
    const result = await client.acquire(name);
    if (!result.acquired) throw new Error("service: busy");
    await client.release(result.lease);
  };

  const worker = await startWorker();
  const workerClient = createClient({
    baseUrl: "http://edgelock.bench",
    apiKey: SECRET,
    fetch: ((input: string | URL | Request, init?: RequestInit) =>
      worker.dispatchFetch(String(input), init as never)) as unknown as typeof fetch,
  });
  const inWorkerd: Cycle = async (name) => {
    const result = await workerClient.acquire(name);
    if (!result.acquired) throw new Error("worker: busy");
    await workerClient.release(result.lease);
  };

  const upstashLock: Cycle = async (name) => {
    const lock = new UpstashLock({
      id: `ul:${name}`,
      redis: peerRedis,
      lease: 10_000,
      retry: { attempts: 1, delay: 1 },
    });
    if (!(await lock.acquire())) throw new Error("@upstash/lock: busy");
    await lock.release();
  };
  const redlock = new Redlock([tcp], { retryCount: 0 });
  const redlockCycle: Cycle = async (name) => {
    const lock = await redlock.lock(`rl:${name}`, 10_000);
    await lock.unlock();
  };
  const semaphoreCycle: Cycle = async (name) => {
    const mutex = new Mutex(tcp, `rs:${name}`, {
      lockTimeout: 10_000,
      acquireTimeout: 1000, // uncontended: each cycle uses its own name
      refreshInterval: 0,
    });
    await mutex.acquire();
    await mutex.release();
  };

  const cases: [string, Cycle][] = [
    ["floor (SET NX PX + EVALSHA)", floor],
    ["edgelock library", library],
    ["@upstash/lock", upstashLock],
    ["edgelock service (Deno.serve)", overHttp],
    ["edgelock Worker (workerd via Miniflare)", inWorkerd],
    ["redlock (TCP, reference)", redlockCycle],
    ["redis-semaphore Mutex (TCP, reference)", semaphoreCycle],
  ];
  const rows: Row[] = [];
  for (const concurrency of CONCURRENCY) {
    for (const [label, cycle] of cases) {
      rows.push(await measure(label, concurrency, cycle));
      console.log(format(rows.at(-1)!));
    }
  }
  for (const row of rows) {
    const base = rows.find((r) => r.concurrency === row.concurrency && r.case.startsWith("floor"));
    if (base) row.ratioToFloor = round(row.opsPerSec / base.opsPerSec, 2);
  }
  const rtt = rows.find((r) => r.concurrency === 1 && r.case.startsWith("floor"))!.p50Ms / 2;
  const contention: ContentionRow[] = [];
  const waiters: [string, (name: string) => Promise<() => Promise<unknown>>][] = [
    ["edgelock library (fair queue)", async (name) => {
      const result = await locks.acquire(name, { ttlMs: 10_000, waitMs: 30_000 });
      if (!result.acquired) throw new Error("edgelock: gave up");
      return () => locks.release(result.lease);
    }],
    ["@upstash/lock (fixed 10 ms retry)", async (name) => {
      const lock = new UpstashLock({
        id: `ul:${name}`,
        redis: peerRedis,
        lease: 10_000,
        retry: { attempts: 3000, delay: 10 },
      });
      if (!(await lock.acquire())) throw new Error("@upstash/lock: gave up");
      return () => lock.release();
    }],
    ["redis-semaphore Mutex (TCP, 10 ms retry)", async (name) => {
      const mutex = new Mutex(tcp, `rs:${name}`, {
        lockTimeout: 10_000,
        acquireTimeout: 30_000,
        retryInterval: 10,
        refreshInterval: 0,
      });
      await mutex.acquire();
      return () => mutex.release();
    }],
  ];
  // The same loop with one client: what this harness reaches with no contention at all.
  const [, edgelockWait] = waiters[0]!;
  contention.push(
    await contend("edgelock library, 1 client (no contention)", edgelockWait, rtt, 1),
  );
  for (const [label, wait] of waiters) {
    contention.push(await contend(label, wait, rtt));
    console.log(JSON.stringify(contention.at(-1)));
  }
  const renewal = await renewalCost(locks);
  console.log(JSON.stringify(renewal));
  await Deno.mkdir(OUT, { recursive: true });
  await write(rows, contention, renewal);
  console.log(`wrote results.json, results.md and results.svg to ${OUT.pathname}`);
} finally {
  for (const cleanup of cleanups.reverse()) await cleanup().catch(() => {});
  await bridge.close();
  await server.stop();
}

async function measure(label: string, concurrency: number, cycle: Cycle): Promise<Row> {
  const names = Array.from({ length: concurrency }, () => `bench:${crypto.randomUUID()}`);
  for (const name of names) await cycle(name); // warm-up: scripts loaded, connections open
  const latencies: number[] = [];
  const before = bridge.stats().requests;
  const commandsBefore = await redisCommands();
  const started = performance.now();
  let next = 0;
  await Promise.all(names.map(async (name) => {
    while (next++ < CYCLES) {
      const t0 = performance.now();
      await cycle(name);
      latencies.push(performance.now() - t0);
    }
  }));
  const elapsed = performance.now() - started;
  const commands = await redisCommands() - commandsBefore;
  latencies.sort((a, b) => a - b);
  return {
    case: label,
    concurrency,
    cycles: latencies.length,
    opsPerSec: round(latencies.length / (elapsed / 1000), 0),
    p50Ms: round(latencies[Math.floor(latencies.length * 0.5)]!, 2),
    p99Ms: round(latencies[Math.floor(latencies.length * 0.99)]!, 2),
    requestsPerCycle: round((bridge.stats().requests - before) / latencies.length, 2),
    redisCommandsPerCycle: round(commands / latencies.length, 2),
  };
}

/** 50 waiters on one name, each acquiring ROUNDS times and holding 5 ms. */
async function contend(
  label: string,
  wait: (name: string) => Promise<() => Promise<unknown>>,
  rttMs: number,
  waiters = WAITERS,
): Promise<ContentionRow> {
  const rounds = Math.ceil((WAITERS * ROUNDS) / waiters);
  const name = `contend:${crypto.randomUUID()}`;
  const waits: number[] = [];
  const arrivals: number[] = [];
  const grants: number[] = [];
  let next = 0;
  const commandsBefore = await redisCommands();
  const restBefore = bridge.stats().commands;
  const started = performance.now();
  await Promise.all(Array.from({ length: waiters }, async (_, waiter) => {
    await new Promise((resolve) => setTimeout(resolve, waiter)); // staggered: a known arrival order
    for (let round = 0; round < rounds; round++) {
      const t0 = performance.now();
      const arrival = next++;
      const release = await wait(name);
      waits.push(performance.now() - t0);
      arrivals.push(arrival);
      grants.push(grants.length);
      await new Promise((resolve) => setTimeout(resolve, HOLD_MS));
      await release();
    }
  }));
  const elapsed = performance.now() - started;
  const commands = await redisCommands() - commandsBefore;
  waits.sort((a, b) => a - b);
  // Arrival ranks in grant order: FIFO gives 0, 1, 2, …
  const order = arrivals.map((a, i) => [a, i] as const).sort((x, y) => x[0] - y[0]);
  const rankOfGrant = new Map(order.map(([, grantIndex], rank) => [grantIndex, rank]));
  const displacement = grants.reduce((sum, g) => sum + Math.abs(rankOfGrant.get(g)! - g), 0) /
    grants.length;
  const ideal = 1000 / (HOLD_MS + 2 * rttMs); // a hand-off needs the release and the next acquire
  const perSec = waits.length / (elapsed / 1000);
  return {
    case: label,
    acquisitions: waits.length,
    perSec: round(perSec, 0),
    idealPerSec: round(ideal, 0),
    ofIdeal: round(perSec / ideal, 2),
    redisCommandsPerAcquisition: round(commands / waits.length, 1),
    ...(!label.includes("TCP") &&
      {
        restCommandsPerAcquisition: round((bridge.stats().commands - restBefore) / waits.length, 2),
      }),
    waitP50Ms: round(waits[Math.floor(waits.length * 0.5)]!, 1),
    waitP99Ms: round(waits[Math.floor(waits.length * 0.99)]!, 1),
    meanDisplacement: round(displacement, 1),
  };
}

/** What keeping 1,000 leases alive costs: renewing at a third of a 10 s TTL, one by one or batched. */
async function renewalCost(locks: Locks) {
  const leases: Lease[] = [];
  for (let i = 0; i < 1000; i++) {
    const result = await locks.acquire(`renew:${crypto.randomUUID()}`, { ttlMs: 10_000 });
    if (result.acquired) leases.push(result.lease);
  }
  await locks.renewMany(leases.slice(0, 1));
  const time = async (fn: () => Promise<unknown>) => {
    const { requests, commands: sent } = bridge.stats();
    const commands = await redisCommands();
    const t0 = performance.now();
    await fn();
    return {
      ms: round(performance.now() - t0, 1),
      requests: bridge.stats().requests - requests,
      restCommands: bridge.stats().commands - sent,
      commands: await redisCommands() - commands,
    };
  };
  const single = await time(async () => {
    for (let i = 0; i < leases.length; i += 32) {
      await Promise.all(leases.slice(i, i + 32).map((lease) => locks.renew(lease)));
    }
  });
  const batch = await time(() => locks.renewMany(leases));
  const perSecond = 3 / 10; // each lease renewed three times per 10 s TTL
  return {
    leases: leases.length,
    oneByOne: { ...single, restCommandsPerSec: round(single.restCommands * perSecond, 1) },
    batched: { ...batch, restCommandsPerSec: round(batch.restCommands * perSecond, 1) },
    redisCommandsPerSec: round(batch.commands * perSecond, 0),
  };
}

async function startService(): Promise<string> {
  const port = freePort();
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "worker/deno.ts"],
    env: {
      PORT: String(port),
      UPSTASH_REDIS_REST_URL: bridge.url,
      UPSTASH_REDIS_REST_TOKEN: token,
      LOCK_API_KEYS: `bench:${SECRET}`,
      LOCK_RATE_LIMIT: "0", // the bench measures locks, not the per-tenant admission limit
    },
    stdout: "null",
    stderr: "null",
  }).spawn();
  cleanups.push(async () => {
    child.kill("SIGTERM");
    await child.status;
  });
  const url = `http://127.0.0.1:${port}`;
  for (let i = 0; i < 200; i++) {
    const ok = await fetch(`${url}/healthz`).then(
      (r) => r.body?.cancel().then(() => r.ok),
      () => false,
    );
    if (ok) return url;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  throw new Error("the service did not start");
}

async function startWorker(): Promise<Miniflare> {
  const dir = await Deno.makeTempDir({ prefix: "edgelock-bench-" });
  cleanups.push(() => Deno.remove(dir, { recursive: true }));
  const out = `${dir}/worker.js`;
  const built = await new Deno.Command(Deno.execPath(), {
    args: ["bundle", "--quiet", "--platform", "browser", "-o", out, "worker/cloudflare.ts"],
  }).output();
  if (!built.success) throw new Error("deno bundle failed");
  const mf = new Miniflare({
    modules: true,
    script: await Deno.readTextFile(out),
    compatibilityDate: "2026-08-01",
    bindings: {
      UPSTASH_REDIS_REST_URL: bridge.url,
      UPSTASH_REDIS_REST_TOKEN: token,
      LOCK_API_KEYS: `bench:${SECRET}`,
      LOCK_RATE_LIMIT: "0", // the bench measures locks, not the per-tenant admission limit
    },
  });
  cleanups.push(() => mf.dispose());
  return mf;
}

function round(value: number, digits: number): number {
  return Number(value.toFixed(digits));
}

function format(row: Row): string {
  return `${row.case.padEnd(42)} c=${String(row.concurrency).padEnd(3)} ${
    String(row.opsPerSec).padStart(6)
  } ops/s  p50 ${row.p50Ms} ms  p99 ${row.p99Ms} ms  ${row.requestsPerCycle} req/cycle`;
}

async function write(
  rows: Row[],
  contention: ContentionRow[],
  renewal: Awaited<ReturnType<typeof renewalCost>>,
) {
  const machine = `${navigator.hardwareConcurrency} cores, Deno ${Deno.version.deno}`;
  const date = new Date().toISOString();
  await Deno.writeTextFile(
    new URL("results.json", OUT),
    JSON.stringify({ date, machine, cyclesPerCase: CYCLES, rows, contention, renewal }, null, 2) +
      "\n",
  );
  const lines = [
    `Acquire+release cycles on loopback (${machine}; ${CYCLES} cycles per case; ${
      date.slice(0, 10)
    }).`,
    "REST requests are the bridge's count (the TCP peers make none); Redis commands include",
    "the calls inside scripts. At concurrency 32 the Upstash client batches concurrent commands",
    "into one /pipeline request, so requests per cycle drop below 1.",
    "",
    "| case | concurrency | ops/s | p50 ms | p99 ms | REST requests / cycle | Redis commands / cycle | × floor |",
    "|---|---|---|---|---|---|---|---|",
    ...rows.map((r) =>
      `| ${r.case} | ${r.concurrency} | ${r.opsPerSec} | ${r.p50Ms} | ${r.p99Ms} | ${r.requestsPerCycle} | ${r.redisCommandsPerCycle} | ${
        r.ratioToFloor ?? ""
      } |`
    ),
    "",
    `Contention: ${WAITERS} waiters on one name, each acquiring ${ROUNDS} times and holding ${HOLD_MS} ms.`,
    "Ideal = 1 / (hold + two round trips). Displacement = mean distance between arrival and grant order.",
    "The one-client row shows what this harness reaches without contention (timer overshoot and",
    "the shared event loop included): the contended rows are best read against it.",
    "",
    "| case | acquisitions/s | ideal | of ideal | REST commands / acquisition (billed) | Redis commands executed / acquisition | wait p50 ms | wait p99 ms | displacement |",
    "|---|---|---|---|---|---|---|---|---|",
    ...contention.map((c) =>
      `| ${c.case} | ${c.perSec} | ${c.idealPerSec} | ${c.ofIdeal} | ${
        c.restCommandsPerAcquisition ?? "n/a (TCP)"
      } | ${c.redisCommandsPerAcquisition} | ${c.waitP50Ms} | ${c.waitP99Ms} | ${c.meanDisplacement} |`
    ),
    "",
    `Keeping ${renewal.leases} leases alive (10 s TTL, renewed every third of it): one renew per ` +
    `lease costs ${renewal.oneByOne.restCommandsPerSec} billed REST commands/s (the client ` +
    `pipelined them into ${renewal.oneByOne.requests} requests per round); renewMany costs ` +
    `${renewal.batched.restCommandsPerSec} commands/s (one request, ${renewal.batched.ms} ms for all ` +
    `${renewal.leases}); Redis executes about ${renewal.redisCommandsPerSec} commands/s inside the scripts.`,
  ];
  await Deno.writeTextFile(new URL("results.md", OUT), lines.join("\n") + "\n");
  await Deno.writeTextFile(new URL("results.svg", OUT), chart(rows));
}

/** A horizontal bar chart of ops/s per case, one bar per concurrency. */
function chart(rows: Row[]): string {
  const labels = [...new Set(rows.map((r) => r.case))];
  const max = Math.max(...rows.map((r) => r.opsPerSec));
  const barHeight = 12;
  const rowHeight = 34;
  const left = 300;
  const width = 820;
  const scale = (v: number) => Math.max(1, (v / max) * (width - left - 80));
  const colors: Record<number, string> = { 1: "#4a7ab8", 32: "#e08a2c" };
  const bars = labels.flatMap((label, i) => {
    const y = 40 + i * rowHeight;
    return [
      `<text x="${left - 8}" y="${y + barHeight}" text-anchor="end">${escapeXml(label)}</text>`,
      ...CONCURRENCY.map((c, j) => {
        const row = rows.find((r) => r.case === label && r.concurrency === c);
        if (!row) return "";
        const by = y + j * (barHeight + 2);
        return `<rect x="${left}" y="${by}" width="${
          scale(row.opsPerSec).toFixed(1)
        }" height="${barHeight}" fill="${colors[c]}"/>` +
          `<text x="${left + scale(row.opsPerSec) + 4}" y="${
            by + 10
          }" font-size="10">${row.opsPerSec}</text>`;
      }),
    ];
  });
  const height = 60 + labels.length * rowHeight;
  return `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="10" y="20" font-size="14">Acquire+release cycles per second (higher is better)</text>
<rect x="${left}" y="8" width="10" height="10" fill="${colors[1]}"/><text x="${
    left + 14
  }" y="17">concurrency 1</text>
<rect x="${left + 120}" y="8" width="10" height="10" fill="${colors[32]}"/><text x="${
    left + 134
  }" y="17">concurrency 32</text>
${bars.join("\n")}
</svg>
`;
}

function escapeXml(text: string): string {
  return text.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
}
