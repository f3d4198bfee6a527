/**
 * `deno task bench`: acquire+release cycles against a private redis-server through the local
 * Upstash REST bridge, every case in one run so the ratios are comparable on a noisy machine.
 * Writes bench/results.json and bench/results.md.
 *
 * BENCH_CYCLES (default 1000) sets the cycles per case and concurrency.
 *
 * @module
 */
import { Redis } from "@upstash/redis";
import { Miniflare } from "miniflare";
import { startBridge } from "../dev/bridge.ts";
import { freePort, startRedisServer } from "../dev/redis_server.ts";
import { createClient, Locks } from "../src/mod.ts";

const CYCLES = Number(Deno.env.get("BENCH_CYCLES") ?? 1000);
const CONCURRENCY = [1, 32];
const SECRET = "bench-secret-0123456789abcdef";

interface Row {
  case: string;
  concurrency: number;
  cycles: number;
  opsPerSec: number;
  p50Ms: number;
  p99Ms: number;
  requestsPerCycle: number;
  ratioToFloor?: number;
}

type Cycle = (name: string) => Promise<void>;

const server = await startRedisServer();
const token = crypto.randomUUID();
const bridge = await startBridge({ redisUrl: server.url, token, port: 0, poolSize: 8 });
const redis = new Redis({ url: bridge.url, token, enableTelemetry: false });
const cleanups: (() => Promise<unknown>)[] = [];

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

  const cases: [string, Cycle][] = [
    ["floor (SET NX PX + EVALSHA)", floor],
    ["edgelock library", library],
    ["edgelock service (Deno.serve)", overHttp],
    ["edgelock Worker (workerd via Miniflare)", inWorkerd],
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
  await write(rows);
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
  latencies.sort((a, b) => a - b);
  return {
    case: label,
    concurrency,
    cycles: latencies.length,
    opsPerSec: round(latencies.length / (elapsed / 1000), 0),
    p50Ms: round(latencies[Math.floor(latencies.length * 0.5)]!, 2),
    p99Ms: round(latencies[Math.floor(latencies.length * 0.99)]!, 2),
    requestsPerCycle: round((bridge.stats().requests - before) / latencies.length, 2),
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

async function write(rows: Row[]) {
  const machine = `${navigator.hardwareConcurrency} cores, Deno ${Deno.version.deno}`;
  await Deno.writeTextFile(
    new URL("./results.json", import.meta.url),
    JSON.stringify(
      { date: new Date().toISOString(), machine, cyclesPerCase: CYCLES, rows },
      null,
      2,
    ) +
      "\n",
  );
  const lines = [
    `Acquire+release cycles on loopback (${machine}; ${CYCLES} cycles per case).`,
    "",
    "| case | concurrency | ops/s | p50 ms | p99 ms | REST requests / cycle | × floor |",
    "|---|---|---|---|---|---|---|",
    ...rows.map((r) =>
      `| ${r.case} | ${r.concurrency} | ${r.opsPerSec} | ${r.p50Ms} | ${r.p99Ms} | ${r.requestsPerCycle} | ${
        r.ratioToFloor ?? ""
      } |`
    ),
  ];
  await Deno.writeTextFile(new URL("./results.md", import.meta.url), lines.join("\n") + "\n");
}
