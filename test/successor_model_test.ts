// A model of blocking waiters at the level of the scripts, for the wake keys they block on (their
// own, or a lease's successor key): callers in pairs share a token (a retry beside a call, a
// duplicated request, two reentrant holds), a look may run again after its reply was lost, and
// releases name their grant's hint and their lease's successor key, as `Locks` does. After every
// step, every caller that believes it holds a live lease finds it on the server with its own hold
// counted, a semaphore of one permit has one holder at most, and every wake key has a TTL.
import assert from "node:assert/strict";
import fc from "fast-check";
import { runScript } from "../src/core/_runner.ts";
import type { Contract, ContractScript } from "../src/core/lua/_define.ts";
import { ACQUIRE } from "../src/core/lua/acquire.ts";
import { ACQUIRE_SHARED } from "../src/core/lua/acquire_shared.ts";
import { HAND_OVER } from "../src/core/lua/hand_over.ts";
import { LEAVE_QUEUE } from "../src/core/lua/leave_queue.ts";
import { RELEASE } from "../src/core/lua/release.ts";
import { keygen, keysOf, sharedBackend } from "./_backend.ts";

const backend = sharedBackend();
const GRACE = 60_000;
const CALLERS = 4; // two tokens, two callers each

type Step =
  | { op: "look"; caller: number; ticketMs: number; ttlMs: number }
  | { op: "again"; caller: number } // the caller's last look runs again; its reply is lost
  | { op: "pop"; caller: number }
  | { op: "release"; caller: number }
  | { op: "leave"; caller: number }
  | { op: "sleep"; ms: number };

const caller = fc.nat(CALLERS - 1);
const steps = fc.array(
  fc.oneof(
    {
      weight: 6,
      arbitrary: fc.record({
        op: fc.constant("look" as const),
        caller,
        ticketMs: fc.constantFrom(3_000, 400),
        ttlMs: fc.constantFrom(4_000, 1_500),
      }),
    },
    { weight: 2, arbitrary: fc.record({ op: fc.constant("again" as const), caller }) },
    { weight: 5, arbitrary: fc.record({ op: fc.constant("pop" as const), caller }) },
    { weight: 4, arbitrary: fc.record({ op: fc.constant("release" as const), caller }) },
    { weight: 1, arbitrary: fc.record({ op: fc.constant("leave" as const), caller }) },
    {
      weight: 1,
      arbitrary: fc.record({ op: fc.constant("sleep" as const), ms: fc.constantFrom(50, 300) }),
    },
  ),
  { minLength: 10, maxLength: 45 },
);

interface Caller {
  state: "idle" | "waiting" | "holding";
  token: string;
  hold: string; // every acquire is reentrant, with a hold id of its own
  wake: string; // the wake id it blocks on
  lookedAt: number;
  ticketEnd: string; // the end of the ticket its last look took, as its reply told it
  fence: string;
  hint: string;
  leaseEnd: number;
  last?: { ticketMs: number; ttlMs: number; wakeId: string };
}

