/**
 * `deno task torture`: many clients contend for a few names through the library and through the
 * HTTP service, with HTTP faults injected on both hops, Redis paused (SIGSTOP, past the leases and
 * the requests' deadline), restarted and its script cache flushed mid-run, and the HTTP API fuzzed
 * meanwhile. Every operation goes into a history that
 * the checker verifies afterwards; a fenced model resource shows stale holders being refused.
 *
 * Every primitive takes part: exclusive leases and shared ones (readers) on the same names, a
 * semaphore of 3 permits on names of its own, and multi-name leases over a group of names that
 * exclusive clients also take one at a time.
 *
 * Flags (`--help`): --clients 64 --names 8 --seconds 60 --fuzz 10000 --broken <rule> (a script
 * with one check removed, which the checker must catch: release, shared, limit, multi, fence)
 * --json (print the report as JSON).
 *
 * @module
 */
import { Redis } from "@upstash/redis";
import fc from "fast-check";
import { createApp } from "../src/service/mod.ts";
import { createClient } from "../src/client/client.ts";
import { Locks } from "../src/core/locks.ts";
import type { AcquireOptions, Lease, LockClient } from "../src/core/types.ts";
import { cli } from "../bridge/_cli.ts";
import { startBridge } from "../bridge/mod.ts";
import { FAULT_KINDS, type FaultKind, startFaultProxy } from "./fault_proxy.ts";
import {
  BROKEN_RULES,
  type BrokenRule,
  check,
  FencedResource,
  type Operation,
  type Violation,
  withBroken,
} from "./history.ts";
import { DURABLE_ARGS, startRedisServer } from "./redis_server.ts";
import { startRedisCluster } from "./redis_cluster.ts";
import { QUORUM_BROKEN, runQuorumTorture } from "./torture_quorum.ts";
import { runBridgeSoak } from "./torture_bridge.ts";
import { runHostileSoak } from "./torture_hostile.ts";

/** Options for {@linkcode runTorture}. */
export interface TortureOptions {
  clients?: number;
  names?: number;
  seconds?: number;
  fuzzRuns?: number;
  /** Swap in a script with this rule's check removed: the checker must report violations. */
  broken?: BrokenRule;
  /** Fault probabilities per hop. @default a mix of every kind */
  faults?: Partial<Record<FaultKind, number>>;
  /** Pause and restart redis-server and flush its scripts mid-run. @default true */
  redisFaults?: boolean;
  /**
   * Run on a local Redis Cluster (3 primaries, 3 replicas; the cluster key layout): the Redis faults are then
   * script flushes on every node and one primary stopped mid-run, its replica taking over.
   */
  cluster?: boolean;
  log?: (line: string) => void;
}

/** What a run did and found. */
export interface TortureReport {
  seconds: number;
  operations: Record<string, number>;
  faults: Record<FaultKind, number>;
  redisRestarts: number;
  /** Times redis-server was paused (SIGSTOP, then SIGCONT); none on the cluster. */
  redisPauses: number;
  scriptFlushes: number;
  fuzzCases: number;
  fuzz5xx: number;
  /** Fuzz requests answered 503 backend_unavailable while redis-server restarted or paused. */
  fuzzBackendDown: number;
  staleWritesRefused: number;
  acceptedWrites: number;
  violations: Violation[];
  /** Every operation of the tokens the violations name, in order: what to read first. */
  evidence: Operation[];
}

const SECRET = "torture-secret-0123456789abcdef";
const TTL_MS = 400;
// Injected on both hops. holdResponse holds a reply past the lease.
const FAULTS: Partial<Record<FaultKind, number>> = {
  delay: 0.05,
  dropRequest: 0.02,
  dropResponse: 0.03,
  duplicate: 0.03,
  error5xx: 0.02,
  holdResponse: 0.01,
};
// The semaphore's permits, and the group of names multi-name leases take.
const LIMIT = 3;
const GROUP = ["a", "b", "c", "d", "e"].map((n) => `{torture-m}${n}`);

