import type { Context, MiddlewareHandler } from "hono";
import {
  checkStore,
  type PerRequest,
  perRequest,
  problem,
  storeFactory,
  unavailable,
} from "./_problem.ts";
import { dedupe, type DedupeOptions } from "../uses/dedupe.ts";
import { checkOptions, DEFAULT_LEASE_MS } from "../core/_validate.ts";
import { runClaimed } from "./_claim.ts";
import type { RecordStore } from "../uses/records.ts";
import { InvalidRange, InvalidType } from "../core/_invalid.ts";

/** Options for {@linkcode webhookDedupe}. */
export interface WebhookDedupeOptions extends Omit<DedupeOptions, "id"> {
  /**
   * Where the delivery ids are claimed: a store, or a function that makes it per request (on
   * Workers, from `c.env`: `(c) => new Records(Redis.fromEnv(c.env))`).
   */
  records: PerRequest<RecordStore>;
  /**
   * Signing secrets (`whsec_…` base64, as Standard Webhooks and Svix issue them); any one may
   * match. Or a function that reads them per request (on Workers: `(c) => [c.env.WEBHOOK_SECRET]`);
   * a missing or malformed one is then a 500 `config_error` that names it.
   */
  secrets: PerRequest<readonly string[]>;
  /** Largest clock difference accepted for `webhook-timestamp`, seconds. @default 300 */
  toleranceSec?: number;
  /** Injectable clock, epoch ms. @default Date.now */
  now?: () => number;
}

const WEBHOOK_OPTIONS = [
  "records",
  "secrets",
  "toleranceSec",
  "now",
  "namespace",
  "leaseMs",
  "retentionMs",
] as const;

/**
 * Hono middleware for webhook endpoints: verifies a Standard Webhooks (Svix-style) signature
 * (`webhook-id`, `webhook-timestamp`, `webhook-signature`, HMAC-SHA256), then lets exactly one
 * delivery of each `webhook-id` through. Duplicates already processed get 200; a delivery while
 * another is in flight gets 409 with `Retry-After` (the claim is renewed while the handler runs,
 * every third of `leaseMs`). A 2xx from the handler marks the id done; anything else, or a thrown
 * error, releases it for the provider's retry.
 */

export function webhookDedupe(given: WebhookDedupeOptions): MiddlewareHandler {
  checkOptions(given, WEBHOOK_OPTIONS, "webhookDedupe()");
  const { records, secrets, toleranceSec = 300, now = Date.now, ...options } = given;
  const storeOf = storeFactory(records, "webhookDedupe");
  // Secrets given as is are checked now, at start-up; per-request ones at each request, their
  // keys imported once per set of secrets.
  const fixed = typeof secrets === "function" ? undefined : importKeys(secrets);
  const keysOf = (c: Context) => fixed ?? importKeys((secrets as (c: Context) => unknown)(c));
  return async function webhookDedupeMiddleware(c, next) {
    const store = perRequest(
      storeOf,
      c,
      "webhookDedupe's records setting",
      checkStore("webhookDedupe"),
    );
    if (store instanceof Response) return store;
    const keys = perRequest(keysOf, c, "webhookDedupe's secrets setting", (keys) => keys as Keys);
    if (keys instanceof Response) return keys;
    const id = c.req.header("webhook-id");
    const timestamp = c.req.header("webhook-timestamp");
    const signatures = c.req.header("webhook-signature");
    // Signed as sent: the raw bytes, not their decoding (which makes bad UTF-8 into U+FFFD).
    const body = new Uint8Array(await c.req.arrayBuffer());
    if (!id || !timestamp || !signatures || !/^\d{1,12}$/.test(timestamp)) {
      return problem(
        400,
        "invalid_request",
        "Missing webhook-id, webhook-timestamp or webhook-signature",
      );
    }
    if (Math.abs(now() / 1000 - Number(timestamp)) > toleranceSec) {
      await store.noteSignatureFailure?.();
      return problem(401, "unauthorized", "The webhook timestamp is outside the tolerance");
    }
    const head = new TextEncoder().encode(`${id}.${timestamp}.`);
    const signed = new Uint8Array(head.length + body.length);
    signed.set(head);
    signed.set(body, head.length);
    if (!(await verify(await keys, signed, signatures))) {
      await store.noteSignatureFailure?.();
      return problem(401, "unauthorized", "The webhook signature does not match");
    }
    let claim;
    // The claim is surely held until leaseMs after its request was sent.
    const claimedAt = performance.now();
    try {
      claim = await dedupe(store, { ...options, id });
    } catch (error) {
      const reply = unavailable(error, "deduplication");
      if (reply) return reply;
      throw error;
    }
    if (claim.state === "duplicate") return c.json({ duplicate: true }, 200);
    if (claim.state === "in_progress") {
      return problem(409, "in_progress", "This delivery is being processed", {
        headers: { "retry-after": String(Math.max(1, Math.ceil(claim.retryAfterMs / 1000))) },
      });
    }
    // The claim is renewed while the handler runs, so a redelivery while it is slow gets 409.
    // A claim lost meanwhile (another delivery's now) is neither marked nor freed below: both
    // act only for the claim's own token.
    await runClaimed({
      what: "webhook claim",
      leaseMs: options.leaseMs ?? DEFAULT_LEASE_MS,
      grantedAt: claimedAt,
      renew: claim.renew,
      release: claim.release,
    }, next);
    // The handler's reply stands even if Redis fails now: an unmarked id frees when its lease
    // ends, and a redelivery after that is processed again (at least once, never lost).
    if (c.res.status >= 200 && c.res.status < 300 && !c.error) {
      await claim.done().catch(() => false);
    } else await claim.release().catch(() => false);
    return undefined;
  };
}

