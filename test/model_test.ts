// Model-based test of the lease rules: random command sequences run against the library on a
// real redis-server whose clock the test moves (forward, and back), and against a small
// reference model of the rules the README states. Any difference fails, and fast-check shrinks
// it to a short sequence. A variant with one rule broken (release without the token check) must
// fail, so the test is known to bite.
//
// Runs: MODEL_RUNS (default 200 in the suite; `MODEL_RUNS=3000 deno test -A test/model_test.ts`).
import assert from "node:assert/strict";
import fc from "fast-check";
import { Locks } from "../src/core/locks.ts";
import type { Lease } from "../src/core/types.ts";
import type { RedisLike } from "../src/core/_runner.ts";
import { MIN_RETRY_MS } from "../src/core/scripts.ts";
import { withBrokenRelease } from "../dev/history.ts";
import { type ShiftedRedisServer, startShiftedRedisServer } from "../dev/clock_shift.ts";
import { type Backend, keygen, lockKeys, startBackend, takeTicket } from "./_backend.ts";

const RUNS = Number(Deno.env.get("MODEL_RUNS") ?? 200);
const MAX_WAITERS = 2; // two clients, so a full queue happens often
// Deadlines this close to "now" are ambiguous (the clock moves while a request is in flight):
// the runner moves the server clock past them first. Larger than a wait (60 ms) plus latency.
const MARGIN_MS = 400;
const LONGEST_LEASE_MS = 300_000; // what a lock found without a TTL gets

type Cmd =
  | { kind: "acquire"; who: number; ttlMs: number }
  | { kind: "wait"; who: number; ttlMs: number }
  | { kind: "vanish"; who: number; ticketMs: number }
  | { kind: "renew"; who: number; ttlMs: number }
  | { kind: "release"; who: number; withFence: boolean }
  | { kind: "inspect" }
  | { kind: "advance"; ms: number }
  | { kind: "stepBack"; ms: number }
  | { kind: "persist" }
  | { kind: "loseFloor" };

const who = fc.integer({ min: 0, max: 2 }); // the third only ever finds the queue full
const ttlMs = fc.constantFrom(1000, 3000, 20_000);
const command: fc.Arbitrary<Cmd> = fc.oneof(
  { weight: 4, arbitrary: fc.record({ kind: fc.constant("acquire" as const), who, ttlMs }) },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant("wait" as const), who, ttlMs }) },
  {
    weight: 2,
    arbitrary: fc.record({
      kind: fc.constant("vanish" as const),
      who,
      ticketMs: fc.constantFrom(1000, 5000),
    }),
  },
  { weight: 3, arbitrary: fc.record({ kind: fc.constant("renew" as const), who, ttlMs }) },
  {
    weight: 3,
    arbitrary: fc.record({ kind: fc.constant("release" as const), who, withFence: fc.boolean() }),
  },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant("inspect" as const) }) },
  {
    weight: 3,
    arbitrary: fc.record({
      kind: fc.constant("advance" as const),
      ms: fc.integer({ min: 100, max: 25_000 }),
    }),
  },
  {
    weight: 2,
    arbitrary: fc.record({
      kind: fc.constant("stepBack" as const),
      ms: fc.integer({ min: 100, max: 60_000 }),
    }),
  },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant("persist" as const) }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant("loseFloor" as const) }) },
);

/** The rules, as the README states them, for one lock name. Times are server-clock ms. */
class Model {
  holder?: { token: string; fence: number; expiresAt: number | null }; // null: no TTL
  floorFence?: number; // the fence floor's `fence`, while the floor hash holds it
  marker?: string; // `token:fence` of the last release
  queue: { token: string; deadline: number }[] = []; // live tickets in arrival order
  lastFence = new Map<string, number>(); // what each client knows of its last lease
  maxFence = 0;
  horizon = -Infinity; // the latest deadline that has passed: the clock never steps back before it

  /** Drops what ran out by `now`; remembers how far, so a step back cannot revive it. */
  expire(now: number) {
    const passed = (deadline: number) => {
      this.horizon = Math.max(this.horizon, deadline);
      return false;
    };
    if (this.holder?.expiresAt != null && this.holder.expiresAt <= now) {
      passed(this.holder.expiresAt);
      this.holder = undefined;
    }
    this.queue = this.queue.filter((t) => t.deadline > now || passed(t.deadline));
  }

  deadlines(): number[] {
    const all = this.queue.map((t) => t.deadline);
    if (this.holder?.expiresAt != null) all.push(this.holder.expiresAt);
    return all;
  }
}

interface Ctx {
  server: ShiftedRedisServer;
  backend: Backend;
  locks: Locks;
  redis: RedisLike;
  offsetMs: number;
}

const now = (ctx: Ctx) => Date.now() + ctx.offsetMs;

async function shiftTo(ctx: Ctx, offsetMs: number) {
  ctx.offsetMs = offsetMs;
  await ctx.server.shift(offsetMs);
}