export async function runTorture(options: TortureOptions = {}): Promise<TortureReport> {
  const {
    clients = 64,
    names = 8,
    seconds = 60,
    fuzzRuns = 10_000,
    broken,
    faults: faultMix = FAULTS,
    redisFaults: withRedisFaults = true,
    cluster: onCluster = false,
    log = () => {},
  } = options;
  const cluster = onCluster ? await startRedisCluster() : undefined;
  const server = cluster ? undefined : await startRedisServer({ args: DURABLE_ARGS });
  const token = crypto.randomUUID();
  const bridge = await startBridge({
    redisUrl: server?.url ?? "",
    ...(cluster && { clusterUrls: cluster.urls }),
    token,
    port: 0,
    poolSize: 8,
    extraCommands: ["script|flush"], // a fault the run injects
  });
  const toBridge = startFaultProxy({ target: bridge.url, faults: faultMix, holdMs: TTL_MS * 2 });
  const direct = new Redis({ url: bridge.url, token, enableTelemetry: false, retry: false });
  const faulty = new Redis({ url: toBridge.url, token, enableTelemetry: false, retry: false });
  const redis = broken ? withBroken(faulty, broken) : faulty;

  const apiKeys = [{ tenant: "t", secret: SECRET }];
  // No per-tenant rate cap here: the run measures locks under faults, not the admission limiter.
  const app = createApp({
    redis,
    apiKeys,
    limits: { requestsPerSecond: 0 },
    log: () => {},
    cluster: onCluster,
  });
  const http = Deno.serve({ port: 0, hostname: "127.0.0.1", onListen() {} }, app.fetch);
  const toService = startFaultProxy({
    target: `http://127.0.0.1:${http.addr.port}`,
    faults: faultMix,
    holdMs: TTL_MS * 2,
  });
  // Both paths use tenant "t"'s key space, so library and HTTP clients contend for the same names.
  const library = new Locks(redis, { prefix: "edgelock:t", cluster: onCluster });
  const elsewhere = new Locks(redis, { prefix: "edgelock:t", cluster: onCluster });
  const remote = createClient({ baseUrl: toService.url, apiKey: SECRET, retries: 0 });
  // Reentrant clients over HTTP retry with the typed client's own logic: each call takes effect
  // once however often the faults make it resend.
  const retrying = createClient({ baseUrl: toService.url, apiKey: SECRET, retries: 3 });
  // The fuzzer talks to the service without faults: any 5xx it sees is a real defect.
  const fuzzApp = createApp({
    redis: direct,
    apiKeys,
    limits: { requestsPerSecond: 0 },
    log: () => {},
    cluster: onCluster,
  });

  const history: Operation[] = [];
  const resource = new FencedResource();
  const lockNames = Array.from({ length: names }, (_, i) => `torture-${i}`);
  const semNames = Array.from({ length: Math.max(2, names >> 2) }, (_, i) => `torture-sem-${i}`);
  const deadline = Date.now() + seconds * 1000;
  let redisRestarts = 0;
  let redisPauses = 0;
  let scriptFlushes = 0;
  let fuzzCases = 0;
  let fuzz5xx = 0;
  let fuzzBackendDown = 0;
  const progress = setInterval(() => {
    const left = Math.max(0, Math.round((deadline - Date.now()) / 1000));
    log(`${seconds - left}/${seconds} s: ${history.length} operations, ${fuzzCases} fuzz cases`);
  }, 5000);

  const pick = <T>(list: readonly T[]) => list[Math.floor(Math.random() * list.length)]!;
  // Clients by index: exclusive writers (some pause past their lease, some take a group name),
  // shared readers of the same names, semaphore holders, multi-name writers of the group, and
  // reentrant writers whose inner holds are shorter than their outer ones.
  const ROLES = [
    "exclusive",
    "exclusive",
    "shared",
    "exclusive",
    "semaphore",
    "multi",
    "reentrant",
  ];
  const worker = async (index: number) => {
    const id = `c${index}`;
    const role = ROLES[(index >> 1) % ROLES.length]!; // each role on both paths
    const locks: LockClient = index % 2 === 0 ? library : role === "reentrant" ? retrying : remote;
    const pauses = index % 16 === 0; // the "pause past TTL" clients
    while (Date.now() < deadline) {
      if (role === "reentrant") {
        await reentrant(locks, id, pick(lockNames));
        continue;
      }
      if (role === "multi") {
        const set = GROUP.filter(() => Math.random() < 0.5).slice(0, 3);
        const leases = await acquireAll(locks, id, set.length > 0 ? set : [GROUP[0]!]);
        for (const lease of leases ?? []) {
          const value = resource.read(lease.name, lease.fence);
          if (value !== undefined) resource.write(lease.name, lease.fence, value + 1);
        }
        await sleep(leases ? Math.random() * 10 : 5 + Math.random() * 20);
        for (const lease of leases ?? []) await release(locks, id, lease);
        continue;
      }
      // Half the exclusive writers and semaphore holders wait in the queue (and are handed the
      // lock, or permits, at a release).
      const wait = Math.random() < 0.5 ? { waitMs: Math.floor(Math.random() * 300) } : {};
      const options: AcquireOptions = role === "shared"
        ? { mode: "shared" }
        : role === "semaphore"
        ? { limit: LIMIT, permits: 1 + Math.floor(Math.random() * 2), ...wait }
        : wait;
      const name = role === "semaphore"
        ? pick(semNames)
        : index % 5 === 0 && role === "exclusive"
        ? pick(GROUP)
        : pick(lockNames);
      const lease = await acquire(locks, id, name, options);
      if (!lease) {
        await sleep(5 + Math.random() * 20);
        continue;
      }
      // Writers increment the fenced counter; readers look at it; semaphores guard no counter.
      const value = role === "semaphore"
        ? 0
        : role === "shared"
        ? resource.peek(name, lease.fence)
        : resource.read(name, lease.fence);
      if (value !== undefined) {
        if (Math.random() < 0.3) await renew(locks, id, lease);
        if (pauses && Math.random() < 0.5) await sleep(TTL_MS * 1.5); // past the lease
        else await sleep(Math.random() * 20);
        if (role === "exclusive") resource.write(name, lease.fence, value + 1);
      }
      await release(locks, id, lease);
    }
  };

  // Runs one operation and records it with its times and outcome; a throw is recorded as failed.
  async function timed<T>(
    entry: { op: Operation["op"]; client: string; name: string; token: string; hold?: string },
    call: () => Promise<T>,
    describe: (value: T) => Record<string, unknown>,
  ): Promise<{ ok: true; value: T } | { ok: false }> {
    const invokedAt = Date.now();
    try {
      const value = await call();
      history.push(
        { ...entry, invokedAt, completedAt: Date.now(), ...describe(value) } as Operation,
      );
      return { ok: true, value };
    } catch {
      history.push(
        { ...entry, invokedAt, completedAt: Date.now(), outcome: "failed" } as Operation,
      );
      return { ok: false };
    }
  }

  // A reentrant writer: an outer hold, an inner one with a shorter TTL released (and its release
  // sent again, as a retry), a probe by another token once the inner TTL has passed, then the
  // write under the outer hold. A probe granted while the outer hold stands is an overlap.
  async function reentrant(locks: LockClient, client: string, name: string) {
    const outer = await acquire(locks, client, name, { reentrant: true, ttlMs: TTL_MS * 3 });
    if (!outer) return void await sleep(5 + Math.random() * 20);
    await sleep(20); // writers queue behind the outer hold, and the inner grant names the next
    const inner = await acquire(locks, client, name, {
      reentrant: true,
      token: outer.token,
      ttlMs: 100,
    });
    if (inner) {
      await release(locks, client, inner);
      await release(locks, client, inner);
    }
    await sleep(150);
    const probe = await acquire(locks, `${client}-probe`, name, { ttlMs: 100 });
    if (probe) await release(locks, `${client}-probe`, probe);
    const value = resource.read(name, outer.fence);
    if (value !== undefined) resource.write(name, outer.fence, value + 1);
    await release(locks, client, outer);
  }

  async function acquire(locks: LockClient, client: string, name: string, options: AcquireOptions) {
    const token = options.token ?? crypto.randomUUID().replaceAll("-", "");
    // A reentrant acquire's hold id, the same for every attempt: a retry counts it once.
    const hold = options.reentrant ? crypto.randomUUID().slice(0, 12) : undefined;
    const kind = options.mode === "shared"
      ? { mode: "shared" }
      : options.limit
      ? { mode: "semaphore", limit: options.limit, permits: options.permits }
      : {};
    // Retried with the same token after a failure: safe, it returns the same lease.
    for (let attempt = 0; attempt < 3; attempt++) {
      const result = await timed(
        { op: "acquire", client, name, token, ...(hold && { hold }) },
        () => locks.acquire(name, { ttlMs: TTL_MS, ...options, token, ...(hold && { hold }) }),
        (r) => {
          if (!r.acquired) return { outcome: "busy", ...kind };
          const { fence, serverTime, expiresAt } = r.lease;
          return { outcome: "acquired", fence, serverTime, expiresAt, ...kind };
        },
      );
      if (result.ok) return result.value.acquired ? result.value.lease : undefined;
    }
    return undefined;
  }

  // One entry per name for a multi-name acquire; half of them wait in the queues (and are handed
  // their names at a release). A busy one that did not wait is followed, now and then, by a
  // release of each name with its token: a name it took anyway answers released. (One that waited
  // may be handed every name after it answered busy, when its leave of the queues was lost.)
  async function acquireAll(locks: LockClient, client: string, set: string[]) {
    const token = crypto.randomUUID().replaceAll("-", "");
    const wait = Math.random() < 0.5 ? { waitMs: Math.floor(Math.random() * 300) } : {};
    for (let attempt = 0; attempt < 3; attempt++) {
      const invokedAt = Date.now();
      const record = (name: string, outcome: Record<string, unknown>) =>
        history.push({
          op: "acquire",
          client,
          name,
          token,
          invokedAt,
          completedAt: Date.now(),
          multi: true,
          ...outcome,
        } as Operation);
      try {
        const result = await locks.acquireAll(set, { ttlMs: TTL_MS, token, ...wait });
        for (const [i, name] of set.entries()) {
          const lease = result.acquired ? result.leases[i]! : undefined;
          record(
            name,
            lease
              ? {
                outcome: "acquired",
                fence: lease.fence,
                serverTime: lease.serverTime,
                expiresAt: lease.expiresAt,
              }
              : { outcome: "busy" },
          );
        }
        if (result.acquired) return result.leases;
        if (attempt === 0 && !("waitMs" in wait) && Math.random() < 0.3) {
          for (const name of set) await release(locks, client, { name, token } as Lease);
        }
        return undefined;
      } catch {
        for (const name of set) record(name, { outcome: "failed" });
      }
    }
    return undefined;
  }

  async function renew(locks: LockClient, client: string, { name, token }: Lease) {
    await timed(
      { op: "renew", client, name, token },
      () => locks.renew({ name, token }, { ttlMs: TTL_MS }),
      (r) =>
        r.renewed
          ? { outcome: "renewed", serverTime: r.lease.serverTime, expiresAt: r.lease.expiresAt }
          : { outcome: "lost" },
    );
  }

  async function release(locks: LockClient, client: string, lease: Lease) {
    const { name, token, hold } = lease;
    // Half the releases carry the whole lease (its fence, and its next) and, on the library's
    // path, go through another Locks, as another process's would: they hand over in place too.
    const whole = Math.random() < 0.5;
    const ref = whole ? lease : { name, token, ...(hold && { hold }) };
    const by = whole && locks === library ? elsewhere : locks;
    for (let attempt = 0; attempt < 3; attempt++) {
      // A failed attempt may have taken effect: its entry names the hold it ended, too.
      const result = await timed(
        { op: "release", client, name, token, ...(hold && { hold }) },
        () => by.release(ref),
        (released) => ({ outcome: released ? "released" : "not_held" }),
      );
      if (result.ok) return;
    }
  }

  const redisFaults = async () => {
    const spacing = (seconds * 1000) / 3;
    while (Date.now() < deadline - 500) {
      await sleep(Math.min(spacing / 2, deadline - Date.now()));
      if (Date.now() >= deadline - 500) break;
      if (cluster) await flushEveryNode(cluster.nodes).then(() => scriptFlushes++, () => {});
      else await direct.scriptFlush().then(() => scriptFlushes++, () => {});
      await sleep(Math.min(spacing / 4, Math.max(0, deadline - Date.now() - 500)));
      if (!cluster && Date.now() < deadline - 2000) {
        // Paused past every lease (TTL_MS) and, at times, past the requests' deadline: the
        // commands sent meanwhile run late, on a server clock that moved on, after their callers
        // may have given up on them.
        const pid = await redisPid(server!.url);
        const pauseMs = 300 + Math.floor(Math.random() * 2000);
        Deno.kill(pid, "SIGSTOP");
        try {
          await sleep(pauseMs);
        } finally {
          Deno.kill(pid, "SIGCONT");
        }
        redisPauses++;
        log(`redis-server paused ${pauseMs} ms (${redisPauses})`);
      }
      await sleep(Math.min(spacing / 4, Math.max(0, deadline - Date.now() - 500)));
      if (Date.now() >= deadline - 500) break;
      if (cluster) {
        // One primary, once: its replica takes over (the cluster has no spare for a second).
        if (redisRestarts > 0) continue;
        await cluster.nodes[0]!.stop({ remove: false });
        redisRestarts++;
        log("a cluster primary stopped: its replica takes over");
        continue;
      }
      await server!.stop({ remove: false });
      const restarted = await startRedisServer({
        port: server!.port,
        dir: server!.dir,
        args: DURABLE_ARGS,
      });
      // The restarted server runs in the first one's temp dir: its stop removes the dir too.
      server!.stop = (options) => restarted.stop({ remove: true, ...options });
      redisRestarts++;
      log(`redis-server restarted (${redisRestarts})`);
    }
  };

  const fuzz = async () => {
    const request = fc.record({
      method: fc.constantFrom("GET", "POST"),
      path: fc.tuple(
        fc.constantFrom(...lockNames, "x y", "..", "a".repeat(201), "{t}", "%E2%98%83"),
        fc.constantFrom("", "/acquire", "/renew", "/release"),
      ).map(([name, action]) => `/v1/locks/${name}${action}`).chain((path) =>
        fc.constantFrom(path, "/v1/locks/acquire")
      ),
      body: fc.oneof(
        fc.record({
          ttlMs: fc.integer({ min: -10, max: 400_000 }),
          token: fc.oneof(fc.string(), fc.constant("fuzz-token-0000000001")),
          mode: fc.constantFrom("shared", "exclusive", "read", 1),
          limit: fc.integer({ min: -1, max: 1002 }),
          permits: fc.integer({ min: -1, max: 5 }),
          reentrant: fc.oneof(fc.boolean(), fc.constant("yes")),
          names: fc.array(fc.constantFrom(...GROUP, ...lockNames, "{x"), { maxLength: 40 }),
        }, { requiredKeys: [] }).map((b) => JSON.stringify(b)),
        fc.string({ maxLength: 40 }),
      ),
    });
    await fc.assert(
      fc.asyncProperty(request, async ({ method, path, body }) => {
        fuzzCases++;
        const res = await fuzzApp.request(path, {
          method,
          headers: { authorization: `Bearer ${SECRET}`, "content-type": "application/json" },
          body: method === "GET" ? undefined : body,
        });
        const text = await res.text();
        // 503 backend_unavailable is the right answer while redis-server restarts or is paused.
        if (res.status === 503 && text.includes('"backend_unavailable"')) fuzzBackendDown++;
        else if (res.status >= 500) fuzz5xx++;
        if (res.status >= 400 && res.headers.get("content-type") !== "application/problem+json") {
          throw new Error(`${method} ${path} → ${res.status} without problem+json`);
        }
      }),
      { numRuns: fuzzRuns, endOnFailure: true },
    );
  };

  const started = Date.now();
  try {
    await Promise.all([
      ...Array.from({ length: clients }, (_, i) => worker(i)),
      withRedisFaults ? redisFaults() : Promise.resolve(),
      fuzz(),
    ]);
  } finally {
    await toService.close();
    await http.shutdown();
    await toBridge.close();
    await bridge.close();
    await server?.stop();
    await cluster?.stop();
  }

  clearInterval(progress);
  const operations: Record<string, number> = {};
  for (const op of history) {
    const kind = op.op === "acquire" ? (op.multi ? "multi" : op.mode ?? "exclusive") + ":" : "";
    const label = `${op.op}:${kind}${op.outcome}`;
    operations[label] = (operations[label] ?? 0) + 1;
  }
  const faults = Object.fromEntries(FAULT_KINDS.map((k) => [k, 0])) as Record<FaultKind, number>;
  for (const proxy of [toBridge, toService]) {
    for (const kind of FAULT_KINDS) faults[kind] += proxy.counts()[kind];
  }
  const violations = check(history, { resource });
  if (fuzz5xx > 0) {
    violations.push({
      rule: "server_error",
      name: "-",
      detail: `${fuzz5xx} fuzz requests got a 5xx`,
    });
  }
  return {
    seconds: Math.round((Date.now() - started) / 100) / 10,
    operations,
    faults,
    redisRestarts,
    redisPauses,
    scriptFlushes,
    fuzzCases,
    fuzz5xx,
    fuzzBackendDown,
    staleWritesRefused: resource.rejected,
    acceptedWrites: [...resource.totals().values()].reduce((sum, t) => sum + t.accepted, 0),
    violations,
    evidence: evidenceFor(violations, history),
  };
}

