// The waiting loop of every acquire: one script call per look, each timed to arrive when the
// server expects the caller's turn.
import { sleep } from "./_backoff.ts";
import { type LockContext, timing } from "./_context.ts";
import { noteSentAt } from "./_granted.ts";
import { EdgelockError } from "./errors.ts";
import type { Script, ScriptCall } from "./lua/_define.ts";
import { LEAVE_QUEUE } from "./lua/leave_queue.ts";
import { type Busy, type Mismatch, QUEUE_FULL } from "./lua/replies.ts";
import { MAX_HOLDS } from "./lua/lib.ts";
import type { AcquireResult, Lease, LockEvent } from "./types.ts";

// A waiter looks again at least this often, and its ticket outlives each look by the margin.
const MAX_POLL_MS = 1000;
const TICKET_MARGIN_MS = 250;

/** One acquire's script call, the same at each look but for the ticket and the time waited. */
export interface Attempt<T extends Lease | Lease[]> {
  script: Script;
  call(look: { ticketMs: number; waitedMs: number; waiting: boolean }): ScriptCall;
  /** What the caller is in each name's queue, for leaving it. */
  members: string[];
  decode(reply: unknown): { status: "granted"; granted: T } | Busy | Mismatch;
}

type NotAcquired = Exclude<AcquireResult, { acquired: true }>;
type Outcome = (LockEvent & { type: "acquire" })["outcome"];

/**
 * Looks until `attempt` is granted, the wait of `waitMs` is over, the queue is full or `signal`
 * aborts; leaves the queues it joined when it gives up. `label` names the lock in events.
 */
export async function waitFor<T extends Lease | Lease[]>(
  context: LockContext,
  label: string,
  names: readonly string[],
  attempt: Attempt<T>,
  { waitMs, signal }: { waitMs: number; signal: AbortSignal | undefined },
): Promise<{ acquired: true; granted: T } | NotAcquired> {
  const started = performance.now();
  const deadline = started + waitMs;
  const outcome = (outcome: Outcome, fence?: number) =>
    context.emit({
      type: "acquire",
      name: label,
      outcome,
      ...(fence !== undefined && { fence }),
      waitedMs: performance.now() - started,
      ...timing(started),
    });
  let queued = false;
  const leave = (why: string) =>
    queued ? leaveQueues(context, names, attempt.members, why) : undefined;

  for (;;) {
    if (signal?.aborted) {
      await leave("aborted");
      outcome("aborted");
      signal.throwIfAborted();
    }
    const left = deadline - performance.now();
    // A waiter holds a FIFO ticket that outlives its next look by a margin.
    const ticketMs = left > 0 ? Math.ceil(Math.min(left, MAX_POLL_MS) + TICKET_MARGIN_MS) : 0;
    const waitedMs = Math.round(performance.now() - started);
    queued ||= ticketMs > 0;
    const sentAt = performance.now();
    const call = attempt.call({ ticketMs, waitedMs, waiting: waitMs > 0 });
    const reply = attempt.decode(await context.run(attempt.script, call));
    if (reply.status === "granted") {
      const leases = [reply.granted].flat();
      for (const lease of leases) noteSentAt(lease, sentAt);
      outcome("granted", leases[0]!.fence);
      return { acquired: true, granted: reply.granted };
    }
    if (reply.status === "mismatch") { // the caller's mistake, not an outcome: no acquire event
      await leave("");
      throw mismatchError(label, reply.code);
    }
    const retryAfterMs = Math.max(1, reply.retryAfterMs);
    const busy = {
      acquired: false as const,
      retryAfterMs,
      ...(reply.pttl > 0 && { lockExpiresAt: reply.now + reply.pttl }),
    };
    if (reply.position === QUEUE_FULL) {
      await leave("");
      outcome("queue_full");
      return { ...busy, reason: "queue_full" };
    }
    const remaining = deadline - performance.now();
    if (remaining <= 0) {
      await leave("timeout");
      outcome(queued ? "timeout" : "busy");
      return { ...busy, reason: "busy" };
    }
    if (signal?.aborted) continue;
    const { position } = reply;
    context.emit({ type: "wait", name: label, position, retryAfterMs, ...timing(sentAt) });
    // Look again so the request arrives when the server expects our turn: the hint counts from
    // the reply's making, and half a round trip has passed since, half is still ahead. The head
    // and the next in line aim a little late (early costs a round trip); the others spread ±10 %.
    const rtt = performance.now() - sentAt;
    const jitter = position <= 1 ? 1 + Math.random() * 0.1 : 0.9 + Math.random() * 0.2;
    const delay = Math.min(remaining, MAX_POLL_MS, retryAfterMs * jitter - rtt);
    await sleep(Math.max(1, delay), signal).catch(() => {}); // an abort: the loop's top
  }
}

// Best effort: a ticket left behind lapses by itself within MAX_POLL_MS + TICKET_MARGIN_MS.
// `outcome` ('timeout', 'aborted' or '') is counted in the stats, once.
async function leaveQueues(
  context: LockContext,
  names: readonly string[],
  members: string[],
  outcome: string,
): Promise<void> {
  const calls = names.map((name, i) => {
    const { queueKey, ticketsKey } = context.keys.lock(name);
    const { statsKey } = i === 0 ? context.keys.statsKeys(name) : {};
    return LEAVE_QUEUE.call({
      keys: { queueKey, ticketsKey, statsKey },
      args: { member: members[i]!, outcome: i === 0 ? outcome : "" },
    });
  });
  await context.runMany(LEAVE_QUEUE, calls).catch(() => {});
}

function mismatchError(name: string, code: Mismatch["code"]): EdgelockError {
  switch (code) {
    case 2:
      return new EdgelockError(
        "limit_mismatch",
        `Lock "${name}" is held as a semaphore with another limit`,
      );
    case 3:
      return new EdgelockError(
        "hold_limit",
        `Cannot acquire lock "${name}" again: this token holds it ${MAX_HOLDS} times already`,
      );
    case 4:
      return new EdgelockError(
        "permits_mismatch",
        `This token holds lock "${name}" with another number of permits: release that lease first`,
      );
    case 5:
      return new EdgelockError(
        "mode_mismatch",
        `This token holds lock "${name}" reentrant: acquire it again with reentrant: true`,
      );
    default:
      return new EdgelockError("mode_mismatch", `Lock "${name}" is held in another mode`);
  }
}
