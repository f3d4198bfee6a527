// The waiting loop of every acquire: one script call per look, each timed to arrive when the
// server expects the caller's turn; or, for an exclusive waiter whose Redis serves blocking
// commands, one look and then a block on its wake key until a release hands it the lock.
import { sleep } from "./_backoff.ts";
import { type LockContext, timing } from "./_context.ts";
import { noteSentAt } from "./_granted.ts";
import { EdgelockError } from "./errors.ts";
import type { Script, ScriptCall } from "./lua/_define.ts";
import { HAND_OVER } from "./lua/hand_over.ts";
import { HAND_OVER_ALL } from "./lua/hand_over_all.ts";
import { LEAVE_QUEUE } from "./lua/leave_queue.ts";
import {
  type Busy,
  decodeHandOver,
  decodeLeave,
  type Mismatch,
  QUEUE_FULL,
} from "./lua/replies.ts";
import { MAX_HOLDS, MAX_TICKET_MS } from "./lua/lib.ts";
import { HINT } from "./_validate.ts";
import type { AcquireResult, Lease, LockEvent } from "./types.ts";

// A polling waiter looks again at least this often, and its ticket outlives each look by the
// margin. A blocked waiter blocks at most BLOCK_MS at a time (its ticket covers the block). The
// next look reaches Redis a round trip after the sleep (the reply, then the look) or two after the
// block (the look's reply, the block's, then the look): the ticket makes room for this wait's
// last round trips (at most MAX_RTT_MS each), and a sleep or block is cut short so the next look
// arrives within the ticket the look took, even when the round trip grew since.
const MAX_POLL_MS = 1000;
const TICKET_MARGIN_MS = 250;
const MAX_RTT_MS = 1000;
export const BLOCK_MS = 2000;
// The most steps one hand-over runs (see handOver).
const HAND_OVER_STEPS = 4;

/** One acquire's script call, the same at each look but for the ticket and the time waited. */
export interface Attempt<T extends Lease | Lease[]> {
  script: Script;
  call(look: Look): ScriptCall;
  /** What the caller is in each name's queue, for leaving it. */
  members: string[];
  decode(reply: unknown): { status: "granted"; granted: T } | Busy | Mismatch;
  /**
   * An exclusive waiter's wake key and its id, where a release's hand-off arrives, and the lease
   * a hand-off (or a grant found when leaving) gives; none for waiters that only poll. A
   * multi-name waiter's lease needs every fence: from a grant with fewer (a leave finds only the
   * first name's), none; a look then finds its leases.
   */
  wake?: {
    key: string;
    id: string;
    lease(grant: Grant): T | undefined;
  };
  /**
   * A shared waiter's readers' bell (a stream a release rings when readers fit, with the grants of
   * the readers at the head under their wake ids), its wake id, its own wake key (a stream, where
   * a release that declared it puts its grant), and the lease a grant gives; none for other
   * waiters.
   */
  bell?: Attempt<T>["wake"] & { own: string; hold: string };
}

/** A hand-off's grant: the fence (each name's in `fences`, when it told them), lease left, server time, hint. */
export interface Grant {
  fence: number;
  fences?: number[];
  ttlMs: number;
  now: number;
  next: string;
}

/** One look: the ticket it takes, the time waited so far, and the wake id when it will block. */
export interface Look {
  ticketMs: number;
  waitedMs: number;
  waiting: boolean;
  wakeId: string;
}

type NotAcquired = Exclude<AcquireResult, { acquired: true }>;
type Outcome = (LockEvent & { type: "acquire" })["outcome"];

