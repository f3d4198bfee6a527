// A model of queue places at the level of the scripts: waiters look (taking a ticket), leave as
// the call that looked last (a place left, kept for the token; a copy of that leave, or any later
// one, changes nothing) or as a call another one looked after (the place stays), come back,
// acquire without waiting and release. After every step the
// queue holds exactly the model's waiters in the model's order, and the places left are exactly
// the model's: a place is taken back ahead of the waiters that came after it, and a grant that
// leaves no one waiting ends every place left.
import assert from "node:assert/strict";
import fc from "fast-check";
import { Locks } from "../src/core/locks.ts";
import { runScript } from "../src/core/_runner.ts";
import { LEAVE_QUEUE } from "../src/core/lua/leave_queue.ts";
import { keygen, keysOf, sharedBackend, takeTicket } from "./_backend.ts";

const backend = sharedBackend();
const TOKENS = 4;
const MAX_WAITERS = 3;

type Step =
  | { op: "look"; who: number } // a waiting call's look (a long ticket)
  | { op: "acquire"; who: number } // a call that does not wait
  | { op: "leave"; who: number } // the call that looked last gives up
  | { op: "staleLeave"; who: number } // a call that another call of its token looked after
  | { op: "release" };

const who = fc.nat(TOKENS - 1);
const steps = fc.array(
  fc.oneof(
    { weight: 5, arbitrary: fc.record({ op: fc.constant("look" as const), who }) },
    { weight: 2, arbitrary: fc.record({ op: fc.constant("acquire" as const), who }) },
    { weight: 3, arbitrary: fc.record({ op: fc.constant("leave" as const), who }) },
    { weight: 1, arbitrary: fc.record({ op: fc.constant("staleLeave" as const), who }) },
    { weight: 2, arbitrary: fc.record({ op: fc.constant("release" as const) }) },
  ),
  { minLength: 5, maxLength: 40 },
);

Deno.test("places left are taken back in arrival order, and end with a grant that leaves none waiting", async () => {
  const { redis } = await backend();
  const locks = new Locks(redis);
  let runs = 0;
  await fc.assert(
    fc.asyncProperty(steps, async (plan) => {
      runs++;
      const name = keygen("pm");
      const k = keysOf(name);
      const tokens = Array.from({ length: TOKENS }, (_, i) => `place-${runs}-${i}-0000000000`);
      // The model: the holder, and every place in arrival order, `left` when its waiter left.
      let holder: number | undefined;
      let places: { who: number; left: boolean }[] = [];
      const live = () => places.filter((p) => !p.left);
      const granted = (i: number) => {
        holder = i;
        places = places.filter((p) => p.who !== i);
        if (live().length === 0) places = [];
      };
      const leave = async (i: number, ticketEnd: string) => {
        const { keys, args } = LEAVE_QUEUE.call({
          keys: { ...k, wakeKey: k.wakeKey("") },
          args: { member: tokens[i]!, outcome: "", wakeId: "", ticketEnd, seenFence: 0, hold: "" },
        });
        return await runScript(redis, LEAVE_QUEUE, keys, args);
      };
      const log: string[] = [];
      for (const step of plan) {
        log.push(JSON.stringify(step));
        const where = () => `\n${log.join("\n")}`;
        if (step.op === "look" || step.op === "acquire") {
          const ticketMs = step.op === "look" ? 30_000 : 0;
          const reply = await takeTicket(redis, name, tokens[step.who]!, ticketMs, {
            maxWaiters: MAX_WAITERS,
            ttlMs: 30_000,
          });
          const head = live()[0];
          if (holder === step.who) {
            assert.equal(reply[0], 1, `the holder's look is its lease${where()}`);
          } else if (holder === undefined && (!head || head.who === step.who)) {
            assert.equal(reply[0], 1, `granted${where()}`);
            granted(step.who);
          } else {
            let expected = -1;
            const mine = places.find((p) => p.who === step.who);
            if (ticketMs > 0 && mine && !mine.left) expected = live().indexOf(mine);
            else if (ticketMs > 0 && live().length >= MAX_WAITERS) expected = -2;
            else if (ticketMs > 0 && mine) {
              mine.left = false;
              expected = live().indexOf(mine);
            } else if (ticketMs > 0) {
              places.push({ who: step.who, left: false });
              expected = live().length - 1;
            }
            assert.deepEqual([reply[0], reply[3]], [0, expected], `busy${where()}`);
          }
        } else if (step.op === "leave" || step.op === "staleLeave") {
          const ticket = Number(await redis.zscore(k.ticketsKey, tokens[step.who]!) ?? 0);
          const stale = step.op === "staleLeave";
          await leave(step.who, stale ? "1" : ticket > 0 ? String(ticket) : "");
          // A place left stays to its end, whatever leaves again.
          const mine = places.find((p) => p.who === step.who);
          if (mine && !stale) mine.left = true;
        } else if (holder !== undefined) {
          assert.equal(await locks.release({ name, token: tokens[holder]! }), true);
          holder = undefined;
        }
        const queue = await redis.zrange<string[]>(k.queueKey, 0, -1);
        assert.deepEqual(queue, live().map((p) => tokens[p.who]), `the queue${where()}`);
        const tickets = await redis.zrange<(string | number)[]>(k.ticketsKey, 0, -1, {
          withScores: true,
        });
        const left = [];
        for (let i = 0; i < tickets.length; i += 2) {
          if (Number(tickets[i + 1]) < 0) left.push(tickets[i]);
        }
        const expectedLeft = places.filter((p) => p.left).map((p) => tokens[p.who]);
        assert.deepEqual(left.sort(), expectedLeft.sort(), `the places left${where()}`);
      }
    }),
    { numRuns: 150 },
  );
});
