/**
 * The bridge soak of `deno task torture --bridge`: ordinary commands, pipelines, transactions and
 * locks through the bridge, beside more blocking commands than it lets block at once (BLPOP and
 * XREAD BLOCK that wait, BLPOP 0 that runs into the command timeout), subscriptions opened and
 * dropped, and connection-state commands that must be refused. It checks:
 *
 * - no stall: no ordinary request takes longer than `stallMs`, and every second some complete;
 * - nothing lost or doubled: every pushed job is popped exactly once (or still queued at the end),
 *   every INCR counted, every locked read-modify-write kept;
 * - what must be refused is refused, and the only failures are the expected ones.
 *
 * `broken: "blocking"` runs the blocking commands on the shared pool, as the bridge once did: the
 * soak must then report stalls.
 *
 * @module
 */
import { Redis } from "@upstash/redis";
import { Redis as IORedis } from "ioredis";
import { Locks } from "../src/core/locks.ts";
import { startBridge } from "../bridge/mod.ts";
import { startRedisServer } from "./redis_server.ts";

/** Options of the bridge soak. */
export interface BridgeSoakOptions {
  seconds?: number;
  /** Workers sending ordinary commands. @default 16 */
  workers?: number;
  /** The bridge's bound on blocking commands; twice as many workers block. @default 8 */
  maxBlocking?: number;
  /** An ordinary request slower than this is a stall, ms. @default 2000 */
  stallMs?: number;
  broken?: "blocking";
  log?: (line: string) => void;
}

