/**
 * What a quorum lock costs against one database: the median acquire+release cycle, REST requests
 * and Redis commands per cycle, on loopback and behind a latency proxy to every database, with
 * 3 and 5 databases, and with 2 of 5 down (their proxies lead nowhere).
 *
 *   deno run -A bench/quorum.ts [--cycles 200] [--delay 20] [--update]
 *
 * `--update` writes the table to bench/quorum.md.
 *
 * @module
 */
import { Redis } from "@upstash/redis";
import { Redis as IORedis } from "ioredis";
import { cli } from "../bridge/_cli.ts";
import { commandStats } from "./_commandstats.ts";
import { type Bridge, startBridge } from "../bridge/mod.ts";
import { startLatencyProxy } from "../dev/latency_proxy.ts";
import { type RedisServer, startRedisServer } from "../dev/redis_server.ts";
import { type LockClient, Locks } from "../src/core/mod.ts";
import { QuorumLocks } from "../src/quorum/mod.ts";

const flags = cli("edgelock bench/quorum.ts", "deno run -A bench/quorum.ts [flags]", {
  cycles: {
    type: "number",
    default: 200,
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
  update: { type: "boolean", help: "write bench/quorum.md" },
});

interface Database {
  server: RedisServer;
  bridge: Bridge;
  tcp: IORedis;
}

const token = crypto.randomUUID();
const databases: Database[] = [];
const median = (values: number[]) => [...values].sort((a, b) => a - b)[values.length >> 1]!;

async function run(delay: number, cycles: number) {
  const proxies = databases.map(({ bridge }) =>
    delay > 0 ? startLatencyProxy(bridge.url, delay) : undefined
  );
  // A database that is down: it answers 503 (behind the same delay), as a failing REST endpoint.
  const refuse = Deno.serve(
    { hostname: "127.0.0.1", port: 0, onListen() {} },
    () => new Response("down", { status: 503 }),
  );
  const deadUrl = `http://127.0.0.1:${refuse.addr.port}`;
  const dead = delay > 0 ? startLatencyProxy(deadUrl, delay) : undefined;
  const client = (url: string) => new Redis({ url, token, enableTelemetry: false, retry: false });
  const urls = databases.map(({ bridge }, i) => proxies[i]?.url ?? bridge.url);
  const down = dead?.url ?? deadUrl;
  const prefix = `bench-${delay}`;
  const cases: [string, LockClient][] = [
    ["one database (Locks)", new Locks(client(urls[0]!), { prefix })],
    ["quorum of 3", new QuorumLocks(urls.slice(0, 3).map(client), { prefix })],
    ["quorum of 5", new QuorumLocks(urls.map(client), { prefix })],
    [
      "quorum of 5, 2 down",
      new QuorumLocks([...urls.slice(0, 3), down, down].map(client), { prefix, timeoutMs: 1000 }),
    ],
  ];
  const rows = [];
  try {
    for (const [label, locks] of cases) {
      const name = `q:${crypto.randomUUID()}`;
      const cycle = async () => {
        const result = await locks.acquire(name, { ttlMs: 10_000 });
        if (!result.acquired) throw new Error(`${label}: busy`);
        await locks.release(result.lease);
      };
      for (let i = 0; i < Math.min(cycles, 20); i++) await cycle(); // warm-up: scripts, JIT
      const requests = databases.reduce((sum, db) => sum + db.bridge.stats().requests, 0);
      const before = await Promise.all(databases.map((db) => commandStats(db.tcp)));
      const times: number[] = [];
      for (let i = 0; i < cycles; i++) {
        const started = performance.now();
        await cycle();
        times.push(performance.now() - started);
      }
      const after = await Promise.all(databases.map((db) => commandStats(db.tcp)));
      rows.push({
        delay,
        label,
        p50: median(times),
        requests: (databases.reduce((sum, db) => sum + db.bridge.stats().requests, 0) - requests) /
          cycles,
        commands: after.reduce((sum, s, i) => sum + s.commands - before[i]!.commands, 0) / cycles,
      });
    }
  } finally {
    await Promise.all([...proxies, dead].map((proxy) => proxy?.close()));
    await refuse.shutdown();
  }
  return rows;
}

try {
  for (let i = 0; i < 5; i++) {
    const server = await startRedisServer();
    const bridge = await startBridge({ redisUrl: server.url, token, port: 0, poolSize: 8 });
    databases.push({ server, bridge, tcp: new IORedis(server.url) });
  }
  const rows = [...await run(0, flags.cycles), ...await run(flags.delay, 10)];
  const lines = [
    `Uncontended acquire+release cycles (one database: stats on; quorum locks keep none); ` +
    `${flags.cycles} per case on loopback, 10 at ` +
    `${flags.delay} ms each way to every database (\`deno run -A bench/quorum.ts\`, ${
      new Date().toISOString().slice(0, 10)
    }). Requests and commands are summed over the databases that answer; a quorum cycle sends ` +
    "three requests to each database: the acquire, the fence commit and the release.",
    "",
    "| one-way delay | locks | median ms per cycle | REST requests | Redis commands |",
    "| ---: | --- | ---: | ---: | ---: |",
    ...rows.map((r) =>
      `| ${r.delay} ms | ${r.label} | ${r.p50.toFixed(2)} | ${r.requests.toFixed(1)} | ${
        r.commands.toFixed(1)
      } |`
    ),
  ];
  console.log(lines.join("\n"));
  if (flags.update) {
    await Deno.writeTextFile(new URL("./quorum.md", import.meta.url), lines.join("\n") + "\n");
  }
} finally {
  for (const { server, bridge, tcp } of databases) {
    tcp.disconnect();
    await bridge.close();
    await server.stop();
  }
}
