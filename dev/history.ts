/**
 * A history of lock operations as clients saw them, a fenced model resource, and a checker.
 *
 * Times: `invokedAt`/`completedAt` are the client's clock, `serverTime`/`expiresAt` the Redis
 * server's. The checker compares the two only for releases (which carry no server time); on one
 * machine both read the same clock, and `slackMs` absorbs the difference in when each is read.
 *
 * @module
 */
import type { RedisLike } from "../src/core/_runner.ts";
import type { Script } from "../src/core/lua/_define.ts";
import {
  ACQUIRE,
  ACQUIRE_ALL,
  ACQUIRE_SHARED,
  HAND_OVER,
  HAND_OVER_ALL,
  RELEASE,
} from "../src/core/lua/mod.ts";

/** One operation as a client recorded it. */
export type Operation =
  | {
    op: "acquire";
    client: string;
    name: string;
    token: string;
    invokedAt: number;
    completedAt: number;
    outcome: "acquired" | "busy" | "failed";
    fence?: number;
    serverTime?: number;
    expiresAt?: number;
    /** Absent: exclusive. */
    mode?: "shared" | "semaphore";
    /** A semaphore's limit, and this lease's permits. */
    limit?: number;
    permits?: number;
    /** Part of a multi-name acquire (all its names' entries share the token). */
    multi?: boolean;
    /** A reentrant acquire's hold id. */
    hold?: string;
  }
  | {
    op: "renew";
    client: string;
    name: string;
    token: string;
    invokedAt: number;
    completedAt: number;
    outcome: "renewed" | "lost" | "failed";
    serverTime?: number;
    expiresAt?: number;
  }
  | {
    op: "release";
    client: string;
    name: string;
    token: string;
    invokedAt: number;
    completedAt: number;
    outcome: "released" | "not_held" | "failed";
    /** The reentrant hold it ends. */
    hold?: string;
  };

/** A violation the checker found. */
export interface Violation {
  rule:
    | "overlap"
    | "over_limit"
    | "fence_order"
    | "partial_grant"
    | "stale_fence"
    | "lost_update"
    | "foreign_renew"
    | "foreign_release"
    | "server_error";
  name: string;
  detail: string;
}

/** A resource that refuses any access with a fence older than the newest it has seen. */
export class FencedResource {
  readonly #state = new Map<string, { maxFence: number; value: number; accepted: number }>();
  /** Accepted accesses, in order. */
  readonly log: { name: string; fence: number; op: "read" | "write"; value: number }[] = [];
  rejected = 0;

  #get(name: string, fence: number) {
    if (!Number.isSafeInteger(fence)) throw new TypeError(`fence ${fence} is not an integer`);
    let state = this.#state.get(name);
    if (!state) this.#state.set(name, state = { maxFence: 0, value: 0, accepted: 0 });
    return state;
  }

  /** Reads the counter; `undefined` when refused (an older fence). */
  read(name: string, fence: number): number | undefined {
    const state = this.#get(name, fence);
    if (fence < state.maxFence) return void this.rejected++;
    state.maxFence = fence;
    this.log.push({ name, fence, op: "read", value: state.value });
    return state.value;
  }

  /**
   * A shared holder's read: refused when a later writer has been (its fence is older than the
   * newest seen); readers do not refuse each other, so it neither logs nor raises the newest.
   */
  peek(name: string, fence: number): number | undefined {
    const state = this.#get(name, fence);
    if (fence < state.maxFence) return void this.rejected++;
    return state.value;
  }

  /** Writes the counter; `false` when refused. */
  write(name: string, fence: number, value: number): boolean {
    const state = this.#get(name, fence);
    if (fence < state.maxFence) return (this.rejected++, false);
    state.maxFence = fence;
    state.value = value;
    state.accepted++;
    this.log.push({ name, fence, op: "write", value });
    return true;
  }

  /** Per name: the counter and how many increments were accepted. */
  totals(): Map<string, { value: number; accepted: number }> {
    return new Map(
      [...this.#state].map(([name, s]) => [name, { value: s.value, accepted: s.accepted }]),
    );
  }
}

interface LeaseSpan {
  name: string;
  token: string;
  start: number;
  end: number;
  fence: number;
  mode: "exclusive" | "shared" | "semaphore";
  limit: number;
  permits: number;
  /** The hold ids it was granted ('' for a plain acquire). */
  holds: Set<string>;
}

