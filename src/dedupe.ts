import type { MiddlewareHandler } from "hono";
import { problem } from "./_problem.ts";
import { recordId, safeName, type Store } from "./store.ts";

/** Options for {@linkcode dedupe}. */
export interface DedupeOptions {
  /** Groups ids, e.g. the webhook provider: `stripe`. */
  namespace: string;
  /** The event's id (e.g. `webhook-id`). Ids outside the name character set are hashed. */
  id: string;
  /** How long a claim lasts if the worker crashes, ms. @default 30000 */
  leaseMs?: number;
  /**
   * How long a processed id is remembered, ms. Providers retry failed deliveries for days
   * (Stripe up to 3 days, Svix about 5 days), so a shorter memory lets a late retry through.
   * @default 604800000 (7 days)
   */
  retentionMs?: number;
}

/** The outcome of {@linkcode dedupe}. */
export type DedupeResult =
  | {
    state: "claimed";
    token: string;
    fence: number;
    /** Marks the id processed, for the retention. `false` if the claim was lost meanwhile. */
    done(): Promise<boolean>;
    /** Gives the id back, so the provider's retry can process it. */
    release(): Promise<boolean>;
  }
  | { state: "duplicate" }
  | { state: "in_progress"; retryAfterMs: number };

/** Seven days, in milliseconds. */
export const DEDUPE_RETENTION_MS = 7 * 86_400_000;

/**
 * Claims an event id so that exactly one delivery processes it.
 *
 * @example
 * ```ts
 * const claim = await dedupe(store, { namespace: "stripe", id: event.id });
 * if (claim.state === "claimed") {
 *   try { await handle(event); await claim.done(); } catch (e) { await claim.release(); throw e; }
 * }
 * ```
 */
export async function dedupe(store: Store, options: DedupeOptions): Promise<DedupeResult> {
  const { namespace, leaseMs, retentionMs = DEDUPE_RETENTION_MS } = options ?? {};
  const id = recordId(namespace, await safeName(options?.id));
  const claim = await store.claim("dedupe", id, {
    ...(leaseMs !== undefined && { leaseMs }),
    retentionMs,
  });
  if (claim.state === "claimed") {
    const { token, fence } = claim;
    return {
      state: "claimed",
      token,
      fence,
      done: () => store.complete("dedupe", id, token),
      release: () => store.release("dedupe", id, token),
    };
  }
  if (claim.state === "in_progress") return claim;
  return { state: "duplicate" };
}

/** Options for {@linkcode webhookDedupe}. */
export interface WebhookDedupeOptions extends Omit<DedupeOptions, "id"> {
  store: Store;
  /** Signing secrets (`whsec_…` base64, as Standard Webhooks and Svix issue them); any one may match. */
  secrets: readonly string[];
  /** Largest clock difference accepted for `webhook-timestamp`, seconds. @default 300 */
  toleranceSec?: number;
  /** Injectable clock, epoch ms. @default Date.now */
  now?: () => number;
}

/**
 * Hono middleware for webhook endpoints: verifies a Standard Webhooks (Svix-style) signature
 * (`webhook-id`, `webhook-timestamp`, `webhook-signature`, HMAC-SHA256), then lets exactly one
 * delivery of each `webhook-id` through. Duplicates already processed get 200; a delivery while
 * another is in flight gets 409 with `Retry-After`. A 2xx from the handler marks the id done;
 * anything else, or a thrown error, releases it for the provider's retry.
 */
export function webhookDedupe(
  { store, secrets, toleranceSec = 300, now = Date.now, ...options }: WebhookDedupeOptions,
): MiddlewareHandler {
  if (!Array.isArray(secrets) || secrets.length === 0) {
    throw new TypeError("webhookDedupe needs at least one signing secret");
  }
  const raw = secrets.map(decodeSecret);
  const keys = Promise.all(
    raw.map((bytes) =>
      crypto.subtle.importKey("raw", bytes, { name: "HMAC", hash: "SHA-256" }, false, ["verify"])
    ),
  );
  keys.catch(() => {}); // a failure surfaces in the first request that awaits the keys
  return async function webhookDedupeMiddleware(c, next) {
    const id = c.req.header("webhook-id");
    const timestamp = c.req.header("webhook-timestamp");
    const signatures = c.req.header("webhook-signature");
    const body = await c.req.text();
    if (!id || !timestamp || !signatures || !/^\d{1,12}$/.test(timestamp)) {
      return problem(
        400,
        "invalid_request",
        "Missing webhook-id, webhook-timestamp or webhook-signature",
      );
    }
    if (Math.abs(now() / 1000 - Number(timestamp)) > toleranceSec) {
      return problem(401, "unauthorized", "The webhook timestamp is outside the tolerance");
    }
    if (!(await verify(await keys, `${id}.${timestamp}.${body}`, signatures))) {
      return problem(401, "unauthorized", "The webhook signature does not match");
    }
    const claim = await dedupe(store, { ...options, id });
    if (claim.state === "duplicate") return c.json({ duplicate: true }, 200);
    if (claim.state === "in_progress") {
      return problem(409, "in_progress", "This delivery is being processed", {
        headers: { "retry-after": String(Math.max(1, Math.ceil(claim.retryAfterMs / 1000))) },
      });
    }
    try {
      await next();
    } catch (error) {
      await claim.release().catch(() => false);
      throw error;
    }
    if (c.res.status >= 200 && c.res.status < 300 && !c.error) await claim.done();
    else await claim.release();
    return undefined;
  };
}

// Checked when the middleware is built, so a bad secret is a clear error at start-up rather than
// a failure (or an unhandled rejection) at the first delivery.
function decodeSecret(secret: unknown, index: number): Uint8Array<ArrayBuffer> {
  if (typeof secret !== "string") {
    throw new TypeError(`Webhook secret ${index + 1} must be a string, not ${typeof secret}`);
  }
  const text = secret.startsWith("whsec_") ? secret.slice(6) : secret;
  let bytes: Uint8Array<ArrayBuffer>;
  try {
    bytes = Uint8Array.from(atob(text), (ch) => ch.charCodeAt(0));
  } catch {
    throw new TypeError(
      `Webhook secret ${index + 1} must be base64, optionally prefixed with whsec_`,
    );
  }
  if (bytes.length === 0) {
    throw new RangeError(`Webhook secret ${index + 1} is empty: it needs at least one byte`);
  }
  return bytes;
}

async function verify(keys: CryptoKey[], content: string, header: string): Promise<boolean> {
  const data = new TextEncoder().encode(content);
  for (const entry of header.split(" ")) {
    const [version, signature] = entry.split(",");
    if (version !== "v1" || !signature) continue;
    let bytes: Uint8Array<ArrayBuffer>;
    try {
      bytes = Uint8Array.from(atob(signature), (ch) => ch.charCodeAt(0));
    } catch {
      continue;
    }
    // crypto.subtle.verify compares in constant time.
    for (const key of keys) {
      if (await crypto.subtle.verify("HMAC", key, bytes, data)) return true;
    }
  }
  return false;
}
