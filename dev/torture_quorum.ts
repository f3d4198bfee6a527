/**
 * The quorum profile of `deno task torture --quorum 5`: clients take fenced quorum leases over N
 * redis-servers, each behind its own bridge and fault proxy, while up to 2 databases at a time are
 * down (stopped, then restarted with their data), paused (SIGSTOP) or partitioned (every request
 * dropped), and one is restarted without its data. That one stays partitioned for the longest TTL
 * after its restart (Redlock's delayed restart): a database that forgot its holds must not grant
 * them again while they may still be valid. A majority of the databases run 10 minutes behind, so
 * fences cannot rest on the clocks (the `commit` variant shows it). The history goes to the same
 * checker as the main run.
 *
 * @module
 */
import { Redis } from "@upstash/redis";
import { QuorumLocks } from "../src/quorum/mod.ts";
import type { Lease } from "../src/core/types.ts";
import type { RedisLike } from "../src/core/_runner.ts";
import { Q_COMMIT } from "../src/quorum/scripts.ts";
import { type Bridge, startBridge } from "../bridge/mod.ts";
import { type FaultKind, type FaultProxy, startFaultProxy } from "./fault_proxy.ts";
import { check, FencedResource, type Operation, type Violation } from "./history.ts";
import { DURABLE_ARGS, type RedisServer, startRedisServer } from "./redis_server.ts";
import { startShiftedRedisServer } from "./clock_shift.ts";

/** What the quorum run can break on purpose: a minority "quorum", or fences without the commit. */
export const QUORUM_BROKEN = ["minority", "commit"] as const;

/** Options of the quorum profile. */
export interface QuorumTortureOptions {
  databases?: number;
  clients?: number;
  names?: number;
  seconds?: number;
  broken?: typeof QUORUM_BROKEN[number];
  log?: (line: string) => void;
}

/** What the quorum run did and found. */
export interface QuorumTortureReport {
  seconds: number;
  operations: Record<string, number>;
  faults: Record<string, number>;
  staleWritesRefused: number;
  acceptedWrites: number;
  violations: Violation[];
}

const TTL_MS = 400;
const HOP_FAULTS: Partial<Record<FaultKind, number>> = {
  delay: 0.05,
  dropRequest: 0.02,
  dropResponse: 0.02,
  duplicate: 0.02,
};

// Quorum locks that settle for fewer databases than a majority: the minority variant.
class MinorityLocks extends QuorumLocks {
  override get quorum(): number {
    return 2;
  }
}

// A database whose commit does nothing: fences then rest on the clocks alone.
function withoutCommit(redis: RedisLike): RedisLike {
  const sha = Q_COMMIT.sha1();
  return {
    evalsha: async (s, keys, args) => s === await sha ? 1 : redis.evalsha(s, keys, args),
    eval: (source, keys, args) => redis.eval(source, keys, args),
  };
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, Math.max(0, ms)));

