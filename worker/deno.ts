// Deno Deploy (and plain Deno) entry: configuration from Deno.env.
import { Redis } from "@upstash/redis";
import { createApp } from "../src/app.ts";
import { readConfig } from "../src/config.ts";

const config = readConfig(Deno.env.toObject());
const redis = new Redis({
  url: config.redisUrl,
  token: config.redisToken,
  enableTelemetry: false,
  retry: { retries: 2, backoff: (n) => 50 * 2 ** n },
});
const app = createApp({ redis, apiKeys: config.apiKeys, keyPrefix: config.keyPrefix });

// Deno Deploy picks its own port; locally PORT (default 8000) on HOSTNAME (default 127.0.0.1).
Deno.serve(
  {
    port: Number(Deno.env.get("PORT") ?? 8000),
    hostname: Deno.env.get("HOSTNAME") ?? "127.0.0.1",
  },
  app.fetch,
);