/**
 * Looks until `attempt` is granted, the wait of `waitMs` is over, the queue is full or `signal`
 * aborts; leaves the queues it joined when it gives up. `label` names the lock in events. A
 * lease handed over to a waiter that then aborts is left to its TTL, not released: another call
 * with the same token (a retry) may have found it and been told it holds it.
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
  const granted = (granted: T, sentAt: number) => {
    const leases = [granted].flat();
    for (const lease of leases) noteSentAt(lease, sentAt);
    outcome("granted", leases[0]!.fence);
    return { acquired: true as const, granted };
  };
  let queued = false;
  let rtt = 0; // this wait's last round trip, ms
  let seenFence = 0; // a reader's: the name's last fence at its last look
  let ticketEnd = ""; // the end of the last ticket a look took, as Redis keeps it
  // Where a hand-off comes: the waiter's own wake key, or the one a look gave it (see `wakeFor`).
  let wake = attempt.wake;
  // Leaves the queues; a hand-off that came first is the caller's lease, returned.
  const leave = async (why: string): Promise<T | undefined> => {
    if (!queued) return undefined;
    const handed = wake ?? attempt.bell;
    const grant = await leaveQueues(context, names, attempt.members, why, handed, {
      seenFence,
      ticketEnd,
      hold: attempt.bell?.hold ?? "",
    });
    if (!grant) return undefined;
    const lease = handed!.lease(grant);
    if (lease) return lease;
    // Handed several names: a look without a ticket finds them held by this token.
    const look = { ticketMs: 0, waitedMs: 0, waiting: false, wakeId: "" };
    const reply = attempt.decode(await context.run(attempt.script, attempt.call(look)));
    return reply.status === "granted" ? reply.granted : undefined;
  };
  let blocking = (wake ?? attempt.bell) !== undefined && context.canBlock;
  const refused = (error: unknown) => {
    if (signal?.aborted) return null; // the loop's top leaves the queue
    blocking = false; // refused or unsupported: poll from here on
    return error instanceof EdgelockError && error.code === "config_error" ? error : null;
  };

  for (;;) {
    if (signal?.aborted) {
      await leave("aborted");
      outcome("aborted");
      signal.throwIfAborted();
    }
    const left = deadline - performance.now();
    // A waiter holds a FIFO ticket that outlives its next look (or block) by a margin.
    const between = blocking ? BLOCK_MS : MAX_POLL_MS;
    const margin = TICKET_MARGIN_MS + 2 * Math.min(rtt, MAX_RTT_MS);
    // At most 4.25 s, within the longest ticket the scripts give (MAX_TICKET_MS).
    const ticketMs = left > 0
      ? Math.min(Math.ceil(Math.min(left, between) + margin), MAX_TICKET_MS)
      : 0;
    const waitedMs = Math.round(performance.now() - started);
    queued ||= ticketMs > 0;
    const sentAt = performance.now();
    const wakeId = blocking && ticketMs > 0 ? (wake ?? attempt.bell)!.id : "";
    const call = attempt.call({ ticketMs, waitedMs, waiting: waitMs > 0, wakeId });
    const reply = attempt.decode(await context.run(attempt.script, call));
    rtt = performance.now() - sentAt;
    if (reply.status === "busy") seenFence = reply.seenFence ?? 0;
    if (reply.status === "busy" && ticketMs > 0 && reply.position >= 0) {
      ticketEnd = reply.ticketEnd ?? "";
    }
    if (reply.status === "busy" && wake && wakeId !== "" && reply.wakeId !== undefined) {
      wake = { ...wake, id: reply.wakeId, key: context.keys.wake(names[0]!, reply.wakeId) };
    }
    // How long after this look the next one may arrive and still find the ticket it took.
    const within = ticketMs - TICKET_MARGIN_MS;
    if (reply.status === "granted") return granted(reply.granted, sentAt);
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
      const handed = await leave("timeout");
      if (handed) return granted(handed, sentAt);
      outcome(queued ? "timeout" : "busy");
      return { ...busy, reason: "busy" };
    }
    if (signal?.aborted) continue;
    const { position } = reply;
    context.emit({ type: "wait", name: label, position, retryAfterMs, ...timing(sentAt) });
    if ((attempt.bell || wake) && wakeId !== "" && within - 2 * rtt <= 1) {
      continue; // no time to block before the ticket's end: look again at once
    }
    const ends = reply.firstEndsIn || reply.pttl;
    let message: string | null | Error | undefined;
    if (attempt.bell && reply.bellId && wakeId !== "" && position >= 0) {
      // Listen for the readers' bell and the reader's own wake key, at most until the first
      // holder's lease ends (readers may fit then, unannounced). A release grants the readers at
      // the head, each on its own wake key when it declared it, else in a ring of the bell; a
      // reader a ring did not grant listens on, unless the ring says more may fit, while its
      // ticket leaves room for a look.
      const listenedAt = performance.now();
      const until = Math.min(
        deadline,
        listenedAt + within - 2 * rtt,
        listenedAt + (ends > 0 ? ends + 1 : BLOCK_MS),
      );
      for (let from = reply.bellId; message === undefined;) {
        const blockMs = Math.min(until - performance.now(), BLOCK_MS);
        if (blockMs < 1) break;
        const { key, id, own } = attempt.bell;
        const heard = await context.listen(key, from, id, own, blockMs, signal).catch(refused);
        if (
          heard === null || heard instanceof Error || heard.grant !== "" || heard.more || heard.own
        ) {
          message = heard instanceof Error || heard === null ? heard : heard.grant;
        } else {
          from = heard.id;
        }
      }
      message ??= null;
    } else if (wake && wakeId !== "" && position >= 0) {
      // Block until a release hands the lock over; the head no longer than the holder's lease (a
      // semaphore's first holder's), so a holder that vanished is followed at its lease end.
      const blockMs = Math.min(
        remaining,
        BLOCK_MS,
        within - 2 * rtt,
        position === 0 ? ends + 1 : BLOCK_MS,
      );
      message = await context.block(wake.key, Math.max(1, blockMs), signal)
        .catch(refused);
    }
    const handed = wake ?? attempt.bell;
    if (message !== undefined && handed) {
      if (message instanceof Error) throw message;
      // A grant made before this look (the server clock says so) is no live lease: look again.
      const parsed = message === null ? undefined : parseGrant(message);
      const grant = parsed && parsed.now >= reply.now ? parsed : undefined;
      // The grant was made after this look reached Redis: its lease counts from this look's
      // sending, moved on by the server time between the look and the grant.
      const lease = grant && handed.lease(grant);
      if (lease) {
        const moved = sentAt + (grant.now - reply.now); // never before sentAt: grant.now >= reply.now
        const grantedAt = moved <= performance.now() ? moved : sentAt; // past now: a stepped clock
        return granted(lease, grantedAt);
      }
      continue;
    }
    // Look again so the request arrives when the server expects our turn: the hint counts from
    // the reply's making, and half a round trip has passed since, half is still ahead. The head
    // and the next in line aim a little late (early costs a round trip); the others spread ±10 %.
    const jitter = position <= 1 ? 1 + Math.random() * 0.1 : 0.9 + Math.random() * 0.2;
    const delay = Math.min(remaining, MAX_POLL_MS, within - rtt, retryAfterMs * jitter - rtt);
    await sleep(Math.max(1, delay), signal).catch(() => {}); // an abort: the loop's top
  }
}

/**
 * A hand-off's message, `<fence>:<leaseEndMs>:<nowMs>:<next>` (a multi-name waiter's has each
 * name's fence, comma-joined, and each name's hint, `;`-joined); undefined when malformed. A
 * hint that is not one is '' (the release then names no wake key).
 */
