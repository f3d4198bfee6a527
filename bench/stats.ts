/**
 * The stats' cost: uncontended acquire+release cycles with stats (and the held index) on and off,
 * interleaved in rounds so both see the same machine, on loopback and behind a latency proxy;
 * with Redis commands and Redis CPU per cycle from INFO commandstats.
 *
 *   deno run -A bench/stats.ts [--rounds 10] [--cycles 200] [--delay 20] [--concurrency 1]
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
import { Locks } from "../src/core/mod.ts";

const flags = cli("edgelock bench/stats.ts", "deno run -A bench/stats.ts [flags]", {
  rounds: { type: "string", default: "10", help: "interleaved rounds" },
  cycles: { type: "string", default: "200", help: "cycles per round and mode on loopback" },
  delay: { type: "string", default: "20", help: "one-way delay of the second run, ms" },
  concurrency: { type: "string", default: "1", help: "cycles in flight at once" },
});
const server = await startRedisServer();
const token = crypto.randomUUID();
const bridge = await startBridge({ redisUrl: server.url, token, port: 0, poolSize: 8 });
const tcp = new IORedis(server.url);
const median = (values: number[]) => [...values].sort((a, b) => a - b)[values.length >> 1]!;

async function run(url: string, cycles: number) {
  const redis = new Redis({ url, token, enableTelemetry: false });
  const modes = {
    "stats on": new Locks(redis, { prefix: `on-${cycles}` }),
    "stats off": new Locks(redis, { prefix: `off-${cycles}`, stats: false }),
  };
  const ms: Record<string, number[]> = { "stats on": [], "stats off": [] };
  const work: Record<string, { commands: number; usec: number }> = {
    "stats on": { commands: 0, usec: 0 },
    "stats off": { commands: 0, usec: 0 },
  };
  for (let round = 0; round < Number(flags.rounds); round++) {
    for (const [label, locks] of Object.entries(modes)) {
      const before = await commandStats(tcp);
      const started = performance.now();
      const lanes = Number(flags.concurrency);
      await Promise.all(Array.from({ length: lanes }, async (_, lane) => {
        for (let i = lane; i < cycles; i += lanes) {
          const result = await locks.acquire(`n${lane}:${i % 4}`);
          if (!result.acquired) throw new Error("busy");
          await locks.release(result.lease);
        }
      }));
      ms[label]!.push((performance.now() - started) / cycles);
      const after = await commandStats(tcp);
      work[label]!.commands += (after.commands - before.commands) / cycles;
      work[label]!.usec += (after.usec - before.usec) / cycles;
    }
  }
  const rounds = Number(flags.rounds);
  return Object.keys(modes).map((label) => ({
    label,
    p50: median(ms[label]!),
    commands: work[label]!.commands / rounds,
    usec: work[label]!.usec / rounds,
  }));
}

try {
  const proxy = startLatencyProxy(bridge.url, Number(flags.delay));
  const rows = [
    ...(await run(bridge.url, Number(flags.cycles))).map((r) => ({ ...r, delay: 0 })),
    ...(await run(proxy.url, 10)).map((r) => ({ ...r, delay: Number(flags.delay) })),
  ];
  await proxy.close();
  console.log(
    "| one-way delay | mode | median ms per cycle | vs off | Redis commands | Redis µs |",
  );
  console.log("| ---: | --- | ---: | ---: | ---: | ---: |");
  for (const r of rows) {
    const off = rows.find((o) => o.delay === r.delay && o.label === "stats off")!;
    console.log(
      `| ${r.delay} ms | ${r.label} | ${r.p50.toFixed(3)} | ${(r.p50 / off.p50).toFixed(3)} | ${
        r.commands.toFixed(1)
      } | ${r.usec.toFixed(1)} |`,
    );
  }
} finally {
  tcp.disconnect();
  await bridge.close();
  await server.stop();
}