/** Runs the quorum profile; resolves with its report. */
export async function runQuorumTorture(
  { databases = 5, clients = 32, names = 4, seconds = 60, broken, log = () => {} }:
    QuorumTortureOptions = {},
): Promise<QuorumTortureReport> {
  const token = crypto.randomUUID();
  const servers: RedisServer[] = [];
  const bridges: Bridge[] = [];
  const proxies: FaultProxy[] = [];
  const faults: Record<string, number> = { down: 0, paused: 0, partitioned: 0, dataLost: 0 };
  const history: Operation[] = [];
  const resource = new FencedResource();
  // The last majority of the databases: clocks 10 minutes behind.
  const behind = (i: number) => i >= databases - (Math.floor(databases / 2) + 1);
  const start = async (i: number, options: { port?: number; dir?: string } = {}) => {
    if (!behind(i)) return await startRedisServer({ ...options, args: DURABLE_ARGS });
    const server = await startShiftedRedisServer({ ...options, args: DURABLE_ARGS });
    await server.shift(-600_000);
    return server;
  };
  try {
    for (let i = 0; i < databases; i++) {
      const server = await start(i);
      servers.push(server);
      bridges.push(await startBridge({ redisUrl: server.url, token, port: 0 }));
      proxies.push(
        startFaultProxy({ target: bridges[i]!.url, faults: HOP_FAULTS, holdMs: TTL_MS }),
      );
    }
    const clientsOf = proxies.map((proxy) => {
      const redis = new Redis({ url: proxy.url, token, enableTelemetry: false, retry: false });
      return broken === "commit" ? withoutCommit(redis) : redis;
    });
    const Kind = broken === "minority" ? MinorityLocks : QuorumLocks;
    const locks = new Kind(clientsOf, { timeoutMs: 100 });
    const lockNames = Array.from({ length: names }, (_, i) => `quorum-${i}`);
    const deadline = Date.now() + seconds * 1000;

    // One acquire and one release as the history records them. A lease is valid surely from the
    // reply on (the grant came somewhere before it), on the caller's clock like expiresAt.
    const acquireRecorded = async (
      on: QuorumLocks,
      client: string,
      name: string,
      options: { ttlMs: number; waitMs?: number },
    ) => {
      const leaseToken = crypto.randomUUID().replaceAll("-", "");
      const invokedAt = Date.now();
      const result = await on.acquire(name, { ...options, token: leaseToken })
        .catch(() => undefined);
      const lease = result?.acquired ? result.lease : undefined;
      history.push({
        op: "acquire",
        client,
        name,
        token: leaseToken,
        invokedAt,
        completedAt: Date.now(),
        ...(lease
          ? {
            outcome: "acquired",
            fence: lease.fence,
            serverTime: Date.now(),
            expiresAt: lease.expiresAt,
          }
          : { outcome: result ? "busy" : "failed" }),
      });
      return lease;
    };
    // A renewal for a random length, shorter than what is left as often as not (helper-57: one
    // that left a hold's end where it was let a late clean-up free a hold it had counted).
    const renewRecorded = async (on: QuorumLocks, client: string, lease: Lease) => {
      const invokedAt = Date.now();
      const result = await on.renew(lease, { ttlMs: 100 + Math.floor(Math.random() * TTL_MS) })
        .catch(() => undefined);
      history.push({
        op: "renew",
        client,
        name: lease.name,
        token: lease.token,
        invokedAt,
        completedAt: Date.now(),
        ...(result?.renewed
          ? {
            outcome: "renewed",
            serverTime: result.lease.serverTime,
            expiresAt: result.lease.expiresAt,
          }
          : { outcome: result ? "lost" : "failed" }),
      });
    };
    const releaseRecorded = async (on: QuorumLocks, client: string, lease: Lease) => {
      const invokedAt = Date.now();
      const released = await on.release(lease).catch(() => undefined);
      history.push({
        op: "release",
        client,
        name: lease.name,
        token: lease.token,
        invokedAt,
        completedAt: Date.now(),
        outcome: released === undefined ? "failed" : released ? "released" : "not_held",
      });
    };

    const worker = async (index: number) => {
      const client = `q${index}`;
      while (Date.now() < deadline) {
        const name = lockNames[Math.floor(Math.random() * lockNames.length)]!;
        const lease = await acquireRecorded(locks, client, name, { ttlMs: TTL_MS, waitMs: 300 });
        if (!lease) {
          await sleep(5 + Math.random() * 20);
          continue;
        }
        if (Math.random() < 0.5) await renewRecorded(locks, client, lease);
        const value = resource.read(name, lease.fence);
        if (value !== undefined) {
          await sleep(Math.random() * 20);
          resource.write(name, lease.fence, value + 1);
        }
        await releaseRecorded(locks, client, lease);
      }
    };

    // Up to 2 databases faulty at a time, each fault for up to a second; one data loss, mid-run.
    const chaos = async () => {
      let lostData = false;
      let round = 0;
      while (Date.now() < deadline - 1500) {
        // Every other round the databases with good clocks are the faulty ones: the majority left
        // runs behind, which is where fences resting on clocks alone would go back.
        const good = [...Array(databases).keys()].filter((i) => !behind(i));
        const picks = (round++ % 2 === 1 ? good : [...Array(databases).keys()])
          .sort(() => Math.random() - 0.5).slice(0, 2);
        const lose = !lostData && Date.now() > deadline - seconds * 500;
        await Promise.all(picks.map(async (i, n) => {
          const server = servers[i]!;
          if (lose && n === 0) {
            lostData = true;
            faults.dataLost!++;
            await server.stop({ remove: true });
            proxies[i]!.setFaults({ dropRequest: 1 }); // kept away for the longest TTL
            servers[i] = await start(i, { port: server.port });
            await sleep(TTL_MS * 2);
            proxies[i]!.setFaults(HOP_FAULTS);
            log(`database ${i} restarted without its data`);
            return;
          }
          const kind = ["down", "paused", "partitioned"][Math.floor(Math.random() * 3)]!;
          faults[kind]!++;
          const ms = 200 + Math.random() * 800;
          if (kind === "down") {
            await server.stop({ remove: false });
            await sleep(ms);
            servers[i] = await startRedisServer({
              port: server.port,
              dir: server.dir,
              args: DURABLE_ARGS,
            });
            const restarted = servers[i]!;
            servers[i] = { ...restarted, stop: (o) => restarted.stop({ remove: true, ...o }) };
          } else if (kind === "paused") {
            await signal(server.port, "STOP");
            await sleep(ms);
            await signal(server.port, "CONT");
          } else {
            proxies[i]!.setFaults({ dropRequest: 1 });
            await sleep(ms);
            proxies[i]!.setFaults(HOP_FAULTS);
          }
        }));
        await sleep(300);
      }
    };

    // Seeded partitions, certain to show either break: clients that each reach only some of the
    // databases (the rest refuse). Two that reach different pairs acquire one name at once (a
    // quorum below a majority grants both); then one reaching the first majority and, after its
    // release, one reaching the last (the clocks behind) acquire another (without the commit, the
    // second fence rests on clocks 10 minutes behind).
    const down: RedisLike = {
      evalsha: () => Promise.reject(new Error("partitioned")),
      eval: () => Promise.reject(new Error("partitioned")),
    };
    const direct = clientsOf.map((_, i) =>
      broken === "commit"
        ? withoutCommit(new Redis({ url: bridges[i]!.url, token, enableTelemetry: false }))
        : new Redis({ url: bridges[i]!.url, token, enableTelemetry: false, retry: false })
    );
    const reaching = (reach: number[]) =>
      new Kind(direct.map((db, i) => reach.includes(i) ? db : down), { timeoutMs: 1000 });
    const seeded = async (client: string, name: string, reach: number[]) => {
      const side = reaching(reach);
      const lease = await acquireRecorded(side, client, name, { ttlMs: 5000 });
      return async () => {
        if (lease) await releaseRecorded(side, client, lease);
      };
    };
    const majority = Math.floor(databases / 2) + 1;
    const all = [...Array(databases).keys()];
    const pairs = await Promise.all([
      seeded("split0", "quorum-split", all.slice(0, 2)),
      seeded("split1", "quorum-split", all.slice(-2)),
    ]);
    await sleep(100); // both held, by their replies, for these 100 ms at least
    for (const release of pairs) await release();
    const ahead = await seeded("ahead", "quorum-clocks", all.slice(0, majority));
    await sleep(100); // so the checker orders the two leases
    await ahead();
    await (await seeded("behind", "quorum-clocks", all.slice(-majority)))();

    const started = Date.now();
    const progress = setInterval(() => log(`${history.length} operations`), 5000);
    await Promise.all([...Array.from({ length: clients }, (_, i) => worker(i)), chaos()]);
    clearInterval(progress);
    const operations: Record<string, number> = {};
    for (const op of history) {
      const label = `${op.op}:${op.outcome}`;
      operations[label] = (operations[label] ?? 0) + 1;
    }
    return {
      seconds: Math.round((Date.now() - started) / 100) / 10,
      operations,
      faults,
      staleWritesRefused: resource.rejected,
      acceptedWrites: [...resource.totals().values()].reduce((sum, t) => sum + t.accepted, 0),
      violations: check(history, { resource }),
    };
  } finally {
    await Promise.all(proxies.map((proxy) => proxy.close()));
    await Promise.all(bridges.map((bridge) => bridge.close()));
    for (const server of servers) await signal(server.port, "CONT").catch(() => {});
    await Promise.all(servers.map((server) => server.stop({ remove: true })));
  }
}

// Pauses or resumes the redis-server on `port` (its process title names the port).
async function signal(port: number, what: "STOP" | "CONT"): Promise<void> {
  await new Deno.Command("pkill", {
    args: [`-${what}`, "-f", `redis-server 127.0.0.1:${port}`],
    stdout: "null",
    stderr: "null",
  }).output();
}
