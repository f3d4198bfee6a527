/**
 * `deno task dev`: the edgelock service on http://127.0.0.1:8787. Without UPSTASH_REDIS_REST_URL
 * it runs the local REST bridge (an Upstash-compatible endpoint, printed with its token, that a
 * `wrangler dev` Worker can use too) in front of the redis-server at REDIS_URL, or of one it
 * starts itself. The configuration is checked as the deployed entries check it. Ctrl-C stops
 * everything it started.
 *
 * @module
 */
import { Redis } from "@upstash/redis";
import { createApp } from "../src/service/mod.ts";
import { appSettings, readConfig } from "../src/service/config.ts";
import { cli } from "../bridge/_cli.ts";
import { type Bridge, startBridge } from "../bridge/mod.ts";
import { DURABLE_ARGS, type RedisServer, startRedisServer } from "./redis_server.ts";
import { runScript } from "../src/core/_runner.ts";
import { PING } from "../src/core/lua/ping.ts";
import { EdgelockError } from "../src/core/errors.ts";

const env = Deno.env.toObject();
const portOf = (name: string, fallback: number) => {
  const value = env[name] ?? String(fallback);
  if (!/^\d{1,5}$/.test(value) || Number(value) > 65535) {
    console.error(`edgelock dev: ${name} must be a port number from 0 to 65535`);
    Deno.exit(2);
  }
  return Number(value);
};
const flags = cli(
  "edgelock dev",
  `deno task dev [flags]

Runs edgelock on this machine: a private redis-server in a temp dir (or the one at REDIS_URL), the
Upstash REST bridge in front of it, and the service with a dev API key and a dev operator key, all
on 127.0.0.1. It prints the service's URL, the keys, the dashboard's URL, and the bridge's
UPSTASH_REDIS_REST_URL and _TOKEN for your own @upstash/redis clients or a wrangler dev Worker.
Ctrl-C stops them all; nothing is kept.

Environment: PORT, BRIDGE_PORT, BRIDGE_TOKEN (the bridge's token, random by default), REDIS_URL
(a Redis of yours instead of a private one), UPSTASH_REDIS_REST_URL and _TOKEN (a REST endpoint
instead of the bridge), LOCK_API_KEYS and the other LOCK_* settings (docs/deployment.md).`,
  {
    port: {
      type: "number",
      default: portOf("PORT", 8787),
      min: 0,
      max: 65535,
      help: "the service's port, 0 for a free one",
    },
    "bridge-port": {
      type: "number",
      default: portOf("BRIDGE_PORT", 8079),
      min: 0,
      max: 65535,
      help: "the REST bridge's port, 0 for a free one",
    },
  },
);
const DEV_KEY = "dev:dev-secret-0123456789abcdef";
const DEV_OPERATOR_KEY = "ops:dev-operator-0123456789abcdef";
let server: RedisServer | undefined;
let bridge: Bridge | undefined;

async function stopAll() {
  await bridge?.close().catch(() => {});
  await server?.stop().catch(() => {});
}

async function fail(message: string): Promise<never> {
  console.error(`edgelock dev: ${message}`);
  await stopAll();
  Deno.exit(1);
}

function inUse(what: string, port: number, setting: string): string {
  return `port ${port} (${what}) is in use, perhaps by another \`deno task dev\`: stop it, or ` +
    `choose another port with ${setting} (0 picks a free one)`;
}

// Listening on a port that is taken would fail after the bridge and Redis started: check first.
async function checkFree(port: number, what: string, setting: string): Promise<void> {
  if (port === 0) return;
  try {
    Deno.listen({ hostname: "127.0.0.1", port }).close();
  } catch (error) {
    if (error instanceof Deno.errors.AddrInUse) await fail(inUse(what, port, setting));
    throw error;
  }
}

try {
  await checkFree(flags.port, "the service", "--port or PORT");
  const settings: Record<string, string> = {
    ...env,
    LOCK_API_KEYS: env.LOCK_API_KEYS ?? DEV_KEY,
    OPERATOR_API_KEYS: env.OPERATOR_API_KEYS ?? (env.LOCK_API_KEYS ? "" : DEV_OPERATOR_KEY),
  };
  if (!env.UPSTASH_REDIS_REST_URL) {
    await checkFree(flags["bridge-port"], "the REST bridge", "--bridge-port or BRIDGE_PORT");
    let redisUrl = env.REDIS_URL;
    if (!redisUrl) {
      server = await startRedisServer({ args: DURABLE_ARGS }); // restarts forget no lease
      redisUrl = server.url;
      console.log(`Started redis-server on ${redisUrl} (data in ${server.dir})`);
    }
    const token = env.BRIDGE_TOKEN ?? crypto.randomUUID();
    bridge = await startBridge({ redisUrl, token, port: flags["bridge-port"] });
    settings.UPSTASH_REDIS_REST_URL = bridge.url;
    settings.UPSTASH_REDIS_REST_TOKEN = token;
    console.log(`Upstash REST bridge in front of ${redisUrl}; point any Upstash client at it:`);
    console.log(`  UPSTASH_REDIS_REST_URL=${bridge.url}`);
    console.log(`  UPSTASH_REDIS_REST_TOKEN=${token}`);
  }
  let config;
  try {
    config = readConfig(settings);
  } catch (error) {
    await fail((error as Error).message);
  }
  const own = [`http://127.0.0.1:${flags.port}`, `http://localhost:${flags.port}`];
  if (own.includes(new URL(config!.redisUrl).origin)) {
    await fail(
      "UPSTASH_REDIS_REST_URL names this service's own port: it must be Redis's REST URL " +
        "(unset it, and dev runs a bridge of its own)",
    );
  }
  const redis = new Redis({ url: config!.redisUrl, token: config!.redisToken, retry: false });
  // The REST endpoint checked before the service says it is ready, as /healthz checks it: a wrong
  // URL or token stops here with its cause, where every request would answer 500 config_error.
  try {
    await runScript(redis, PING, [], [], { timeoutMs: 5000, keyLocking: false });
  } catch (error) {
    if (!(error instanceof EdgelockError) || error.code === "config_error") {
      await fail((error as Error).message);
    }
    console.warn(
      `edgelock dev: ${(error as Error).message}; serving anyway (503 until it answers)`,
    );
  }
  const app = createApp({ redis, ...appSettings(config!) });
  const http = Deno.serve(
    { port: flags.port, hostname: "127.0.0.1", onListen() {} },
    app.fetch,
  );
  const base = `http://127.0.0.1:${http.addr.port}`;
  console.log(`edgelock on ${base}`);
  if (!env.LOCK_API_KEYS) {
    const key = DEV_KEY.slice(4);
    console.log(`Dev API key (tenant "dev"): ${key}`);
    console.log(`Dev operator key (may break locks): ${DEV_OPERATOR_KEY.slice(4)}`);
    console.log(`Dashboard: ${base}/dashboard`);
    console.log(
      `Try: curl -s -X POST ${base}/v1/locks/demo/acquire ` +
        `-H 'authorization: Bearer ${key}' -H 'content-type: application/json' -d '{}'`,
    );
  }
  const stop = async () => {
    await http.shutdown();
    await stopAll();
    Deno.exit(0);
  };
  Deno.addSignalListener("SIGINT", stop);
  Deno.addSignalListener("SIGTERM", stop);
} catch (error) {
  if (error instanceof Deno.errors.AddrInUse) {
    await fail(`${(error as Error).message}: a port is in use; see --help to choose others`);
  }
  await fail((error as Error).message);
}
