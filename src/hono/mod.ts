/**
 * Hono middleware for your own apps: `idempotency()` (the IETF Idempotency-Key draft) and
 * `webhookDedupe()` (Standard Webhooks signatures, each delivery id processed once).
 *
 * @example
 * ```ts
 * import { Hono } from "hono";
 * import { Redis } from "@upstash/redis";
 * import { Records } from "@edgelock/edgelock/uses";
 * import { idempotency } from "@edgelock/edgelock/hono";
 *
 * const records = new Records(Redis.fromEnv());
 * const app = new Hono();
 * app.post("/orders", idempotency({ records, scope: (c) => c.req.header("x-user") ?? "anonymous" }), (c) =>
 *   c.json({ ok: true }, 201));
 * ```
 *
 * @module
 */
export { idempotency, type IdempotencyOptions, parseKey } from "./idempotency.ts";
export { webhookDedupe, type WebhookDedupeOptions } from "./webhook_dedupe.ts";
export type { PerRequest } from "./_problem.ts";
