/**
 * What each primitive's uncontended cycle costs: REST requests, Redis commands and Redis CPU
 * (INFO commandstats) per cycle, and its median time on loopback and behind a latency proxy.
 * Stats on (the default), so the figures include the stats and the held index.
 *
 *   deno run -A bench/primitives.ts [--cycles 300] [--delay 20] [--update]
 *
 * `--update` writes the table to bench/primitives.md.
 *
 * @module
 */
import { Redis } from "@upstash/redis";
import { Redis as IORedis } from "ioredis";
import { cli } from "../bridge/_cli.ts";
import { commandStats } from "./_commandstats.ts";
import { startBridge } from "../bridge/mod.ts";
import { startLatencyProxy } from "../dev/latency_proxy.ts";
import { startRedisServer } from "../dev/redis_server.ts";
import { type Lease, Locks } from "../src/core/mod.ts";

const flags = cli("edgelock bench/primitives.ts", "deno run -A bench/primitives.ts [flags]", {
  cycles: {
    type: "number",
    default: 300,
    min: 10,
    max: 100_000,
    help: "cycles per case, loopback",
  },
  delay: {
    type: "number",
    default: 20,
    min: 1,
    max: 500,
    help: "one-way delay of the second run, ms",
  },
  update: { type: "boolean", help: "write bench/primitives.md" },
});
const server = await startRedisServer();
const token = crypto.randomUUID();
const bridge = await startBridge({ redisUrl: server.url, token, port: 0, poolSize: 8 });
const tcp = new IORedis(server.url);
const median = (values: number[]) => [...values].sort((a, b) => a - b)[values.length >> 1]!;

function granted<T extends { acquired: boolean }>(result: T): Extract<T, { acquired: true }> {
  if (!result.acquired) throw new Error(`busy: ${JSON.stringify(result)}`);
  return result as Extract<T, { acquired: true }>;
}

type Cycle = (name: string) => Promise<void>;

function casesFor(locks: Locks): Record<string, { setup?: Cycle; cycle: Cycle }> {
  const releaseAll = (leases: Lease[]) => Promise.all(leases.map((l) => locks.release(l)));
  const group = (name: string, n: number) => Array.from({ length: n }, (_, i) => `{${name}}${i}`);
  return {
    "exclusive (mutex)": {
      cycle: async (name) => void await locks.release(granted(await locks.acquire(name)).lease),
    },
    "exclusive, reentrant: 2 acquires, 2 releases": {
      cycle: async (name) => {
        const { lease } = granted(await locks.acquire(name, { reentrant: true }));
        await locks.acquire(name, { reentrant: true, token: lease.token });
        await locks.release(lease);
        await locks.release(lease);
      },
    },
    "shared, alone": {
      cycle: async (name) =>
        void await locks.release(granted(await locks.acquire(name, { mode: "shared" })).lease),
    },
    "shared, beside 10 readers": {
      setup: async (name) => {
        for (let i = 0; i < 10; i++) await locks.acquire(name, { mode: "shared", ttlMs: 300_000 });
      },
      cycle: async (name) =>
        void await locks.release(granted(await locks.acquire(name, { mode: "shared" })).lease),
    },
    "semaphore, limit 5": {
      cycle: async (name) =>
        void await locks.release(granted(await locks.acquire(name, { limit: 5 })).lease),
    },
    "multi-name, 2 names (releases in parallel)": {
      cycle: async (name) =>
        void await releaseAll(granted(await locks.acquireAll(group(name, 2))).leases),
    },
    "multi-name, 8 names (releases in parallel)": {
      cycle: async (name) =>
        void await releaseAll(granted(await locks.acquireAll(group(name, 8))).leases),
    },
  };
}

async function run(url: string, cycles: number, delay: number) {
  const redis = new Redis({ url, token, enableTelemetry: false });
  const locks = new Locks(redis, { prefix: `bench-${delay}` });
  const rows = [];
  for (const [label, { setup, cycle }] of Object.entries(casesFor(locks))) {
    const name = `p:${crypto.randomUUID()}`;
    await setup?.(name);
    for (let i = 0; i < Math.min(cycles, 50); i++) await cycle(name); // warm-up: scripts, JIT
    const times: number[] = [];
    const requests = bridge.stats().requests;
    const before = await commandStats(tcp);
    for (let i = 0; i < cycles; i++) {
      const started = performance.now();
      await cycle(name);
      times.push(performance.now() - started);
    }
    const after = await commandStats(tcp);
    rows.push({
      delay,
      label,
      p50: median(times),
      requests: (bridge.stats().requests - requests) / cycles,
      commands: (after.commands - before.commands) / cycles,
      usec: (after.usec - before.usec) / cycles,
    });
  }
  return rows;
}

try {
  const proxy = startLatencyProxy(bridge.url, flags.delay);
  const rows = [
    ...await run(bridge.url, flags.cycles, 0),
    ...await run(proxy.url, 10, flags.delay),
  ];
  await proxy.close();
  const lines = [
    `Uncontended cycles, stats on; ${flags.cycles} cycles per case on loopback, 10 at ` +
    `${flags.delay} ms each way (\`deno run -A bench/primitives.ts\`, ${
      new Date().toISOString().slice(0, 10)
    }).`,
    "",
    "| one-way delay | primitive | median ms per cycle | REST requests | Redis commands | Redis µs |",
    "| ---: | --- | ---: | ---: | ---: | ---: |",
    ...rows.map((r) =>
      `| ${r.delay} ms | ${r.label} | ${r.p50.toFixed(2)} | ${r.requests.toFixed(1)} | ${
        r.commands.toFixed(1)
      } | ${r.usec.toFixed(1)} |`
    ),
  ];
  console.log(lines.join("\n"));
  if (flags.update) {
    await Deno.writeTextFile(new URL("./primitives.md", import.meta.url), lines.join("\n") + "\n");
  }
} finally {
  tcp.disconnect();
  await bridge.close();
  await server.stop();
}
