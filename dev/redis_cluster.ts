/**
 * A private Redis Cluster on loopback for tests and local runs: Debian's `redis-server`, by
 * default 3 primaries and 3 replicas, joined with `redis-cli --cluster create`. Each node gets a
 * port below 45535, so its cluster bus (port + 10000) stays below 55535, and both must be free.
 *
 *   deno run -A dev/redis_cluster.ts [--primaries 3] [--replicas 1]   (prints the seed URLs)
 *
 * @module
 */
import { cli } from "../bridge/_cli.ts";
import { type RedisServer, startRedisServer } from "./redis_server.ts";

/** A running cluster. */
export interface RedisCluster {
  /** Every node's URL, primaries first as created. */
  urls: string[];
  nodes: RedisServer[];
  /** Stops every node and removes their directories. */
  stop(): Promise<void>;
}

const CLUSTER_ARGS = [
  "--cluster-enabled",
  "yes",
  "--cluster-config-file",
  "nodes.conf",
  "--cluster-node-timeout",
  "2000",
  "--appendonly",
  "yes",
  "--appendfsync",
  "always",
];

function bindable(port: number): boolean {
  try {
    Deno.listen({ hostname: "127.0.0.1", port }).close();
    return true;
  } catch {
    return false;
  }
}

// A port whose cluster bus port is free too, from a range below the kernel's ephemeral ports.
function clusterPort(taken: Set<number>): number {
  for (let attempt = 0; attempt < 1000; attempt++) {
    const port = 20_000 + Math.floor(Math.random() * 25_000);
    if (taken.has(port) || taken.has(port + 10_000)) continue;
    if (bindable(port) && bindable(port + 10_000)) return port;
  }
  throw new Error("No free pair of ports (port and port + 10000) below 55535");
}

/** Starts the nodes, joins them into a cluster, and resolves once every node says `cluster_state:ok`. */
export async function startRedisCluster(
  { primaries = 3, replicas = 1 }: { primaries?: number; replicas?: number } = {},
): Promise<RedisCluster> {
  const nodes: RedisServer[] = [];
  const stop = async () => {
    await Promise.all(nodes.map((node) => node.stop({ remove: true })));
  };
  try {
    const taken = new Set<number>();
    for (let i = 0; i < primaries * (1 + replicas); i++) {
      const port = clusterPort(taken);
      taken.add(port);
      taken.add(port + 10_000);
      nodes.push(await startRedisServer({ port, args: CLUSTER_ARGS }));
    }
    const create = await new Deno.Command("redis-cli", {
      args: [
        "--cluster",
        "create",
        ...nodes.map((node) => `127.0.0.1:${node.port}`),
        "--cluster-replicas",
        String(replicas),
        "--cluster-yes",
      ],
      stdout: "piped",
      stderr: "piped",
    }).output();
    if (!create.success) {
      throw new Error(
        `redis-cli --cluster create failed: ${new TextDecoder().decode(create.stderr)}`,
      );
    }
    const deadline = Date.now() + 20_000;
    for (const node of nodes) {
      while (!(await clusterInfo(node.port)).includes("cluster_state:ok")) {
        if (Date.now() > deadline) throw new Error(`node ${node.port} did not join the cluster`);
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
    }
    // Every replica attached and in sync, or a stopped primary may have none to take over.
    const synced = async () => {
      const infos = await Promise.all(
        nodes.map((node) => redisCli(node.port, "info", "replication")),
      );
      return infos.filter((info) => /role:slave/.test(info) && /master_link_status:up/.test(info))
        .length === primaries * replicas;
    };
    while (!(await synced())) {
      if (Date.now() > deadline) throw new Error("the replicas did not sync with their primaries");
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    return { urls: nodes.map((node) => node.url), nodes, stop };
  } catch (error) {
    await stop();
    throw error;
  }
}

/** Redis Cluster's hash slot of a key: CRC16 (XMODEM) of its hash tag, or of the key, mod 16384. */
export function slotOf(key: string): number {
  const open = key.indexOf("{");
  const close = open < 0 ? -1 : key.indexOf("}", open + 1);
  const tagged = close > open + 1 ? key.slice(open + 1, close) : key;
  let crc = 0;
  for (const byte of new TextEncoder().encode(tagged)) {
    crc ^= byte << 8;
    for (let i = 0; i < 8; i++) {
      crc = crc & 0x8000 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff;
    }
  }
  return crc % 16384;
}

/** `CLUSTER INFO` of the node on `port`, through redis-cli. */
export function clusterInfo(port: number): Promise<string> {
  return redisCli(port, "cluster", "info");
}

async function redisCli(port: number, ...args: string[]): Promise<string> {
  const out = await new Deno.Command("redis-cli", {
    args: ["-p", String(port), ...args],
    stdout: "piped",
    stderr: "null",
  }).output();
  return new TextDecoder().decode(out.stdout);
}

if (import.meta.main) {
  const flags = cli("edgelock redis cluster", "deno run -A dev/redis_cluster.ts [flags]", {
    primaries: { type: "number", default: 3, min: 3, max: 10, help: "primary nodes" },
    replicas: { type: "number", default: 1, min: 0, max: 2, help: "replicas per primary" },
  });
  const cluster = await startRedisCluster(flags);
  console.log(`REDIS_CLUSTER_URLS=${cluster.urls.join(",")}`);
  const stop = async () => {
    await cluster.stop();
    Deno.exit(0);
  };
  Deno.addSignalListener("SIGINT", stop);
  Deno.addSignalListener("SIGTERM", stop);
}