for (const mode of ["an exclusive lock", "a semaphore of one permit"] as const) {
  Deno.test(`callers sharing tokens, looks run twice, ${mode}: every believed lease is held`, async () => {
    const { redis } = await backend();
    const run = async <C extends Contract>(
      script: ContractScript<C>,
      call: Parameters<ContractScript<C>["call"]>[0],
    ) => {
      const { keys, args } = script.call(call);
      return await runScript(redis, script, keys, args) as unknown[];
    };
    const serverNow = async () => {
      const [s, us] = await redis.time() as unknown as [string, string];
      return Number(s) * 1000 + Math.floor(Number(us) / 1000);
    };
    const semaphore = mode !== "an exclusive lock";
    let runs = 0;
    await fc.assert(
      fc.asyncProperty(steps, async (plan) => {
        runs++;
        const name = keygen("sm");
        const k = keysOf(name);
        const tokens = [`tokA${runs}x${crypto.randomUUID().slice(0, 8)}`, `tokB${runs}x00000000`];
        const callers: Caller[] = Array.from({ length: CALLERS }, (_, i) => ({
          state: "idle",
          token: tokens[i % 2]!,
          hold: "",
          wake: "",
          lookedAt: 0,
          ticketEnd: "",
          fence: "",
          hint: "",
          leaseEnd: 0,
        }));
        const member = (c: Caller) => semaphore ? `${c.token}~1` : c.token;
        const look = (c: Caller, o: NonNullable<Caller["last"]>) => {
          const common = {
            token: c.token,
            ttlMs: o.ttlMs,
            meta: "",
            graceMs: GRACE,
            ticketMs: o.ticketMs,
            maxWaiters: 128,
            fresh: false, // two callers share each token
            name,
            waitedMs: 0,
            waiting: true,
            hold: c.hold,
            wakeId: o.wakeId,
          };
          const { wakeKey: wake, readersKey: _, holdersKey, ...keys } = k;
          return semaphore
            ? run(ACQUIRE_SHARED, {
              keys: { ...keys, holdersKey, wakeKey: wake(o.wakeId) },
              args: { ...common, limit: 1, permits: 1 },
            })
            : run(ACQUIRE, { keys: { ...keys, wakeKey: wake(o.wakeId) }, args: common });
        };
        // The second step of a release that could not name the head's wake key.
        const handOver = async (head: string) => {
          for (let n = 0, next = head; n < 4 && next !== "" && !next.includes("|"); n++) {
            const { wakeKey: wake, ...keys } = k;
            const reply = await run(HAND_OVER, {
              keys,
              each: [{ hintKey: wake(next) }],
              args: { graceMs: GRACE, name, n: 1 },
              rest: [next],
            });
            next = typeof reply[1] === "string" ? reply[1] : "";
          }
        };
        const log: string[] = [];
        for (const [at, step] of plan.entries()) {
          if (step.op === "sleep") {
            await new Promise((resolve) => setTimeout(resolve, step.ms));
            continue;
          }
          const i = step.caller;
          const c = callers[i]!;
          if (step.op === "look" && c.state !== "holding") {
            if (c.state === "idle") {
              c.hold = `h${i}x${at}hold0000`;
              c.wake = `w${i}x${at}own`;
            }
            c.last = { ticketMs: step.ticketMs, ttlMs: step.ttlMs, wakeId: c.wake };
            const reply = await look(c, c.last);
            log.push(`${i} look ${c.hold} on ${c.wake}: ${JSON.stringify(reply)}`);
            if (reply[0] === 1) {
              c.state = "holding";
              c.fence = String(reply[1]);
              c.hint = String(reply[5] ?? "");
              c.leaseEnd = Number(reply[3]) + Number(reply[2]);
            } else if (reply[0] === 0) {
              c.state = Number(reply[3]) >= 0 ? "waiting" : "idle";
              c.lookedAt = Number(reply[2]);
              if (Number(reply[3]) >= 0) c.ticketEnd = String(reply[8] ?? "");
              if (typeof reply[7] === "string" && /^[\w-]{1,64}$/.test(reply[7])) c.wake = reply[7];
            } else {
              c.state = "idle";
            }
          } else if (step.op === "again" && c.state === "waiting" && c.last) {
            log.push(`${i} look again: ${JSON.stringify(await look(c, c.last))}`);
          } else if (step.op === "pop" && c.state === "waiting") {
            const message = await redis.lpop<string>(k.wakeKey(c.wake));
            const grant = /^(\d+):(\d+):(\d+):(.*)$/.exec(String(message));
            log.push(`${i} pop ${c.wake}: ${message}`);
            // A waiter refuses a grant made before its last look (see `waitFor`).
            if (grant && Number(grant[3]) >= c.lookedAt) {
              c.state = "holding";
              c.fence = grant[1]!;
              c.hint = grant[4]!;
              c.leaseEnd = Number(grant[2]);
            }
          } else if (step.op === "release" && c.state === "holding") {
            const hints = [
              ...(c.hint === "" || c.hint.includes("|") ? [] : c.hint.split(",")),
              `f${c.fence}`,
            ];
            const { wakeKey: wake, ...keys } = k;
            const reply = await run(RELEASE, {
              keys,
              each: hints.map((id) => ({ hintKey: wake(id) })),
              args: {
                token: c.token,
                graceMs: GRACE,
                fence: c.fence,
                name,
                hold: c.hold,
                n: hints.length,
              },
              rest: hints,
            });
            log.push(`${i} release ${c.fence}/${c.hold}: ${JSON.stringify(reply)}`);
            c.state = "idle";
            if (typeof reply[1] === "string" && reply[1] !== "") await handOver(reply[1]);
          } else if (step.op === "leave" && c.state === "waiting") {
            const reply = await run(LEAVE_QUEUE, {
              keys: {
                queueKey: k.queueKey,
                ticketsKey: k.ticketsKey,
                offersKey: k.offersKey,
                lockKey: k.lockKey,
                wakeKey: k.wakeKey(c.wake),
                holdersKey: k.holdersKey,
              },
              args: {
                member: member(c),
                outcome: "",
                wakeId: c.wake,
                ticketEnd: c.ticketEnd,
                seenFence: 0, // a reader's only
                hold: c.hold,
              },
            });
            log.push(`${i} leave ${c.wake}: ${JSON.stringify(reply)}`);
            const handed = Array.isArray(reply) && reply[0] === 2;
            c.state = handed ? "holding" : "idle";
            if (handed) {
              [c.fence, c.hint, c.leaseEnd] = [
                String(reply[1]),
                "",
                Number(reply[3]) + Number(reply[2]),
              ];
            }
          } else {
            continue;
          }
          const now = await serverNow();
          const record = String(await redis.get(k.lockKey) ?? "");
          let permits = 0;
          for (const [j, x] of callers.entries()) {
            if (x.state !== "holding" || x.leaseEnd <= now + 30) continue;
            let held: { token?: string; fence?: string; holds: string };
            if (semaphore) {
              const entry = String(await redis.hget(k.holdersKey, x.token) ?? "").split("|");
              held = Number(entry[0]) > now
                ? { token: x.token, fence: entry[1], holds: entry[3] ?? "" }
                : { holds: "" };
            } else {
              const m = /^X(\d+)\|-?\d+\|-?\d+\|\d+\|[01]\|([\w-]+)\|[\d:a-f]*\|([\w,-]*)\|/.exec(
                record,
              );
              held = m ? { fence: m[1], token: m[2], holds: m[3]! } : { holds: "" };
            }
            const counted = held.holds.split(",").slice(1).includes(x.hold);
            assert.ok(
              held.token === x.token && held.fence === x.fence && counted,
              `caller ${j} believes it holds ${x.fence}/${x.hold}; the server: ${
                JSON.stringify(held)
              }\n${log.join("\n")}`,
            );
          }
          if (semaphore) {
            const holders = await redis.hgetall<Record<string, string>>(k.holdersKey) ?? {};
            for (const entry of Object.values(holders)) {
              if (Number(String(entry).split("|")[0]) > now + 30) permits++;
            }
            assert.ok(permits <= 1, `${permits} permits held of 1\n${log.join("\n")}`);
          }
          for (const key of await redis.keys(`${k.lockKey}:wake:*`)) {
            assert.ok(await redis.pttl(key) > 0, `${key} has no TTL\n${log.join("\n")}`);
          }
        }
      }),
      { numRuns: Number(Deno.env.get("SUCCESSOR_RUNS") ?? 100) },
    );
  });
}