// The redis-server's process id, to pause it.
async function redisPid(url: string): Promise<number> {
  const { Redis: IORedis } = await import("ioredis");
  const client = new IORedis(url, { retryStrategy: () => null, maxRetriesPerRequest: 0 });
  try {
    return Number(/process_id:(\d+)/.exec(await client.info("server"))![1]);
  } finally {
    client.disconnect();
  }
}

// The operations of every token a violation names (tokens are 32 hex digits here).
function evidenceFor(violations: Violation[], history: Operation[]): Operation[] {
  const named = new Set(violations.flatMap((v) => v.detail.match(/\b[0-9a-f]{32}\b/g) ?? []));
  return history.filter((op) => named.has(op.token));
}

function flushEveryNode(nodes: { port: number }[]): Promise<unknown> {
  return Promise.all(nodes.map((node) =>
    new Deno.Command("redis-cli", {
      args: ["-p", String(node.port), "script", "flush"],
      stdout: "null",
      stderr: "null",
    }).output()
  ));
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, Math.max(0, ms)));
}

if (import.meta.main) {
  const flags = cli("edgelock torture", "deno task torture [flags]", {
    clients: { type: "number", default: 64, min: 1, max: 1024, help: "concurrent clients" },
    names: { type: "number", default: 8, min: 1, max: 1000, help: "lock names they share" },
    seconds: { type: "number", default: 60, min: 1, max: 3600, help: "how long to run" },
    fuzz: { type: "number", default: 10_000, min: 0, max: 1_000_000, help: "HTTP fuzz cases" },
    broken: {
      type: "string",
      default: "",
      help: `break one rule on purpose, which the checker must catch: ${BROKEN_RULES.join(", ")}`,
    },
    "no-faults": { type: "boolean", help: "no HTTP faults and no Redis restarts" },
    "no-redis-faults": { type: "boolean", help: "no Redis restarts or script flushes" },
    cluster: { type: "boolean", help: "on a local Redis Cluster; a primary stops mid-run" },
    quorum: {
      type: "number",
      default: 0,
      min: 0,
      max: 9,
      help: "quorum locks over this many redis-servers (3–9), with databases down, paused, " +
        "partitioned and one losing its data; --broken minority or commit",
    },
    bridge: {
      type: "boolean",
      help: "soak the REST bridge: blocking, pub/sub and ordinary commands mixed, no stall " +
        "allowed; --broken blocking",
    },
    hostile: {
      type: "boolean",
      help: "the bridge as its own process beside hostile clients (giant pipelines, huge " +
        "replies, slowloris, a script flood, admin commands): its peak memory, ordinary latency",
    },
    json: { type: "boolean", help: "print the report as JSON" },
  });
  if (flags.quorum > 0) await quorumMain(flags);
  if (flags.bridge) await bridgeMain(flags);
  if (flags.hostile) await hostileMain(flags);
  const broken = flags.broken === "" ? undefined : flags.broken as BrokenRule;
  if (broken !== undefined && !(BROKEN_RULES as readonly string[]).includes(broken)) {
    console.error(`--broken must be one of ${BROKEN_RULES.join(", ")}`);
    Deno.exit(2);
  }
  const report = await runTorture({
    clients: flags.clients,
    names: flags.names,
    seconds: flags.seconds,
    fuzzRuns: flags.fuzz,
    broken,
    ...(flags["no-faults"] && { faults: {}, redisFaults: false }),
    ...(flags["no-redis-faults"] && { redisFaults: false }),
    cluster: flags.cluster,
    log: (line) => console.error(line),
  });
  if (flags.json) console.log(JSON.stringify(report, null, 2));
  else {
    console.log(`torture: ${report.seconds} s${broken ? ` (broken ${broken} variant)` : ""}`);
    console.log(`operations: ${JSON.stringify(report.operations)}`);
    console.log(`faults injected: ${JSON.stringify(report.faults)}`);
    console.log(
      `redis restarts: ${report.redisRestarts}, pauses: ${report.redisPauses}, script flushes: ${report.scriptFlushes}`,
    );
    console.log(
      `fuzz cases: ${report.fuzzCases} (5xx: ${report.fuzz5xx}; 503 while Redis restarted or paused: ${report.fuzzBackendDown})`,
    );
    console.log(
      `fenced resource: ${report.acceptedWrites} writes accepted, ${report.staleWritesRefused} stale accesses refused`,
    );
    console.log(`violations: ${report.violations.length}`);
    for (const v of report.violations.slice(0, 20)) {
      console.log(`  ${v.rule} ${v.name}: ${v.detail}`);
    }
  }
  exitWithVerdict(report.violations.length > 0, broken);
}

