/**
 * `deno task dev`: the edgelock service on http://127.0.0.1:8787 (PORT). Without
 * UPSTASH_REDIS_REST_URL it runs the local REST bridge in front of the redis-server at REDIS_URL,
 * or of one it starts itself. Ctrl-C stops everything it started.
 *
 * @module
 */
import { Redis } from "@upstash/redis";
import { createApp } from "../src/service/app.ts";
import { parseApiKeys } from "../src/service/auth.ts";
import { type Bridge, startBridge } from "./bridge.ts";
import { DURABLE_ARGS, type RedisServer, startRedisServer } from "./redis_server.ts";

const env = Deno.env.toObject();
const port = Number(env.PORT ?? 8787);
const apiKeysText = env.LOCK_API_KEYS ?? "dev:dev-secret-0123456789abcdef";
let server: RedisServer | undefined;
let bridge: Bridge | undefined;

async function stopAll() {
  await bridge?.close().catch(() => {});
  await server?.stop().catch(() => {});
}

try {
  let url = env.UPSTASH_REDIS_REST_URL;
  let token = env.UPSTASH_REDIS_REST_TOKEN;
  if (!url) {
    let redisUrl = env.REDIS_URL;
    if (!redisUrl) {
      server = await startRedisServer({ args: DURABLE_ARGS }); // restarts forget no lease
      redisUrl = server.url;
      console.log(`Started redis-server on ${redisUrl} (data in ${server.dir})`);
    }
    token = crypto.randomUUID();
    bridge = await startBridge({ redisUrl, token, port: 0 });
    url = bridge.url;
    console.log(`Upstash REST bridge on ${url} in front of ${redisUrl}`);
  }
  const redis = new Redis({ url, token, enableTelemetry: false, retry: false });
  const app = createApp({
    redis,
    apiKeys: parseApiKeys(apiKeysText),
    keyPrefix: env.LOCK_KEY_PREFIX ?? "edgelock",
  });
  const http = Deno.serve({ port, hostname: "127.0.0.1", onListen() {} }, app.fetch);
  console.log(`edgelock on http://127.0.0.1:${http.addr.port}`);
  if (!env.LOCK_API_KEYS) {
    console.log(`Dev API key (tenant "dev"): ${apiKeysText.slice(4)}`);
    console.log(
      `Try: curl -s -X POST http://127.0.0.1:${http.addr.port}/v1/locks/demo/acquire ` +
        `-H 'authorization: Bearer ${
          apiKeysText.slice(4)
        }' -H 'content-type: application/json' -d '{}'`,
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
  console.error(`edgelock dev: ${(error as Error).message}`);
  await stopAll();
  Deno.exit(1);
}