/** Checks a history (and optionally the resource it guarded) for the lock's guarantees. */
export function check(
  history: readonly Operation[],
  { resource, slackMs = 5 }: { resource?: FencedResource; slackMs?: number } = {},
): Violation[] {
  const violations: Violation[] = [];
  const key = (name: string, token: string) => `${name}\u0000${token}`;

  // One span per lease: a token may hold a name more than once, one lease after another (a retry
  // or a reentrant acquire that arrives after its lease ended is granted anew, with a new fence),
  // and the gap between them is free for others.
  const byFence = new Map<string, LeaseSpan>(); // by name + token + fence
  for (const op of history) {
    if (op.op !== "acquire" || op.outcome !== "acquired") continue;
    const k = `${key(op.name, op.token)}\u0000${op.fence}`;
    const span = byFence.get(k);
    if (span) {
      span.start = Math.min(span.start, op.serverTime!);
      span.end = Math.max(span.end, op.expiresAt!);
      span.holds.add(op.hold ?? "");
    } else {
      byFence.set(k, {
        name: op.name,
        token: op.token,
        start: op.serverTime!,
        end: op.expiresAt!,
        fence: op.fence!,
        mode: op.mode ?? "exclusive",
        limit: op.limit ?? 1,
        permits: op.permits ?? 1,
        holds: new Set([op.hold ?? ""]),
      });
    }
  }
  const leasesOf = new Map<string, LeaseSpan[]>(); // by name + token, in order of grant
  for (const span of byFence.values()) {
    const k = key(span.name, span.token);
    if (!leasesOf.has(k)) leasesOf.set(k, []);
    leasesOf.get(k)!.push(span);
  }
  for (const list of leasesOf.values()) list.sort((a, b) => a.start - b.start);
  // The token's lease that stood at server time `at`: the last granted by then.
  const leaseAt = (name: string, token: string, at: number) =>
    (leasesOf.get(key(name, token)) ?? []).findLast((span) => span.start <= at);

  for (const op of history) {
    if (op.op === "renew" && op.outcome === "renewed") {
      const span = leaseAt(op.name, op.token, op.serverTime!);
      if (span) span.end = Math.max(span.end, op.expiresAt!);
    }
  }
  // A release may have taken effect as early as its first attempt's invocation, whatever its
  // reply said: the reply may be lost, or be that of a duplicate or retry. It ends no lease
  // granted after its reply came back. A reentrant lease ends only once every hold it was granted
  // has had its release sent: the latest of those.
  const releasesOf = new Map<string, (Operation & { op: "release" })[]>();
  for (const op of history) {
    if (op.op !== "release") continue;
    const k = key(op.name, op.token);
    if (!releasesOf.has(k)) releasesOf.set(k, []);
    releasesOf.get(k)!.push(op);
  }
  // The first release of `span`'s token (of `hold`, when given) that may have ended it.
  const firstRelease = (span: LeaseSpan, hold?: string) =>
    Math.min(
      ...(releasesOf.get(key(span.name, span.token)) ?? []).filter((op) =>
        (hold === undefined || (op.hold ?? "") === hold) &&
        op.completedAt >= span.start - slackMs
      ).map((op) => op.invokedAt),
    );
  for (const span of byFence.values()) {
    const last = Math.max(...[...span.holds].map((hold) => firstRelease(span, hold)));
    if (last < Infinity) span.end = Math.min(span.end, Math.max(span.start, last));
  }
  const byName = new Map<string, LeaseSpan[]>();
  for (const span of byFence.values()) {
    if (!byName.has(span.name)) byName.set(span.name, []);
    byName.get(span.name)!.push(span);
  }

  // (a) No lease overlaps one it excludes: an exclusive lease is alone, a shared one never beside
  // an exclusive one, and a semaphore's leases never hold more than its limit at once.
  for (const [name, list] of byName) {
    list.sort((a, b) => a.start - b.start);
    let active: LeaseSpan[] = [];
    for (const span of list) {
      active = active.filter((other) => other.end - slackMs > span.start);
      const excluded = active.find((other) =>
        span.mode === "exclusive" || other.mode === "exclusive" ||
        (span.mode === "shared") !== (other.mode === "shared")
      );
      if (excluded) {
        violations.push({
          rule: "overlap",
          name,
          detail: `${span.mode} lease ${span.token} from ${span.start} began ` +
            `${excluded.end - span.start} ms before the ${excluded.mode} lease ${excluded.token} ` +
            `[${excluded.start}, ${excluded.end}] ended`,
        });
      } else if (span.mode === "semaphore") {
        const out = active.reduce((sum, other) => sum + other.permits, span.permits);
        if (out > span.limit) {
          violations.push({
            rule: "over_limit",
            name,
            detail: `${out} permits of ${span.limit} held at ${span.start} (${span.token} took ` +
              `${span.permits})`,
          });
        }
      }
      active.push(span);
    }
  }

  // (d) Fences strictly increase per name: one per lease, and a later grant a higher one. A lease
  // was granted after its token's first acquire was sent and before the reply that told of it (a
  // retry's reply may be the first to arrive), so only leases whose windows do not overlap are
  // ordered.
  const sentFirst = new Map<string, number>();
  for (const op of history) {
    if (op.op !== "acquire") continue;
    const k = key(op.name, op.token);
    sentFirst.set(k, Math.min(sentFirst.get(k) ?? Infinity, op.invokedAt));
  }
  for (const [name, list] of byName) {
    const seen = new Set<number>();
    const byEnd = [...list].sort((a, b) => a.start - b.start);
    const earliest = (span: LeaseSpan) => sentFirst.get(key(span.name, span.token))!;
    let before = 0; // the highest fence of the leases surely granted earlier
    let j = 0;
    for (const span of [...list].sort((a, b) => earliest(a) - earliest(b))) {
      while (j < byEnd.length && byEnd[j]!.start < earliest(span) - slackMs) {
        before = Math.max(before, byEnd[j++]!.fence);
      }
      if (seen.has(span.fence) || span.fence <= before) {
        violations.push({
          rule: "fence_order",
          name,
          detail: `lease ${span.token} sent at ${earliest(span)} got fence ${span.fence}, ` +
            (seen.has(span.fence) ? "another lease's too" : `not above ${before} granted earlier`),
        });
      }
      seen.add(span.fence);
    }
  }

  // Only a lease that excludes this one takes it over: another reader beside a reader does not,
  // and a semaphore's holders are counted by (a).
  const takenOverBetween = (own: LeaseSpan, to: number) =>
    byName.get(own.name)!.find((s) =>
      s.token !== own.token && s.start > own.start + slackMs && s.start < to - slackMs &&
      (own.mode === "exclusive" || (own.mode === "shared" && s.mode === "exclusive"))
    );
  // Tokens whose every acquire was a multi-name one that said busy.
  const busyMulti = new Set<string>();
  for (const op of history) {
    if (op.op === "acquire" && op.multi && op.outcome === "busy") busyMulti.add(op.token);
  }
  for (const op of history) {
    if (op.op === "renew" && op.outcome === "renewed") {
      const own = leaseAt(op.name, op.token, op.serverTime!);
      const other = own && takenOverBetween(own, op.serverTime!);
      if (!own || other) {
        violations.push({
          rule: "foreign_renew",
          name: op.name,
          detail:
            `renewed at ${op.serverTime} by ${op.client} while another lease began at ${other?.start}`,
        });
      }
    }
    if (op.op === "release" && op.outcome === "released") {
      // It answered for one of the token's leases granted before its reply: one that no other
      // lease took over before the token's first release that may have ended it.
      const leases = (leasesOf.get(key(op.name, op.token)) ?? []).filter((span) =>
        span.start <= op.completedAt + slackMs
      );
      const own = leases.at(-1);
      const others = leases.map((span) => takenOverBetween(span, firstRelease(span)));
      const other = others.every(Boolean) ? others.at(-1) : undefined;
      if (!own && busyMulti.has(op.token)) {
        violations.push({
          rule: "partial_grant",
          name: op.name,
          detail:
            `released by ${op.client}'s token ${op.token}, whose multi-name acquire said busy`,
        });
      } else if (!own || other) {
        violations.push({
          rule: "foreign_release",
          name: op.name,
          detail:
            `released at ${op.invokedAt} by ${op.client} after another lease began at ${other?.start}`,
        });
      }
    }
  }

  // (b) The resource never accepted a stale fence and lost no update.
  if (resource) {
    const newest = new Map<string, number>();
    for (const { name, fence } of resource.log) {
      if (fence < (newest.get(name) ?? 0)) {
        violations.push({
          rule: "stale_fence",
          name,
          detail: `accepted fence ${fence} after ${newest.get(name)}`,
        });
      }
      newest.set(name, Math.max(fence, newest.get(name) ?? 0));
    }
    for (const [name, { value, accepted }] of resource.totals()) {
      if (value !== accepted) {
        violations.push({
          rule: "lost_update",
          name,
          detail: `counter ${value} after ${accepted} increments`,
        });
      }
    }
  }
  return violations;
}