type Keys = Promise<CryptoKey[]>;

// The HMAC keys of a set of secrets, decoded (throwing what is wrong with one) and imported once:
// per-request secrets are the same few sets, so the last few are kept.
const imported = new Map<string, Keys>();
function importKeys(secrets: unknown): Keys {
  if (!Array.isArray(secrets) || secrets.length === 0) {
    throw new InvalidType("webhookDedupe needs secrets: at least one signing secret");
  }
  const raw = secrets.map(decodeSecret);
  // JSON: a secret holding a newline (atob skips it) cannot pass for two secrets
  const id = JSON.stringify(secrets);
  let keys = imported.get(id);
  if (!keys) {
    keys = Promise.all(
      raw.map((bytes) =>
        crypto.subtle.importKey("raw", bytes, { name: "HMAC", hash: "SHA-256" }, false, ["verify"])
      ),
    );
    keys.catch(() => {}); // a failure surfaces in the first request that awaits the keys
    if (imported.size >= 8) imported.delete(imported.keys().next().value!);
    imported.set(id, keys);
  }
  return keys;
}

// Checked when the middleware is built, so a bad secret is a clear error at start-up rather than
// a failure (or an unhandled rejection) at the first delivery.
function decodeSecret(secret: unknown, index: number): Uint8Array<ArrayBuffer> {
  if (typeof secret !== "string" || secret.trim() === "") {
    throw new InvalidType(
      `Webhook secret ${index + 1} is ${
        typeof secret === "string" ? "empty" : typeof secret
      }: set the endpoint's signing secret (whsec_…)`,
    );
  }
  const text = secret.startsWith("whsec_") ? secret.slice(6) : secret;
  let bytes: Uint8Array<ArrayBuffer>;
  try {
    bytes = Uint8Array.from(atob(text), (ch) => ch.charCodeAt(0));
  } catch {
    throw new InvalidType(
      `Webhook secret ${index + 1} must be base64, optionally prefixed with whsec_`,
    );
  }
  if (bytes.length === 0) {
    throw new InvalidRange(`Webhook secret ${index + 1} is empty: it needs at least one byte`);
  }
  return bytes;
}

async function verify(
  keys: CryptoKey[],
  data: Uint8Array<ArrayBuffer>,
  header: string,
): Promise<boolean> {
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