/** What the soak did and found. */
export interface BridgeSoakReport {
  seconds: number;
  operations: Record<string, number>;
  /** Ordinary requests' latency, ms. */
  latency: { p50: number; p99: number; max: number };
  /** The fewest ordinary requests completed in any one second. */
  slowestSecond: number;
  violations: string[];
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Runs the soak; resolves with its report once everything it started has stopped. */
export async function runBridgeSoak(options: BridgeSoakOptions = {}): Promise<BridgeSoakReport> {
  const { seconds = 60, workers = 16, maxBlocking = 8, stallMs = 2000 } = options;
  const log = options.log ?? (() => {});
  const server = await startRedisServer();
  const token = crypto.randomUUID();
  const bridge = await startBridge({
    redisUrl: server.url,
    token,
    port: 0,
    maxBlocking,
    commandTimeoutMs: 3000,
    heartbeatMs: 1000,
    ...(options.broken === "blocking" && { isolateBlocking: false }),
  });
  const redis = new Redis({ url: bridge.url, token, enableTelemetry: false, retry: false });
  const locks = new Locks(redis, { prefix: "soak" });
  const send = async (command: unknown[]) => {
    const res = await fetch(bridge.url, {
      method: "POST",
      headers: { authorization: `Bearer ${token}` },
      body: JSON.stringify(command),
    });
    return { status: res.status, ...await res.json() as { result?: unknown; error?: string } };
  };
  const operations: Record<string, number> = {};
  const count = (kind: string) => operations[kind] = (operations[kind] ?? 0) + 1;
  const violations: string[] = [];
  const violate = (text: string) => {
    const short = text.length > 200 ? `${text.slice(0, 200)}…` : text;
    if (violations.length < 100) violations.push(short);
    log(`violation: ${short}`);
  };
  const latencies: number[] = [];
  const perSecond = new Map<number, number>();
  const started = performance.now();
  const until = started + seconds * 1000;
  const running = () => performance.now() < until;
  // An ordinary request, timed: a stall is a violation.
  const ordinary = async <T>(kind: string, fn: () => Promise<T>): Promise<T> => {
    const at = performance.now();
    const result = await fn();
    const ms = performance.now() - at;
    latencies.push(ms);
    const second = Math.floor((performance.now() - started) / 1000);
    perSecond.set(second, (perSecond.get(second) ?? 0) + 1);
    if (ms > stallMs) violate(`${kind} took ${Math.round(ms)} ms (a stall)`);
    count(kind);
    return result;
  };

  const pushed = new Set<string>();
  const popped = new Set<string>();
  let lockedRuns = 0;
  const increments: number[] = [];
  const queue = "soak:jobs";
  const stream = "soak:events";

  const ordinaryWorker = async (id: number) => {
    const counter = `soak:count:${id}`;
    let incremented = 0;
    for (let i = 0; running(); i++) {
      try {
        switch (i % 5) {
          case 0:
            await ordinary("incr", () => redis.incr(counter));
            incremented++;
            break;
          case 1: {
            const value = `${id}:${i}`;
            await ordinary("set", () => redis.set(`soak:key:${id}`, value));
            const got = await ordinary("get", () => redis.get(`soak:key:${id}`));
            if (got !== value) violate(`GET gave ${got}, not ${value}`);
            break;
          }
          case 2: {
            const p = redis.pipeline();
            for (let j = 0; j < 10; j++) p.incr(counter);
            await ordinary("pipeline", () => p.exec());
            incremented += 10;
            break;
          }
          case 3: {
            const m = redis.multi();
            m.incr(counter).incr(counter);
            await ordinary("multi", () => m.exec());
            incremented += 2;
            break;
          }
          case 4: {
            // A read-modify-write that only the lock makes safe. No waiting for the lock: a wait
            // in its queue is not a request stalled.
            const lease = await ordinary(
              "acquire",
              () => locks.acquire("soak:lock", { ttlMs: 10_000 }),
            );
            if (!lease.acquired) break;
            const n = Number(await ordinary("get", () => redis.get("soak:locked")) ?? 0);
            await ordinary("set", () => redis.set("soak:locked", n + 1));
            lockedRuns++;
            await ordinary("release", () => locks.release(lease.lease));
          }
        }
      } catch (error) {
        violate(`an ordinary request failed: ${(error as Error).message}`);
      }
    }
    increments[id] = incremented;
  };

  const blockingWorker = async (id: number) => {
    for (let i = 0; running(); i++) {
      const command = i % 7 === 6
        ? ["BLPOP", "soak:never", 0] // runs into the command timeout
        : i % 2
        ? ["XREAD", "BLOCK", 500, "STREAMS", stream, "$"]
        : ["BLPOP", queue, 1];
      const reply = await send(command);
      if (reply.status === 400 && /too many blocking commands/.test(reply.error ?? "")) {
        count("blocking_refused");
        await sleep(50);
      } else if (reply.status === 504) {
        count("blocking_timed_out");
        if (command[1] !== "soak:never") violate(`${command[0]} ran past the timeout`);
      } else if (reply.status !== 200) {
        violate(`${command[0]} from ${id}: ${reply.status} ${reply.error}`);
      } else if (command[0] === "BLPOP") {
        count("blpop");
        const item = (reply.result as [string, string] | null)?.[1];
        if (item !== undefined) {
          if (popped.has(item)) violate(`job ${item} popped twice`);
          popped.add(item);
        }
      } else count("xread");
    }
  };

  const producer = async (id: number) => {
    for (let i = 0; running(); i++) {
      const job = `${id}:${i}`;
      pushed.add(job);
      await ordinary("rpush", () => redis.rpush(queue, job));
      await ordinary("xadd", () => redis.xadd(stream, "*", { job }));
      await sleep(20);
    }
  };

  // Raw event streams, cancelled by the reader: the @upstash/redis client's unsubscribe() under
  // Deno sometimes leaves its stream open and read (the bridge cannot tell it from a live one).
  const subscriber = async (id: number) => {
    while (running()) {
      const channel = `soak:chan:${id}`;
      const res = await fetch(`${bridge.url}/subscribe/${channel}`, {
        method: "POST",
        headers: { authorization: `Bearer ${token}`, accept: "text/event-stream" },
        body: "[]",
      });
      if (res.status !== 200) {
        violate(`subscribe: ${res.status} ${await res.text()}`);
        continue;
      }
      const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
      let text = "";
      while (!text.includes("data: subscribe,")) text += (await reader.read()).value ?? "";
      for (let i = 0; i < 10; i++) await ordinary("publish", () => redis.publish(channel, i));
      const deadline = performance.now() + 2000;
      while ((text.match(/data: message,/g) ?? []).length < 10 && performance.now() < deadline) {
        text += (await reader.read()).value ?? "";
      }
      await reader.cancel();
      const received = (text.match(/data: message,/g) ?? []).length;
      if (received !== 10) violate(`a subscription on ${channel} received ${received} of 10`);
      count("subscription");
    }
  };

  const poisoner = async () => {
    while (running()) {
      for (const command of [["CLIENT", "REPLY", "OFF"], ["MONITOR"], ["SUBSCRIBE", "x"]]) {
        const reply = await send(command);
        if (reply.status !== 400 || !/not supported/.test(reply.error ?? "")) {
          violate(`${command.join(" ")} was not refused: ${reply.status}`);
        }
        count("state_refused");
      }
      await sleep(200);
    }
  };

  // A worker that fails outright is a violation too; the others go on.
  const guarded = (what: string, run: () => Promise<void>) =>
    run().catch((error) => violate(`${what} failed: ${(error as Error).message}`));
  try {
    await Promise.all([
      ...Array.from({ length: workers }, (_, i) => guarded("a worker", () => ordinaryWorker(i))),
      ...Array.from(
        { length: maxBlocking * 2 },
        (_, i) => guarded("a blocking worker", () => blockingWorker(i)),
      ),
      guarded("a producer", () => producer(0)),
      guarded("a producer", () => producer(1)),
      guarded("a subscriber", () => subscriber(0)),
      guarded("a subscriber", () => subscriber(1)),
      guarded("the poisoner", poisoner),
    ]);
    // The outcome, read straight from Redis: every job pushed was popped once, or is still
    // queued; every increment counted; every locked read-modify-write kept.
    const direct = new IORedis(server.url);
    const left = await direct.lrange(queue, 0, -1);
    for (const [id, incremented] of increments.entries()) {
      const total = Number(await direct.get(`soak:count:${id}`) ?? 0);
      if (total !== incremented) violate(`counter ${id} is ${total}, not ${incremented}`);
    }
    const locked = Number(await direct.get("soak:locked") ?? 0);
    direct.disconnect();
    // Every stream the subscribers cancelled is closed on the bridge too.
    await sleep(200);
    const metrics = await (await fetch(`${bridge.url}/metrics`)).text();
    const open = /edgelock_bridge_pool_in_use\{pool="subscription"\} (\d+)/.exec(metrics)?.[1];
    if (open !== "0") violate(`${open} subscription streams left open`);
    for (const job of left) {
      if (popped.has(job)) violate(`job ${job} popped and still queued`);
      popped.add(job);
    }
    for (const job of pushed) if (!popped.has(job)) violate(`job ${job} was lost`);
    if (locked !== lockedRuns) violate(`the locked counter is ${locked}, not ${lockedRuns}`);
  } finally {
    await bridge.close();
    await server.stop();
  }
  latencies.sort((a, b) => a - b);
  const full = Math.floor(seconds) - 1; // the last second is cut short
  const slowestSecond = Math.min(
    ...Array.from({ length: Math.max(full, 1) }, (_, s) => perSecond.get(s) ?? 0),
  );
  if (slowestSecond === 0) violate("a whole second passed without an ordinary request completing");
  return {
    seconds,
    operations,
    latency: {
      p50: latencies[latencies.length >> 1] ?? 0,
      p99: latencies[Math.floor(latencies.length * 0.99)] ?? 0,
      max: latencies.at(-1) ?? 0,
    },
    slowestSecond,
    violations,
  };
}
