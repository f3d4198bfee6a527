import { recordId, type RecordStore, safeName } from "./records.ts";
import { checkOptions } from "../core/_validate.ts";

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
    /**
     * Extends the claim to `leaseMs` from now, for work that may outlast it: `false` if it was
     * lost meanwhile (another delivery may be processing the id now).
     */
    renew(): Promise<boolean>;
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
 * import { Redis } from "@upstash/redis";
 * import { dedupe, Records } from "@edgelock/edgelock/uses";
 *
 * const records = new Records(Redis.fromEnv());
 * const event = { id: "evt_123", amount: 42 };
 * const claim = await dedupe(records, { namespace: "stripe", id: event.id });
 * if (claim.state === "claimed") {
 *   try {
 *     console.log("processing", event.amount); // your handler
 *     await claim.done();
 *   } catch (error) {
 *     await claim.release();
 *     throw error;
 *   }
 * }
 * ```
 */
export async function dedupe(records: RecordStore, options: DedupeOptions): Promise<DedupeResult> {
  checkOptions(options, ["namespace", "id", "leaseMs", "retentionMs"], "dedupe()");
  const { namespace, leaseMs, retentionMs = DEDUPE_RETENTION_MS } = options ?? {};
  const id = recordId(namespace, await safeName(options?.id));
  const claim = await records.claim("dedupe", id, {
    ...(leaseMs !== undefined && { leaseMs }),
    retentionMs,
  });
  if (claim.state === "claimed") {
    const { token, fence } = claim;
    return {
      state: "claimed",
      token,
      fence,
      done: () => records.complete("dedupe", id, token),
      renew: async () => (await records.renew("dedupe", id, token, leaseMs)).renewed,
      release: () => records.release("dedupe", id, token),
    };
  }
  if (claim.state === "in_progress") return claim;
  return { state: "duplicate" };
}
