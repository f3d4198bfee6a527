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
import { RELEASE } from "../src/core/scripts.ts";

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
  };

/** A violation the checker found. */
export interface Violation {
  rule:
    | "overlap"
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
}

/** Checks a history (and optionally the resource it guarded) for the lock's guarantees. */
export function check(
  history: readonly Operation[],
  { resource, slackMs = 5 }: { resource?: FencedResource; slackMs?: number } = {},
): Violation[] {
  const violations: Violation[] = [];
  const spans = new Map<string, LeaseSpan>(); // by name + token
  const key = (name: string, token: string) => `${name}\u0000${token}`;

  for (const op of history) {
    if (op.op === "acquire" && op.outcome === "acquired") {
      const span = spans.get(key(op.name, op.token));
      if (span) span.end = Math.max(span.end, op.expiresAt!);
      else {
        spans.set(key(op.name, op.token), {
          name: op.name,
          token: op.token,
          start: op.serverTime!,
          end: op.expiresAt!,
        });
      }
    }
  }
  for (const op of history) {
    if (op.op === "renew" && op.outcome === "renewed") {
      const span = spans.get(key(op.name, op.token));
      if (span) span.end = Math.max(span.end, op.expiresAt!);
    }
  }
  // A release may have taken effect as early as the first attempt's invocation, whatever its
  // reply said: the reply may be lost, or be that of a duplicate or retry.
  const firstRelease = new Map<string, number>();
  for (const op of history) {
    if (op.op === "release") {
      const k = key(op.name, op.token);
      firstRelease.set(k, Math.min(firstRelease.get(k) ?? Infinity, op.invokedAt));
      const span = spans.get(k);
      if (span) span.end = Math.min(span.end, Math.max(span.start, op.invokedAt));
    }
  }

  const byName = new Map<string, LeaseSpan[]>();
  for (const span of spans.values()) {
    if (!byName.has(span.name)) byName.set(span.name, []);
    byName.get(span.name)!.push(span);
  }

  // (a) No two acquired leases of one name overlap in their validity intervals.
  for (const [name, list] of byName) {
    list.sort((a, b) => a.start - b.start);
    let latest: LeaseSpan | undefined;
    for (const span of list) {
      if (latest && span.start < latest.end - slackMs) {
        violations.push({
          rule: "overlap",
          name,
          detail: `lease ${span.token} from ${span.start} began ${latest.end - span.start} ms ` +
            `before the lease ${latest.token} [${latest.start}, ${latest.end}] ended`,
        });
      }
      if (!latest || span.end > latest.end) latest = span;
    }
  }

  // (c) Every renewed and released answer belonged to the current holder.
  const takenOverBetween = (name: string, token: string, from: number, to: number) =>
    (byName.get(name) ?? []).find((s) =>
      s.token !== token && s.start > from + slackMs && s.start < to - slackMs
    );
  for (const op of history) {
    if (op.op === "renew" && op.outcome === "renewed") {
      const own = spans.get(key(op.name, op.token));
      const other = own && takenOverBetween(op.name, op.token, own.start, op.serverTime!);
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
      const own = spans.get(key(op.name, op.token));
      const from = firstRelease.get(key(op.name, op.token))!;
      const other = own && takenOverBetween(op.name, op.token, own.start, from);
      if (!own || other) {
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

/**
 * A client whose release script deletes the lock without checking the token: the broken variant
 * that the torture checker and the model-based test must each catch.
 */
export function withBrokenRelease<R extends RedisLike>(redis: R): R {
  return new Proxy(redis, {
    get(target, property, receiver) {
      if (property !== "evalsha") return Reflect.get(target, property, receiver);
      return async (sha: string, keys: string[], args: unknown[]) =>
        sha === await RELEASE.sha1()
          ? target.eval("redis.call('DEL', KEYS[1]) return 1", keys, args)
          : target.evalsha(sha, keys, args);
    },
  });
}