async function hostileMain(flags: { seconds: number; json: boolean }): Promise<never> {
  const report = await runHostileSoak({
    seconds: flags.seconds,
    log: (line) => console.error(line),
  });
  if (flags.json) console.log(JSON.stringify(report, null, 2));
  else {
    const { count, p50, p99, max } = report.ordinary;
    console.log(`hostile soak: ${report.seconds} s; the bridge's peak RSS ${report.peakRssMb} MB`);
    console.log(
      `ordinary requests: ${count}, p50 ${p50.toFixed(1)} ms, p99 ${p99.toFixed(1)} ms, ` +
        `max ${max.toFixed(0)} ms`,
    );
    console.log(`hostile requests: ${JSON.stringify(report.hostile)}`);
    console.log(`violations: ${report.violations.length}`);
    for (const v of report.violations.slice(0, 20)) console.log(`  ${v}`);
  }
  Deno.exit(report.violations.length > 0 ? 1 : 0);
}

async function bridgeMain(flags: { seconds: number; broken: string }): Promise<never> {
  if (flags.broken !== "" && flags.broken !== "blocking") {
    console.error("--broken with --bridge: blocking");
    Deno.exit(2);
  }
  const broken = flags.broken === "blocking" ? "blocking" as const : undefined;
  const report = await runBridgeSoak({
    seconds: flags.seconds,
    ...(broken && { broken }),
    log: (line) => console.error(line),
  });
  const { p50, p99, max } = report.latency;
  console.log(`bridge soak: ${report.seconds} s${broken ? " (broken blocking)" : ""}`);
  console.log(`operations: ${JSON.stringify(report.operations)}`);
  console.log(
    `ordinary requests: p50 ${p50.toFixed(1)} ms, p99 ${p99.toFixed(1)} ms, max ${
      max.toFixed(0)
    } ms; the slowest second completed ${report.slowestSecond}`,
  );
  console.log(`violations: ${report.violations.length}`);
  for (const v of report.violations.slice(0, 20)) console.log(`  ${v}`);
  const caught = report.violations.length > 0;
  if (broken) {
    console.log(caught ? "the soak caught the stall" : "the soak MISSED the stall");
    Deno.exit(caught ? 0 : 1);
  }
  Deno.exit(caught ? 1 : 0);
}

