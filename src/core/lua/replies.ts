// Each script's reply, decoded once into what it means, so no caller reads a reply by index.
import { integers } from "../_runner.ts";
import type { Script } from "./_define.ts";
import { HINT } from "../_validate.ts";
import type { Lease } from "../types.ts";

/**
 * An acquire's grant: the fence, the lease left and the server time, ms; its hold count; and the
 * wake id of the waiter at the head of the queue ('' for none), for the release's hand-off.
 */
export interface Granted {
  status: "granted";
  fence: number;
  ttlMs: number;
  now: number;
  holdCount: number;
  next: string;
}

/**
 * A busy acquire: when to look again, the caller's place (-1 none, -2 queue full), lease left;
 * for shared and semaphore leases, when the first holder's lease ends (0: none).
 */
export interface Busy {
  status: "busy";
  retryAfterMs: number;
  now: number;
  position: number;
  pttl: number;
  firstEndsIn: number;
  /** For a shared waiter that blocks: the readers' bell's last ring, to listen from. */
  bellId?: string;
  /**
   * For a waiter that blocks: the wake id its offer names, when it is not the one the look declared
   * (a lease's successor id); absent, that one (a text in a reply costs an `@upstash/redis` client a
   * thrown `JSON.parse`).
   */
  wakeId?: string;
  /** For a waiter that queued: its ticket's end as Redis keeps it (this look's alone), for a leave. */
  ticketEnd?: string;
  /** For a reader that blocks: the name's last fence at this look, for a leave (see LEAVE_QUEUE). */
  seenFence?: number;
}

/**
 * The name is held in another mode (code 1), as a semaphore with another limit (2), by this
 * token with MAX_HOLDS holds already (3) or with other permits (4), or reentrant by this token,
 * which a plain acquire would not count (5); or the call's fresh token was released already (6:
 * a late copy of the call).
 */
export interface Mismatch {
  status: "mismatch";
  code: 1 | 2 | 3 | 4 | 5 | 6;
}

/** Busy with a full queue: the acquire script's place. */
export const QUEUE_FULL = -2;

/** An exclusive or shared acquire's reply. */
export function decodeAcquire(script: Script, reply: unknown): Granted | Busy | Mismatch {
  const [status] = integers(script, reply, 1);
  if (status === 1) {
    const [, fence, ttlMs, now, holdCount] = integers(script, reply, 5) as Tuple5;
    return { status: "granted", fence, ttlMs, now, holdCount, next: hintAt(reply, 5) };
  }
  return decodeNotGranted(script, reply);
}

/** A multi-name acquire's reply: a fence and a grant hint per name, in order, when granted. */
export function decodeAcquireAll(
  script: Script,
  reply: unknown,
  names: number,
):
  | { status: "granted"; fences: number[]; ttlMs: number; now: number; hints: string[] }
  | Busy
  | Mismatch {
  const [status] = integers(script, reply, 1);
  if (status !== 1) return decodeNotGranted(script, reply);
  const [, now, ttlMs, ...fences] = integers(script, reply, 3 + names) as [1, number, number];
  const hints = fences.map((_, i) => hintAt(reply, 3 + names + i));
  return { status: "granted", fences, ttlMs, now, hints };
}

function decodeNotGranted(script: Script, reply: unknown): Busy | Mismatch {
  const [status, code] = integers(script, reply, 2) as [number, number];
  if (status === -1) return { status: "mismatch", code: code as Mismatch["code"] };
  const [, retryAfterMs, now, position, pttl] = integers(script, reply, 5) as Tuple5;
  const first = (reply as unknown[])[5];
  const firstEndsIn = Number.isSafeInteger(first) && (first as number) > 0 ? first as number : 0;
  const bell = (reply as unknown[])[6];
  const bellId = typeof bell === "string" && /^\d+-\d+$/.test(bell) ? bell : undefined;
  const wake = (reply as unknown[])[7];
  const wakeId = typeof wake === "string" && WAKE_ID.test(wake) ? wake : undefined;
  // Sent as text; an Upstash client may have parsed it (automaticDeserialization): its shortest
  // text is the same number.
  const ticket = (reply as unknown[])[8];
  const text = typeof ticket === "number" ? String(ticket) : ticket;
  const ticketEnd = typeof text === "string" && /^\d+(?:\.\d+)?$/.test(text) ? text : undefined;
  const seen = (reply as unknown[])[9];
  const seenFence = Number.isSafeInteger(seen) && (seen as number) >= 0
    ? seen as number
    : undefined;
  return {
    status: "busy",
    retryAfterMs,
    now,
    position,
    pttl,
    firstEndsIn,
    ...(bellId && { bellId }),
    ...(wakeId && { wakeId }),
    ...(ticketEnd && { ticketEnd }),
    ...(seenFence !== undefined && { seenFence }),
  };
}

