// A middleware's handler run under its claim (idempotency's, a webhook id's).
import { hold } from "../core/with_lock.ts";

/** The claim a handler runs under: how long it lasts, and how it is renewed and freed. */
export interface HeldClaim {
  /** Named in errors, e.g. `webhook claim`. */
  what: string;
  leaseMs: number;
  /** `performance.now()` when the claim's request was sent, or later. */
  grantedAt: number;
  /** Renews the claim: true when renewed, false when it is another's now. */
  renew(): Promise<boolean>;
  /** Frees the claim, for a retry; its failure only delays that retry. */
  release(): Promise<unknown>;
}

/**
 * Runs `run` while the claim is renewed. The claim's token is its own (made for the claim) and a
 * handler cannot be stopped, so renewals go on after the renewal loop's watchdog fired, as long
 * as the claim is still this token's. A `run` that throws frees the claim and the error goes on;
 * a claim lost while it ran ends quietly: the reply goes out, and the store refuses to mark or
 * free another token's claim.
 */
export async function runClaimed(claim: HeldClaim, run: () => Promise<void>): Promise<void> {
  let threw = false;
  await hold({
    what: claim.what,
    ttlMs: claim.leaseMs,
    grantedAt: claim.grantedAt,
    renew: claim.renew,
    renewAfterAbort: true,
  }, async () => {
    try {
      await run();
    } catch (error) {
      threw = true;
      throw error;
    }
  }).catch(async (error) => {
    if (!threw) return;
    await claim.release().catch(() => false);
    throw error;
  });
}