async function quorumMain(
  flags: { quorum: number; clients: number; names: number; seconds: number; broken: string },
): Promise<never> {
  const broken = flags.broken === "" ? undefined : flags.broken as typeof QUORUM_BROKEN[number];
  if (flags.quorum < 3 || (broken !== undefined && !QUORUM_BROKEN.includes(broken))) {
    console.error(`--quorum takes 3 to 9 databases; --broken with it: ${QUORUM_BROKEN.join(", ")}`);
    Deno.exit(2);
  }
  const report = await runQuorumTorture({
    databases: flags.quorum,
    // Quorum locks under heavy contention split their votes (each caller wins a few databases)
    // and mostly retry: the profile keeps 8 callers on 2 names, contended yet making progress.
    clients: Math.min(flags.clients, 8),
    names: Math.min(flags.names, 2),
    seconds: flags.seconds,
    ...(broken && { broken }),
    log: (line) => console.error(line),
  });
  console.log(
    `quorum torture: ${report.seconds} s over ${flags.quorum} databases${
      broken ? ` (broken ${broken})` : ""
    }`,
  );
  console.log(`operations: ${JSON.stringify(report.operations)}`);
  console.log(`database faults: ${JSON.stringify(report.faults)}`);
  console.log(
    `fenced resource: ${report.acceptedWrites} writes accepted, ${report.staleWritesRefused} stale accesses refused`,
  );
  console.log(`violations: ${report.violations.length}`);
  for (const v of report.violations.slice(0, 20)) console.log(`  ${v.rule} ${v.name}: ${v.detail}`);
  exitWithVerdict(report.violations.length > 0, broken);
}

// A run with violations fails, unless a rule was broken on purpose: then it fails if none were
// caught.
function exitWithVerdict(caught: boolean, broken: string | undefined): never {
  if (broken) {
    console.log(
      caught
        ? `the checker caught the broken ${broken}`
        : `the checker MISSED the broken ${broken}`,
    );
    Deno.exit(caught ? 0 : 1);
  }
  Deno.exit(caught ? 1 : 0);
}