/** The rules the torture run can break on purpose, each of which the checker must catch. */
export const BROKEN_RULES = [
  "release",
  "shared",
  "limit",
  "multi",
  "fence",
  "reentry",
  "hold",
  "handoff",
  "handoff_all",
  "successor",
  "permits",
] as const;
/**
 * One of {@linkcode BROKEN_RULES}, or a rule whose break costs only liveness or order, which tests
 * catch by what a waiter misses: `bell`, a release that never grants readers nor rings their bell;
 * `head`, a release that hands the lock to the waiter after the head.
 */
export type BrokenRule = typeof BROKEN_RULES[number] | "bell" | "head";

// Each broken rule as a script run in place of the real one: its source with one check removed.
const BREAKS: Record<BrokenRule, [Script | Script[], string, string]> = {
  // A release with no token check: deletes whoever holds the lock.
  release: [RELEASE, RELEASE.source, "redis.call('DEL', KEYS[1]) return 1"],
  // Readers are granted beside a writer.
  shared: [ACQUIRE_SHARED, "if exclusive then free = 0 end", ""],
  // A semaphore forgets the permits it has given out.
  limit: [ACQUIRE_SHARED, "local free = capacity - used", "local free = capacity"],
  // A busy multi-name acquire still takes the names that were free.
  multi: [
    ACQUIRE_ALL,
    "local places, position, ticket = {}, -1, ''",
    `for i = 1, n do
  if not blocked[i] and not held[i] then
    writeHeld(lockKey(i), {fence = string.format('%.0f', nowUs), leaseEnd = nowMs + ttlMs,
      at = nowMs, hold = 20, flag = '0', token = token, meta = '', holds = newHolds(''),
      released = ''},
      nowMs, graceMs)
  end
end
local places, position, ticket = {}, -1, ''`,
  ],
  // Shared and semaphore leases reuse the last fence instead of a higher one.
  fence: [
    ACQUIRE_SHARED,
    "math.max(nowUs, ((r and tonumber(r.fence)) or 0) + 1)",
    "math.max((r and tonumber(r.fence)) or 0, 1)",
  ],
  // A holder's acquire again (a reentrant hold) sets the lease end to its own TTL, shortening it.
  reentry: [
    ACQUIRE,
    "r.leaseEnd = math.max(r.leaseEnd, nowMs + ttlMs)",
    "r.leaseEnd = nowMs + ttlMs",
  ],
  // A release of a hold that is gone (a retry) ends another hold instead.
  hold: [RELEASE, "if i then table.remove(holds.ids, i) end", "table.remove(holds.ids, i)"],
  // A release hands the name to the head of the queue while other holds of its lease remain.
  handoff: [
    RELEASE,
    "  writeHeld(lockKey, r, nowMs, graceMs)\n  return {1}",
    "  writeHeld(lockKey, r, nowMs, graceMs)\n  return freed(r)",
  ],
  // A multi-name waiter is handed its names though one is held.
  handoff_all: [
    HAND_OVER_ALL,
    "  if r and (r.foreign or (live and not mine[i])) then return -i end\n",
    "",
  ],
  // Every waiter behind a held lease blocks on its successor key, where one waiter at most may:
  // a grant pushed there for the head wakes another, which takes it for its own.
  successor: [
    [ACQUIRE, ACQUIRE_SHARED],
    "if held and not head and r.flag == '0' then",
    "if held then",
  ],
  // A release (or a hand-over) gives a semaphore's waiter its permits whether or not they fit.
  permits: [[RELEASE, HAND_OVER], "if used + permits > offer.limit then return nil end", ""],
  // A release (or a hand-over) hands the lock to the waiter after the head.
  head: [
    [RELEASE, HAND_OVER],
    "  local offers = offersOf(queue)\n",
    "  if queue[2] then head = table.remove(queue, 1) and queue[1] end\n  local offers = offersOf(queue)\n",
  ],
  bell: [
    [RELEASE, HAND_OVER],
    "if not live or (r.shared and r.limit == 0) then return grantReaders(r) end",
    "",
  ],
};

/** Runs the script of `rule` with its check removed, in place of the real one. */
export function withBroken<R extends RedisLike>(redis: R, rule: BrokenRule): R {
  const [scripts, find, replace] = BREAKS[rule];
  // A check some scripts share (a piece of each) is removed from every one of them.
  const broken = [scripts].flat().map((script) => {
    if (!script.source.includes(find)) throw new Error(`the ${rule} break no longer applies`);
    return { script, source: rule === "release" ? replace : script.source.replace(find, replace) };
  });
  return new Proxy(redis, {
    get(target, property, receiver) {
      if (property !== "evalsha") return Reflect.get(target, property, receiver);
      return async (sha: string, keys: string[], args: unknown[]) => {
        for (const { script, source } of broken) {
          if (sha === await script.sha1()) return target.eval(source, keys, args);
        }
        return target.evalsha(sha, keys, args);
      };
    },
  });
}
