// A Cloudflare Worker that processes each Standard Webhooks delivery once, whatever the provider
// retries. Its Redis client and signing secret come from the Worker's env, per request.
import { Hono } from "hono";
import { Redis } from "@upstash/redis/cloudflare";
import { Records } from "@edgelock/edgelock/uses";
import { webhookDedupe } from "@edgelock/edgelock/hono";

type Env = {
  UPSTASH_REDIS_REST_URL: string;
  UPSTASH_REDIS_REST_TOKEN: string;
  WEBHOOK_SECRET: string;
};

export default new Hono<{ Bindings: Env }>().post(
  "/webhooks",
  webhookDedupe({
    records: (c) => new Records(Redis.fromEnv(c.env)),
    secrets: (c) => [c.env.WEBHOOK_SECRET],
    namespace: "example",
  }),
  async (c) => {
    const event = await c.req.json<{ type: string }>();
    // Your processing: it runs once per webhook-id, and again only if it fails (a non-2xx reply).
    return c.text(`processed ${event.type} ${c.req.header("webhook-id")}`);
  },
);