// Moves the clock forward past any deadline within MARGIN_MS of now, so no outcome is a race.
async function clearBoundaries(ctx: Ctx, model: Model) {
  for (;;) {
    model.expire(now(ctx));
    const t = now(ctx);
    const near = model.deadlines().filter((d) => Math.abs(d - t) < MARGIN_MS);
    if (near.length === 0) return;
    await shiftTo(ctx, ctx.offsetMs + Math.max(...near) - t + MARGIN_MS);
  }
}

/** Runs `cmds` on a fresh name and checks every reply against the model. */
async function runSequence(ctx: Ctx, cmds: Cmd[]) {
  const model = new Model();
  const name = keygen("m");
  const tokens = [0, 1, 2].map((i) => `model-token-${i}-${name.slice(-12)}`);
  const keys = lockKeys(name);
  const seen: string[] = [];
  const fail = (message: string) => {
    throw new Error(`${message}\nafter: ${seen.join(" → ")}`);
  };

  // What an acquire-like call should do, by the rules. Returns the expected outcome.
  const decide = (token: string, ttl: number, ticketMs: number, t: number) => {
    const holder = model.holder;
    if (holder?.token === token) {
      holder.expiresAt = t + ttl;
      model.floorFence ??= holder.fence;
      return { acquired: true as const, fence: holder.fence };
    }
    const head = model.queue[0];
    if (!holder && (!head || head.token === token)) {
      model.queue = model.queue.filter((q) => q.token !== token);
      return { acquired: true as const };
    }
    if (holder?.expiresAt === null) holder.expiresAt = t + LONGEST_LEASE_MS; // repaired
    let position = -1;
    if (ticketMs > 0) {
      const mine = model.queue.findIndex((q) => q.token === token);
      if (mine >= 0) {
        model.queue[mine]!.deadline = t + ticketMs;
        position = mine;
      } else if (model.queue.length >= MAX_WAITERS) {
        position = -2;
      } else {
        model.queue.push({ token, deadline: t + ticketMs });
        position = model.queue.length - 1;
      }
    }
    return { acquired: false as const, position };
  };

  const granted = (token: string, ttl: number, lease: Lease, expectedFence?: number) => {
    const t = now(ctx);
    if (Math.abs(lease.serverTime - t) > MARGIN_MS) fail(`serverTime ${lease.serverTime} vs ${t}`);
    if (expectedFence !== undefined) {
      if (lease.fence !== expectedFence) {
        fail(`a retry got fence ${lease.fence}, not ${expectedFence}`);
      }
      return;
    }
    // A new fence is above every earlier one while the floor lives, or while the clock is ahead.
    const guaranteed = model.floorFence !== undefined || t * 1000 > model.maxFence;
    if (guaranteed && lease.fence <= model.maxFence) {
      fail(`fence ${lease.fence} is not above ${model.maxFence}`);
    }
    model.holder = { token, fence: lease.fence, expiresAt: t + ttl };
    model.floorFence = lease.fence;
    // Lost floor and a clock behind the last fence: the README's stated exception. The chain of
    // strictly increasing fences starts again from this one.
    model.maxFence = guaranteed ? Math.max(model.maxFence, lease.fence) : lease.fence;
    model.lastFence.set(token, lease.fence);
  };

  const checkHint = (retryAfterMs: number, t: number) => {
    if (!(retryAfterMs >= MIN_RETRY_MS)) fail(`retryAfterMs ${retryAfterMs} under the floor`);
    const bound = model.holder
      ? (model.holder.expiresAt ?? t + LONGEST_LEASE_MS) - t
      : (model.queue[0]?.deadline ?? t + 1000) - t;
    if (retryAfterMs > bound + MARGIN_MS) fail(`retryAfterMs ${retryAfterMs} past ${bound}`);
  };

  for (const cmd of cmds) {
    seen.push(JSON.stringify(cmd));
    await clearBoundaries(ctx, model);
    const t = now(ctx);
    switch (cmd.kind) {
      case "acquire":
      case "wait": {
        const token = tokens[cmd.who]!;
        const ticketMs = cmd.kind === "wait" ? 310 : 0; // what Locks asks for a 60 ms wait
        const expected = decide(token, cmd.ttlMs, ticketMs, t);
        const result = await ctx.locks.acquire(name, {
          token,
          ttlMs: cmd.ttlMs,
          ...(cmd.kind === "wait" && { waitMs: 60 }),
        });
        if (result.acquired !== expected.acquired) {
          fail(`acquire: ${result.acquired}, the model says ${expected.acquired}`);
        }
        if (result.acquired) granted(token, cmd.ttlMs, result.lease, expected.fence);
        else {
          if (cmd.kind === "wait") model.queue = model.queue.filter((q) => q.token !== token);
          const reason = !expected.acquired && expected.position === -2 ? "queue_full" : "busy";
          if (result.reason !== reason) fail(`reason ${result.reason}, the model says ${reason}`);
          checkHint(result.retryAfterMs, t);
        }
        break;
      }
      case "vanish": { // a waiter takes a ticket and is never heard of again
        const token = tokens[cmd.who]!;
        const expected = decide(token, 1000, cmd.ticketMs, t);
        const reply = await takeTicket(ctx.redis, name, token, cmd.ticketMs, {
          maxWaiters: MAX_WAITERS,
        });
        if ((reply[0] === 1) !== expected.acquired) {
          fail(`vanish: ${reply}, model ${expected.acquired}`);
        }
        if (expected.acquired) {
          const [, fence, ttl, serverTime] = reply as [number, number, number, number];
          const lease = { name, token, fence, ttlMs: ttl, serverTime, expiresAt: serverTime + ttl };
          granted(token, 1000, lease, expected.fence);
        } else {
          if (reply[3] !== expected.position) {
            fail(`position ${reply[3]}, model ${expected.position}`);
          }
          checkHint(reply[1]!, t);
        }
        break;
      }
      case "renew": {
        const token = tokens[cmd.who]!;
        const result = await ctx.locks.renew({ name, token }, { ttlMs: cmd.ttlMs });
        const holds = model.holder?.token === token;
        if (result.renewed !== holds) fail(`renew: ${result.renewed}, the model says ${holds}`);
        if (result.renewed) {
          if (result.lease.fence !== model.holder!.fence) fail("renew changed the fence");
          model.holder!.expiresAt = t + cmd.ttlMs;
          model.floorFence ??= model.holder!.fence;
        }
        break;
      }
      case "release": {
        const token = tokens[cmd.who]!;
        const fence = cmd.withFence ? model.lastFence.get(token) : undefined;
        const released = await ctx.locks.release({ name, token, ...(fence && { fence }) });
        let expected: boolean;
        const holder = model.holder;
        if (holder?.token === token && (fence === undefined || fence === holder.fence)) {
          expected = true;
          model.holder = undefined;
          model.floorFence = holder.fence;
          model.marker = `${token}:${holder.fence}`;
        } else {
          const which = fence ?? model.floorFence;
          expected = which !== undefined && model.marker === `${token}:${which}`;
        }
        if (released !== expected) fail(`release: ${released}, the model says ${expected}`);
        break;
      }
      case "inspect": {
        const info = await ctx.locks.inspect(name);
        const holder = model.holder;
        if (info.held !== (holder !== undefined)) fail(`inspect held ${info.held}`);
        if (info.held && holder) {
          if (holder.expiresAt === null) holder.expiresAt = t + LONGEST_LEASE_MS;
          if (info.fence !== holder.fence) fail(`inspect fence ${info.fence} vs ${holder.fence}`);
          const left = holder.expiresAt - t;
          if (info.ttlMs > left + MARGIN_MS || info.ttlMs < left - MARGIN_MS) {
            fail(`inspect ttlMs ${info.ttlMs}, the model says ${left}`);
          }
        }
        break;
      }
      case "advance":
        await shiftTo(ctx, ctx.offsetMs + cmd.ms);
        break;
      case "stepBack": { // never before a deadline that has passed: that state is gone for good
        const back = Math.min(cmd.ms, t - model.horizon - MARGIN_MS);
        if (back > 0) await shiftTo(ctx, ctx.offsetMs - back);
        break;
      }
      case "persist":
        // The record loses its TTL: the lease still ends at its own end (the record says when),
        // and the next write gives the record its TTL back.
        await ctx.backend.redis.persist(keys[0]!);
        break;
      case "loseFloor":
        // A released (or expired) record is lost: its fence floor and release marker with it.
        if (!model.holder) {
          await ctx.backend.redis.del(keys[0]!);
          model.floorFence = undefined;
          model.marker = undefined;
        }
        break;
    }
  }
}

