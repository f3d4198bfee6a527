/**
 * The REST bridge's throughput: requests/s, p50 and p99 latency, and the bridge's own CPU per
 * request for GET, SET, EVALSHA and a 100-command pipeline at concurrency 1 and 64, and GET at
 * concurrency 64 over pool sizes 1 to 16. The bridge runs as its own process (`deno task bridge`,
 * configured by env) so its CPU is read from /proc; the load is plain keep-alive fetches.
 *
 *   deno run -A bench/bridge.ts [--seconds 3] [--update]
 *
 * `--update` writes the table to bench/bridge.md.
 *
 * @module
 */
import { cli } from "../bridge/_cli.ts";
import { startRedisServer } from "../dev/redis_server.ts";
import { spawnDeno } from "../test/_process.ts";

const flags = cli("edgelock bench/bridge.ts", "deno run -A bench/bridge.ts [flags]", {
  seconds: { type: "number", default: 3, min: 1, max: 600, help: "seconds per case" },
  update: { type: "boolean", help: "write bench/bridge.md" },
});

const token = crypto.randomUUID();
const server = await startRedisServer();
const ticksPerSecond = 100; // USER_HZ on Linux

// The bridge process's CPU seconds so far (user + system), from /proc/<pid>/stat.
async function cpuSeconds(pid: number): Promise<number> {
  const stat = await Deno.readTextFile(`/proc/${pid}/stat`);
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return (Number(fields[11]) + Number(fields[12])) / ticksPerSecond;
}

type Body = () => string;
interface Case {
  label: string;
  path: string;
  body: Body;
  commands: number;
}

async function measure(url: string, pid: number, c: Case, concurrency: number) {
  const post = async () => {
    const res = await fetch(`${url}${c.path}`, {
      method: "POST",
      headers: { authorization: `Bearer ${token}` },
      body: c.body(),
    });
    const text = await res.text();
    if (!res.ok || text.includes('"error"')) throw new Error(`${c.label}: ${text.slice(0, 200)}`);
  };
  for (let i = 0; i < 50; i++) await post(); // warm-up
  const times: number[] = [];
  const cpuBefore = await cpuSeconds(pid);
  const started = performance.now();
  const until = started + flags.seconds * 1000;
  await Promise.all(Array.from({ length: concurrency }, async () => {
    while (performance.now() < until) {
      const at = performance.now();
      await post();
      times.push(performance.now() - at);
    }
  }));
  const elapsed = (performance.now() - started) / 1000;
  const cpu = await cpuSeconds(pid) - cpuBefore;
  times.sort((a, b) => a - b);
  return {
    label: c.label,
    concurrency,
    rps: times.length / elapsed,
    p50: times[times.length >> 1]!,
    p99: times[Math.floor(times.length * 0.99)]!,
    cpuUs: (cpu / times.length) * 1e6,
    cpuShare: cpu / elapsed,
  };
}

async function withBridge<T>(poolSize: number, fn: (url: string, pid: number) => Promise<T>) {
  const bridge = await spawnDeno(
    ["run", "-A", "bridge/main.ts"],
    {
      UPSTASH_REDIS_REST_TOKEN: token,
      REDIS_URL: server.url,
      BRIDGE_PORT: "0",
      BRIDGE_POOL_SIZE: String(poolSize),
      BRIDGE_LOG: "off",
    },
    /Upstash REST bridge on (http:\/\/127\.0\.0\.1:\d+) in front of .*\n/,
  );
  try {
    return await fn(bridge.ready[1]!, bridge.child.pid);
  } finally {
    await bridge.stop("SIGTERM");
  }
}

const script = "return redis.call('GET', KEYS[1])";
const rows: Awaited<ReturnType<typeof measure>>[] = [];
const poolRows: Awaited<ReturnType<typeof measure>>[] = [];
try {
  const sha = await withBridge(4, async (url) => {
    const res = await fetch(url, {
      method: "POST",
      headers: { authorization: `Bearer ${token}` },
      body: JSON.stringify(["SCRIPT", "LOAD", script]),
    });
    return (await res.json()).result as string;
  });
  let n = 0;
  const key = () => `bench:${n++ % 1000}`;
  const cases: Case[] = [
    { label: "GET", path: "/", body: () => JSON.stringify(["GET", key()]), commands: 1 },
    {
      label: "SET (100 B)",
      path: "/",
      body: () => JSON.stringify(["SET", key(), "x".repeat(100)]),
      commands: 1,
    },
    {
      label: "EVALSHA",
      path: "/",
      body: () => JSON.stringify(["EVALSHA", sha, 1, key()]),
      commands: 1,
    },
    {
      label: "pipeline of 100 (GET/SET)",
      path: "/pipeline",
      body: () =>
        JSON.stringify(
          Array.from(
            { length: 100 },
            (_, i) => i % 2 ? ["GET", key()] : ["SET", key(), "x".repeat(100)],
          ),
        ),
      commands: 100,
    },
  ];
  await withBridge(4, async (url, pid) => {
    for (const c of cases) {
      for (const concurrency of [1, 64]) rows.push(await measure(url, pid, c, concurrency));
    }
  });
  for (const poolSize of [1, 2, 4, 8, 16]) {
    await withBridge(poolSize, async (url, pid) => {
      const row = await measure(url, pid, cases[0]!, 64);
      poolRows.push({ ...row, label: `GET, pool of ${poolSize}` });
    });
  }
} finally {
  await server.stop();
}

const table = (list: typeof rows) => [
  "| case | concurrency | requests/s | p50 ms | p99 ms | bridge CPU µs/request | bridge CPU use |",
  "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
  ...list.map((r) =>
    `| ${r.label} | ${r.concurrency} | ${Math.round(r.rps)} | ${r.p50.toFixed(2)} | ${
      r.p99.toFixed(2)
    } | ${Math.round(r.cpuUs)} | ${(r.cpuShare * 100).toFixed(0)}% |`
  ),
];
const lines = [
  `The REST bridge on loopback, ${flags.seconds} s per case (\`deno run -A bench/bridge.ts\`, ${
    new Date().toISOString().slice(0, 10)
  }, ${navigator.hardwareConcurrency} cores shared by the load, the bridge and redis-server). ` +
  "The bridge is one process (one JavaScript thread); CPU use is its user + system time over the " +
  "case's wall time (100% is one core).",
  "",
  ...table(rows),
  "",
  "GET at concurrency 64 by the size of the shared pool (BRIDGE_POOL_SIZE):",
  "",
  ...table(poolRows),
];
console.log(lines.join("\n"));
if (flags.update) {
  await Deno.writeTextFile(new URL("./bridge.md", import.meta.url), lines.join("\n") + "\n");
}