export function parseGrant(message: string): Grant | undefined {
  const match = /^(\d+(?:,\d+)*):(\d+):(\d+):(.*)$/.exec(message);
  if (!match) return undefined;
  const fences = match[1]!.split(",").map(Number);
  const [leaseEnd, now] = match.slice(2, 4).map(Number) as [number, number];
  const hints = match[4]!.split(";").map((hint) => HINT.test(hint) ? hint : "");
  return {
    fence: fences[0]!,
    ...(fences.length > 1 && { fences }),
    ttlMs: leaseEnd - now,
    now,
    next: hints.some((hint) => hint !== "") ? hints.join(";") : "",
  };
}

// Best effort: a ticket left behind lapses by itself within BLOCK_MS plus its margin. `outcome`
// ('timeout', 'aborted' or '') is counted in the stats, once. Returns the grant of a hand-off
// that reached the caller's first name before it left; `last` says which ticket the caller's last
// look took (another call with the token may have looked since), and for a reader the name's last
// fence at that look and the call's reentrant hold ('' for none). A waiter that timed out may have
// stood between the lock and those behind it (a writer ahead of readers that fit, a head whose
// holder is gone): once its leave is done (never before: a hand-over could find it still at the
// head and grant it), each name is handed over, as a release would. Not after an abort: aborts come
// in bursts (a shutdown), and a lease handed to a waiter that aborts next is left to its TTL.
async function leaveQueues(
  context: LockContext,
  names: readonly string[],
  members: string[],
  outcome: string,
  wake: { id: string } | undefined,
  last: { seenFence: number; ticketEnd: string; hold: string },
): Promise<Grant | undefined> {
  const calls = names.map((name, i) => {
    const { lockKey, queueKey, ticketsKey, offersKey, holdersKey } = context.keys.lock(name);
    const { statsKey } = i === 0 ? context.keys.statsKeys(name) : {};
    const wakeId = (i === 0 && wake?.id) || "";
    return LEAVE_QUEUE.call({
      keys: {
        queueKey,
        ticketsKey,
        offersKey,
        lockKey,
        wakeKey: context.keys.wake(name, wakeId),
        holdersKey,
        statsKey,
      },
      args: { member: members[i]!, outcome: i === 0 ? outcome : "", wakeId, ...last },
    });
  });
  const replies = await context.runMany(LEAVE_QUEUE, calls).catch(() => []);
  if (replies.length === 0) return undefined; // not left: its ticket lapses by itself
  const grant = decodeLeave(LEAVE_QUEUE, replies[0]);
  if (outcome === "timeout") await Promise.all(names.map((name) => handOver(context, name, "")));
  return grant;
}