Deno.test("the library follows the lease rules of a reference model", async (t) => {
  const server = await startShiftedRedisServer();
  const backend = await startBackend([], server);
  const make = (redis: RedisLike): Ctx => ({
    server,
    backend,
    redis,
    locks: new Locks(redis, { maxWaiters: MAX_WAITERS }),
    offsetMs: 0,
  });

  try {
    await t.step(`${RUNS} random command sequences find no difference`, async () => {
      const ctx = make(backend.redis);
      await fc.assert(
        fc.asyncProperty(fc.array(command, { minLength: 1, maxLength: 40 }), async (cmds) => {
          await shiftTo(ctx, 0);
          await runSequence(ctx, cmds);
        }),
        { numRuns: RUNS },
      );
    });

    await t.step("with release's token check removed, the model finds the difference", async () => {
      const ctx = make(withBrokenRelease(backend.redis));
      const result = await fc.check(
        fc.asyncProperty(fc.array(command, { minLength: 1, maxLength: 40 }), async (cmds) => {
          await shiftTo(ctx, 0);
          await runSequence(ctx, cmds);
        }),
        { numRuns: RUNS },
      );
      assert.ok(result.failed, "the broken release went unnoticed");
      assert.match(String(result.errorInstance), /release: true, the model says false/);
    });
  } finally {
    await server.shift(0);
    await backend.stop();
  }
});
