/**
 * `deno task torture --hostile`: the bridge, run as its own process with its default limits,
 * beside hostile clients (giant pipelines and bodies, huge replies, slowloris connections, idle
 * connections, a script flood through the read-only token, administration commands, malformed
 * paths) and ordinary clients. It reports the bridge's peak resident memory (from /proc), the
 * ordinary clients' latency, what the hostile clients were answered, and violations: the bridge
 * exited, an ordinary request failed, a hostile request got a 2xx it must not or a 5xx, Redis was
 * changed by a refused command.
 *
 * @module
 */
import { Redis } from "@upstash/redis";
import { Redis as IORedis } from "ioredis";
import { freePort, startRedisServer } from "./redis_server.ts";

/** Options of the hostile soak. */
export interface HostileSoakOptions {
  seconds?: number;
  /** Ordinary clients. @default 8 */
  ordinary?: number;
  /**
   * Only these hostile kinds (giantPipeline, hugeReplies, slowloris, scriptFlood, admin), to see
   * what each costs. @default all
   */
  only?: string[];
  log?: (line: string) => void;
}

/** What the hostile soak found. */
export interface HostileSoakReport {
  seconds: number;
  /** The bridge process's peak resident memory, MB. */
  peakRssMb: number;
  /** Ordinary requests' latency, ms, and how many there were. */
  ordinary: { count: number; p50: number; p99: number; max: number };
  /** Hostile requests by kind and status (or "closed" when the bridge cut the connection). */
  hostile: Record<string, number>;
  violations: string[];
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Runs the soak; resolves once everything it started has stopped. */
export async function runHostileSoak(
  options: HostileSoakOptions = {},
): Promise<HostileSoakReport> {
  const { seconds = 20, ordinary = 8 } = options;
  const log = options.log ?? (() => {});
  const server = await startRedisServer();
  const direct = new IORedis(server.url);
  const token = `hostile-${crypto.randomUUID()}`;
  const readonly = `hostile-ro-${crypto.randomUUID()}`;
  const port = freePort();
  const url = `http://127.0.0.1:${port}`;
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", new URL("../bridge/main.ts", import.meta.url).pathname],
    env: {
      UPSTASH_REDIS_REST_TOKEN: token,
      UPSTASH_REDIS_REST_READONLY_TOKEN: readonly,
      REDIS_URL: server.url,
      BRIDGE_PORT: String(port),
      BRIDGE_LOG: "off",
    },
    stdout: "null",
    stderr: "null",
  }).spawn();
  let exited = false;
  const status = child.status.then((s) => (exited = true, s));
  const violations: string[] = [];
  const hostile: Record<string, number> = {};
  const count = (kind: string, outcome: string | number) => {
    const key = `${kind}:${outcome}`;
    hostile[key] = (hostile[key] ?? 0) + 1;
  };
  const latencies: number[] = [];
  let peakRss = 0;
  const started = Date.now();

  try {
    const ready = Date.now() + 20_000;
    for (;;) {
      const up = await fetch(`${url}/healthz`).then((r) => r.body?.cancel().then(() => r.ok))
        .catch(() => false);
      if (up) break;
      if (Date.now() > ready || exited) throw new Error("the bridge did not start");
      await sleep(50);
    }
    const before = await direct.call("CONFIG", "GET", "*");
    const big = "big-value";
    await direct.set(big, "x".repeat(1 << 20));
    const deadline = Date.now() + seconds * 1000;
    const running = () => Date.now() < deadline && !exited;

    const sampler = (async () => {
      while (running()) {
        const text = await Deno.readTextFile(`/proc/${child.pid}/status`).catch(() => "");
        const kb = Number(/VmRSS:\s+(\d+)/.exec(text)?.[1] ?? 0);
        peakRss = Math.max(peakRss, kb / 1024);
        await sleep(100);
      }
    })();

    // Ordinary clients: the real @upstash/redis client, small commands and pipelines.
    const client = new Redis({ url, token, enableTelemetry: false, retry: false });
    const ordinaryWorker = async (id: number) => {
      let i = 0;
      while (running()) {
        const key = `ordinary:${id}`;
        const t = performance.now();
        try {
          if (i++ % 3 === 0) {
            const p = client.pipeline();
            p.incr(key);
            p.get(key);
            await p.exec();
          } else {
            await client.set(key, String(i));
          }
          latencies.push(performance.now() - t);
        } catch (error) {
          if (running()) violations.push(`an ordinary request failed: ${(error as Error).message}`);
        }
        await sleep(5);
      }
    };

    const post = async (path: string, body: BodyInit, as = token) => {
      const res = await fetch(`${url}${path}`, {
        method: "POST",
        headers: { authorization: `Bearer ${as}` },
        body,
      });
      await res.arrayBuffer();
      return res.status;
    };
    const expect = (kind: string, status: number, allowed: (s: number) => boolean) => {
      count(kind, status);
      if (!allowed(status)) violations.push(`${kind} answered ${status}`);
    };
    const is4xx = (s: number) => s >= 400 && s < 500;

    const giantPipeline = async () => {
      const pings = JSON.stringify(Array.from({ length: 120_000 }, () => ["PING"])); // ~1.1 MB
      while (running()) {
        expect("giant_body", await post("/pipeline", pings, readonly), is4xx);
        const many = JSON.stringify(Array.from({ length: 5000 }, () => ["PING"]));
        expect("many_commands", await post("/pipeline", many, readonly), is4xx);
      }
    };
    const hugeReplies = async () => {
      const gets = JSON.stringify(Array.from({ length: 100 }, () => ["GET", big]));
      while (running()) {
        expect("huge_reply", await post("/pipeline", gets, readonly), is4xx);
      }
    };
    const slowloris = async () => {
      const open: Deno.Conn[] = [];
      while (running()) {
        try {
          const conn = await Deno.connect({ hostname: "127.0.0.1", port });
          await conn.write(new TextEncoder().encode("POST / HTTP/1.1\r\nHost: x\r\nX-A: "));
          open.push(conn);
          count("slowloris", "opened");
          if (open.length > 400) open.shift()?.close();
        } catch {
          count("slowloris", "refused");
        }
        await sleep(10);
      }
      for (const conn of open) {
        try {
          conn.close();
        } catch { /* closed by the bridge */ }
      }
    };
    const scriptFlood = async () => {
      let i = 0;
      while (running()) {
        const status = await post("/", JSON.stringify(["EVAL_RO", `return ${i++}`, "0"]), readonly);
        count("script_flood", status);
      }
    };
    const admin = async () => {
      const commands = [
        ["CONFIG", "SET", "maxmemory-policy", "allkeys-random"],
        ["ACL", "SETUSER", "evil", "on", ">x", "+@all"],
        ["SCRIPT", "DEBUG", "SYNC"],
        ["MIGRATE", "127.0.0.1", "1", "k", "0", "100"],
        ["CLIENT", "LIST"],
        ["DEBUG", "SLEEP", "1"],
      ];
      while (running()) {
        for (const command of commands) {
          expect("admin", await post("/", JSON.stringify(command)), is4xx);
        }
        for (const path of ["/subscribe/%ZZ", "/psubscribe/%E0%A4%A", "/get/%ZZ"]) {
          expect("malformed", await post(path, "[]"), is4xx);
        }
        await sleep(50);
      }
    };

    const only = options.only;
    const kinds = { giantPipeline, hugeReplies, slowloris, scriptFlood, admin };
    await Promise.all([
      sampler,
      ...Array.from({ length: ordinary }, (_, i) => ordinaryWorker(i)),
      ...Object.entries(kinds).filter(([k]) => !only || only.includes(k)).map(([, run]) => run()),
      (async () => {
        while (running()) {
          await sleep(5000);
          log(`${Math.round((Date.now() - started) / 1000)} s: peak RSS ${peakRss.toFixed(0)} MB`);
        }
      })(),
    ]);
    if (exited) violations.push("the bridge exited");
    const after = await direct.call("CONFIG", "GET", "*");
    if (JSON.stringify(after) !== JSON.stringify(before)) violations.push("CONFIG changed");
    const scripts = Number(/number_of_cached_scripts:(\d+)/.exec(await direct.info("memory"))?.[1]);
    if (scripts > 1000) violations.push(`${scripts} scripts cached, over the bound of 1000`);
  } finally {
    try {
      child.kill("SIGTERM");
    } catch { /* gone */ }
    await status;
    direct.disconnect();
    await server.stop();
  }
  latencies.sort((a, b) => a - b);
  const at = (q: number) =>
    latencies[Math.min(latencies.length - 1, Math.floor(q * latencies.length))] ?? 0;
  return {
    seconds: Math.round((Date.now() - started) / 100) / 10,
    peakRssMb: Math.round(peakRss),
    ordinary: { count: latencies.length, p50: at(0.5), p99: at(0.99), max: at(1) },
    hostile,
    violations,
  };
}