/**
 * Hands `name` to the head of its queue, as a release does (see `./lua/hand_over.ts`): `wakeId`
 * is the head's wake id, '' when unknown (the first step then only names it, or rings the readers'
 * bell). Each step may name another head to try: the head, when another release's step got there
 * first, or the next semaphore waiter whose permits fit too; a few steps at most. Best effort: a
 * head not handed the lock here takes it at its next look (within one block).
 */
export async function handOver(context: LockContext, name: string, wakeId: string): Promise<void> {
  const { lockKey, queueKey, ticketsKey, offersKey, marksKey, holdersKey, readersKey } = context
    .keys.lock(name);
  const step = (wakeId: string) => {
    const hints = wakeId === "" ? [] : [wakeId];
    return HAND_OVER.call({
      keys: {
        lockKey,
        queueKey,
        ticketsKey,
        offersKey,
        marksKey,
        holdersKey,
        readersKey,
        ...context.keys.statsKeys(name),
      },
      each: hints.map((id) => ({ hintKey: context.keys.wake(name, id) })),
      args: { graceMs: context.fenceWindowMs, name, n: hints.length },
      rest: hints,
    });
  };
  try {
    for (let n = 0, next = wakeId; n < HAND_OVER_STEPS && (n === 0 || next !== ""); n++) {
      const waiter = multiHead(next);
      if (waiter) return await handOverAll(context, waiter);
      next = decodeHandOver(HAND_OVER, await context.run(HAND_OVER, step(next)));
    }
  } catch {
    // the waiters find the name at their next look
  }
}

/**
 * A multi-name waiter as a release or a grant's hint names it, `<wakeId>|<names>` (its names
 * comma-joined, the first its wake key's); none for a single waiter's wake ids.
 */
export function multiHead(head: string): MultiHead | undefined {
  const bar = head.indexOf("|");
  if (bar < 0) return undefined;
  return { wakeId: head.slice(0, bar), names: head.slice(bar + 1).split(",") };
}
type MultiHead = { wakeId: string; names: string[] };

// Hands a multi-name waiter all its names when all are free and it heads every queue (see
// `./lua/hand_over_all.ts`).
async function handOverAll(context: LockContext, waiter: MultiHead): Promise<void> {
  const call = handOverAllCall(context, waiter);
  if (call) await context.run(HAND_OVER_ALL, call);
}

/**
 * The call of `./lua/hand_over_all.ts` for `waiter`, sent after the release of `released` (the
 * lease's name and token) in the same request, or as a step of its own (none); no call for names
 * not of one slot.
 */
export function handOverAllCall(
  context: LockContext,
  { wakeId, names }: MultiHead,
  released?: { name: string; token: string },
): ScriptCall | undefined {
  // Names this layout cannot take together (another slot) are never one waiter's.
  if (context.keys.cluster && new Set(names.map((name) => context.keys.base(name))).size > 1) {
    return undefined;
  }
  return HAND_OVER_ALL.call({
    each: names.map((name) => context.keys.lock(name)),
    keys: { wakeKey: context.keys.wake(names[0]!, wakeId), ...context.keys.statsKeys(names[0]!) },
    args: {
      graceMs: context.fenceWindowMs,
      n: names.length,
      wakeId,
      by: released?.token ?? "",
      at: released ? names.indexOf(released.name) + 1 : 0,
    },
    rest: names,
  });
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
    case 6:
      return new EdgelockError(
        "lock_lost",
        `Lock "${name}" was released already by this call's token`,
      );
    default:
      return new EdgelockError("mode_mismatch", `Lock "${name}" is held in another mode`);
  }
}