/** A renewal: the lease as the acquire's grant and what kind of lease it is, or lost. */
export function decodeRenew(
  script: Script,
  reply: unknown,
): Granted & { kind: Pick<Lease, "mode" | "limit" | "permits">; reentrant: boolean } | {
  status: "lost";
} {
  if (integers(script, reply, 1)[0] !== 1) return { status: "lost" };
  const [, fence, ttlMs, now, holdCount, limit, permits, reentrant] = integers(script, reply, 8);
  const kind: Pick<Lease, "mode" | "limit" | "permits"> = limit! < 0
    ? {}
    : limit === 0
    ? { mode: "shared" }
    : { mode: "semaphore", limit: limit!, permits: permits! };
  return {
    status: "granted",
    fence: fence!,
    ttlMs: ttlMs!,
    now: now!,
    holdCount: holdCount!,
    next: "",
    kind,
    reentrant: reentrant === 1,
  };
}

/**
 * A release: whether it took effect, the wake id of a head to hand over to ('' for none),
 * whether the lease ended (its last hold released), and whether it was refused because the lease
 * is reentrant and the release named no hold.
 */
export function decodeRelease(
  script: Script,
  reply: unknown,
): { released: boolean; head: string; ended: boolean; holdNeeded: boolean } {
  const list = Array.isArray(reply) ? reply : [reply];
  const [status] = integers(script, list, 1);
  const holdNeeded = status === -1 && integers(script, list, 2)[1] === 5;
  return { released: status === 1, head: headAt(list, 1), ended: list[2] === 1, holdNeeded };
}

/** A hand-over's second step: the head to try next (as `decodeRelease`'s), '' for none. */
export function decodeHandOver(script: Script, reply: unknown): string {
  integers(script, reply, 1);
  return headAt(reply as unknown[], 1);
}

/** A leave: the lease a hand-off gave the waiter before it left, if one did. */
export function decodeLeave(
  script: Script,
  reply: unknown,
): { fence: number; ttlMs: number; now: number; next: string } | undefined {
  if (!Array.isArray(reply)) return undefined;
  const [, fence, ttlMs, now] = integers(script, reply, 4);
  return { fence: fence!, ttlMs: ttlMs!, now: now!, next: "" };
}

/** A done-or-not reply (a hand-over): 1 when it took effect. */
export function decodeDone(script: Script, reply: unknown): boolean {
  return integers(script, [reply], 1)[0] === 1;
}

/** A wake id: a waiter's own (`w…`), or a lease's successor id (`f<fence>`). */
export const WAKE_ID = /^[\w-]{1,64}$/;

/**
 * A head to hand over to, as a release names it: its wake id, or for a multi-name waiter
 * `<wakeId>|<name>,<name>…` (its names, the first its wake key's).
 */
export const HEAD = /^[\w-]{1,64}(?:\|[\w.:{}-]{1,200}(?:,[\w.:{}-]{1,200}){0,31})?$/;

// A head in a reply, '' when absent or not one.
function headAt(reply: unknown, index: number): string {
  const value = Array.isArray(reply) ? reply[index] : undefined;
  return typeof value === "string" && HEAD.test(value) ? value : "";
}

// A grant's hint in a reply, '' when absent or not one.
function hintAt(reply: unknown, index: number): string {
  const value = Array.isArray(reply) ? reply[index] : undefined;
  return typeof value === "string" && HINT.test(value) ? value : "";
}

/** A break: the broken lease's fence, or not held. */
export function decodeBreak(script: Script, reply: unknown): { fence: number } | undefined {
  if (integers(script, reply, 1)[0] !== 1) return undefined;
  return { fence: integers(script, reply, 2)[1]! };
}

/** An inspect: the latest lease and its holders when held. */
export function decodeInspect(script: Script, reply: unknown):
  | undefined
  | {
    fence: number;
    ttlMs: number;
    now: number;
    waiters: number;
    meta: unknown;
    mode: unknown;
    holders: number;
    permits: number;
    limit: number;
  } {
  if (integers(script, reply, 1)[0] !== 1) return undefined;
  const [, fence, ttlMs, now, waiters] = integers(script, reply, 5) as Tuple5;
  const [meta, mode, holders, permits, limit] = (reply as unknown[]).slice(5);
  return {
    fence,
    ttlMs,
    now,
    waiters,
    meta,
    mode,
    holders: Number(holders),
    permits: Number(permits),
    limit: Number(limit),
  };
}

/** The held count and the stats fields of one bucket. */
export function decodeStats(script: Script, reply: unknown): {
  now: number;
  held: number;
  fields: unknown[];
} {
  const [now, held] = integers(script, reply, 2) as [number, number];
  return { now, held, fields: (reply as unknown[]).slice(2) };
}

type Tuple5 = [number, number, number, number, number];
