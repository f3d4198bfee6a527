// A model of blocking waiters at the level of the scripts, for the wake keys they block on (their
// own, or a lease's successor key): callers in pairs share a token (a retry beside a call, a
// duplicated request, two reentrant holds), a look may run again after its reply was lost, and
// releases name their grant's hint and their lease's successor key, as `Locks` does. After every
// step, every caller that believes it holds a live lease finds it on the server with its own hold
// counted, a semaphore of one permit has one holder at most, and every wake key has a TTL.
//
// The third model puts readers and writers on one name, each caller in its mode, as `Locks` and
// `waitFor` drive them: a reader blocks on its own wake key and the readers' bell (a grant there
// is its lease; a ring that says more may fit, or a grant made before its look, sends it to look
// again; another ring, to listen on), or polls (no offer, so a ring stops at it and says more may
// fit); a reader that leaves sends the name's last fence its last look saw, and its hold; a
// waiter that times out hands the name over as it leaves. Beside the checks above: never an
// exclusive lease lives beside a shared one (every live holder's lease ends within the record's
// shared lease), a reader that leaves without a lease leaves none behind that counts its hold,
// and the bell has a TTL too.
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

type Step =
  | { op: "look"; caller: number; ticketMs: number; ttlMs: number }
  | { op: "again"; caller: number } // the caller's last look runs again; its reply is lost
  | { op: "pop"; caller: number } // a writer pops its wake key; a reader hears what came
  | { op: "release"; caller: number }
  | { op: "leave"; caller: number }
  | { op: "sleep"; ms: number };

// Times, ms: the tickets and TTLs a look asks for, and the sleeps between steps; and how often
// each step comes, by weight.
interface Mix {
  ticket: [number, number];
  ttl: [number, number];
  sleep: [number, number];
  weights: Record<Step["op"], number>;
}

const stepsOf = (
  callers: number,
  maxLength: number,
  { ticket, ttl, sleep, weights }: Mix,
  size?: fc.SizeForArbitrary,
): fc.Arbitrary<Step[]> => {
  const caller = fc.nat(callers - 1);
  const op = <O extends Step["op"]>(name: O) => ({ op: fc.constant(name), caller });
  return fc.array(
    fc.oneof(
      {
        weight: weights.look,
        arbitrary: fc.record({
          ...op("look"),
          ticketMs: fc.constantFrom(...ticket),
          ttlMs: fc.constantFrom(...ttl),
        }),
      },
      { weight: weights.again, arbitrary: fc.record(op("again")) },
      { weight: weights.pop, arbitrary: fc.record(op("pop")) },
      { weight: weights.release, arbitrary: fc.record(op("release")) },
      { weight: weights.leave, arbitrary: fc.record(op("leave")) },
      {
        weight: weights.sleep,
        arbitrary: fc.record({ op: fc.constant("sleep" as const), ms: fc.constantFrom(...sleep) }),
      },
    ),
    { minLength: 10, maxLength, ...size && { size } },
  );
};

type Kind = "exclusive" | "semaphore" | "shared";
type Mode = "exclusive" | "shared" | "polls"; // a reader's or a writer's, in the third model
const MODE: fc.Arbitrary<Mode> = fc.oneof(
  { weight: 2, arbitrary: fc.constant("exclusive" as const) },
  { weight: 2, arbitrary: fc.constant("shared" as const) },
  { weight: 1, arbitrary: fc.constant("polls" as const) },
);

interface Caller {
  kind: Kind;
  polls: boolean; // a reader that looks without a wake id, and leaves with its own
  state: "idle" | "waiting" | "holding";
  token: string;
  hold: string; // every acquire is reentrant, with a hold id of its own
  wake: string; // the wake id it blocks on
  lookedAt: number;
  ticketEnd: string; // the end of the ticket its last look took, as its reply told it
  seenFence: number; // a reader's: the name's last fence at its last look (reply[10])
  bell: string; // a reader's: the bell's ring it listens from (its last look's, then the last heard)
  fence: string;
  hint: string;
  leaseEnd: number;
  last?: { ticketMs: number; ttlMs: number; wakeId: string };
}

const MIX: Mix = {
  ticket: [3_000, 400],
  ttl: [4_000, 1_500],
  sleep: [50, 300],
  weights: { look: 6, again: 2, pop: 5, release: 4, leave: 1, sleep: 1 },
};
const VARIANTS = [
  { mode: "an exclusive lock", callers: 4, maxLength: 45, runs: 100, mix: MIX },
  { mode: "a semaphore of one permit", callers: 4, maxLength: 45, runs: 100, mix: MIX },
  {
    mode: "readers and writers (readers woken on their wake key or by the bell, or polling; " +
      "leaving with the fence they saw and their hold; a timeout hands over)",
    callers: 6, // three tokens, two callers each, each caller a reader or a writer
    // Long runs (a step its caller's state has no use for costs nothing), few sleeps (they cost
    // the time), short tickets and leases (so that some lapse within them).
    maxLength: 200,
    runs: 120, // every deliberate break helper-72 made was caught within 93 runs
    mix: {
      ticket: [3_000, 300],
      ttl: [4_000, 250],
      sleep: [30, 200],
      weights: { look: 24, again: 8, pop: 24, release: 16, leave: 8, sleep: 1 },
    } as Mix,
  },
] as const;

for (const variant of VARIANTS) {
  const { mode, callers: CALLERS } = variant;
  const readers = mode.startsWith("readers");
  const semaphore = mode === "a semaphore of one permit";
  const plans = readers
    ? fc.record({
      // Readers and writers both, mostly a mode per token (its two callers alike), at times
      // one per caller; some readers poll (no wake key, as without blocking commands).
      modes: fc.oneof(
        { weight: 3, arbitrary: fc.array(MODE, { minLength: 3, maxLength: 3 }) },
        { weight: 1, arbitrary: fc.array(MODE, { minLength: CALLERS, maxLength: CALLERS }) },
      ).map((modes) => modes.length === CALLERS ? modes : [...modes, ...modes])
        .filter((modes) => modes.includes("exclusive") && modes.some((m) => m !== "exclusive")),
      steps: stepsOf(CALLERS, variant.maxLength, variant.mix, "max"),
    })
    : stepsOf(CALLERS, variant.maxLength, variant.mix).map((steps) => ({
      modes: Array.from({ length: CALLERS }, () => "exclusive" as Mode),
      steps,
    }));
  const sentence = readers
    ? "every believed lease is held, never shared beside exclusive, no reader's lease left behind"
    : "every believed lease is held";
  Deno.test(`callers sharing tokens, looks run twice, ${mode}: ${sentence}`, async () => {
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
    let runs = 0;
    await fc.assert(
      fc.asyncProperty(plans, async ({ modes, steps: plan }) => {
        runs++;
        const name = keygen("sm");
        const k = keysOf(name);
        const tokens = [
          `tokA${runs}x${crypto.randomUUID().slice(0, 8)}`,
          `tokB${runs}x00000000`,
          `tokC${runs}x${crypto.randomUUID().slice(0, 8)}`,
        ].slice(0, CALLERS / 2);
        const callers: Caller[] = Array.from({ length: CALLERS }, (_, i) => ({
          kind: semaphore ? "semaphore" : modes[i] === "exclusive" ? "exclusive" : "shared",
          polls: modes[i] === "polls",
          state: "idle",
          token: tokens[i % tokens.length]!,
          hold: "",
          wake: "",
          lookedAt: 0,
          ticketEnd: "",
          seenFence: 0,
          bell: "",
          fence: "",
          hint: "",
          leaseEnd: 0,
        }));
        const member = (c: Caller) =>
          c.kind === "semaphore" ? `${c.token}~1` : c.kind === "shared" ? `${c.token}~s` : c.token;
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
          const { wakeKey: wake, readersKey, holdersKey, ...keys } = k;
          switch (c.kind) {
            case "semaphore":
              return run(ACQUIRE_SHARED, {
                keys: { ...keys, holdersKey, wakeKey: wake(o.wakeId) },
                args: { ...common, limit: 1, permits: 1 },
              });
            case "shared": // as `Locks` sends it for mode "shared": with the readers' bell
              return run(ACQUIRE_SHARED, {
                keys: { ...keys, holdersKey, readersKey, wakeKey: wake(o.wakeId || c.wake) },
                args: { ...common, limit: 0, permits: 1 },
              });
            default:
              return run(ACQUIRE, { keys: { ...keys, wakeKey: wake(o.wakeId) }, args: common });
          }
        };
        // The second step of a release that could not name the head's wake key; with `head` ''
        // (a waiter that timed out), a first step that names no wake key, as `handOver` does.
        const handOver = async (head: string) => {
          for (let n = 0, next = head; n < 4 && (n === 0 || next !== ""); n++) {
            if (next.includes("|")) break;
            const { wakeKey: wake, ...keys } = k;
            const hints = next === "" ? [] : [next];
            const reply = await run(HAND_OVER, {
              keys,
              each: hints.map((id) => ({ hintKey: wake(id) })),
              args: { graceMs: GRACE, name, n: hints.length },
              rest: hints,
            });
            next = typeof reply[1] === "string" ? reply[1] : "";
          }
        };
        const log: string[] = [];
        // A look, as the caller's wait makes it.
        const looked = async (i: number, c: Caller, at: number | string) => {
          const reply = await look(c, c.last!);
          log.push(`${i} look ${c.hold} on ${c.wake} (${at}): ${JSON.stringify(reply)}`);
          if (reply[0] === 1) {
            c.state = "holding";
            c.fence = String(reply[1]);
            c.hint = String(reply[5] ?? "");
            c.leaseEnd = Number(reply[3]) + Number(reply[2]);
          } else if (reply[0] === 0) {
            c.state = Number(reply[3]) >= 0 ? "waiting" : "idle";
            c.lookedAt = Number(reply[2]);
            if (Number(reply[3]) >= 0) c.ticketEnd = String(reply[8] ?? "");
            if (c.kind === "shared") {
              // `waitFor`: the fence of every busy reply; the bell from the look's last ring
              const seen = reply[9];
              c.seenFence = Number.isSafeInteger(seen) && Number(seen) >= 0 ? Number(seen) : 0;
              c.bell = typeof reply[6] === "string" ? reply[6] : "";
            } else if (typeof reply[7] === "string" && /^[\w-]{1,64}$/.test(reply[7])) {
              c.wake = reply[7];
            }
          } else {
            // A mismatch: `waitFor` leaves the queue (`leave("")`, a look took a ticket), then
            // throws; a lease the leave finds is left to its TTL.
            if (readers) await leave(i, c, "");
            c.state = "idle";
          }
        };
        // The leave of `waitFor`: a reader's with its seen fence and hold; a timeout hands over.
        const leave = async (i: number, c: Caller, outcome: string) => {
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
              outcome,
              wakeId: c.wake,
              ticketEnd: c.ticketEnd,
              seenFence: readers ? c.seenFence : 0, // a reader's only
              hold: !readers || c.kind === "shared" ? c.hold : "",
            },
          });
          log.push(`${i} leave ${c.wake} (${c.seenFence}): ${JSON.stringify(reply)}`);
          const kept = Array.isArray(reply) && reply[0] === 2 ? reply : undefined;
          if (!kept && c.kind === "shared") {
            // A reader that leaves leaves no lease behind that counts its hold (see waiting.md).
            const entry = String(await redis.hget(k.holdersKey, c.token) ?? "").split("|");
            const live = Number(entry[0]) > await serverNow() + 30;
            assert.ok(
              !live || !(entry[3] ?? "").split(",").slice(1).includes(c.hold),
              `caller ${i} left, its hold ${c.hold} held: ${entry.join("|")}\n${log.join("\n")}`,
            );
          }
          if (readers && outcome === "timeout") await handOver("");
          return kept;
        };

        for (const [at, step] of plan.entries()) {
          if (step.op === "sleep") {
            await new Promise((resolve) => setTimeout(resolve, step.ms));
            continue;
          }
          const i = step.caller;
          const c = callers[i]!;
          if (step.op === "look" && c.state !== "holding") {
            if (c.state === "idle") {
              // a new wait: what `waitFor` knows starts anew
              [c.hold, c.wake] = [`h${i}x${at}hold0000`, `w${i}x${at}own`];
              [c.ticketEnd, c.seenFence, c.bell] = ["", 0, ""];
            }
            c.last = { ticketMs: step.ticketMs, ttlMs: step.ttlMs, wakeId: c.polls ? "" : c.wake };
            await looked(i, c, at);
          } else if (step.op === "again" && c.state === "waiting" && c.last) {
            log.push(`${i} look again: ${JSON.stringify(await look(c, c.last))}`);
          } else if (
            step.op === "pop" && c.state === "waiting" && c.kind === "shared" && !c.polls
          ) {
            // What one XREAD of `listen` hears: the bell past the ring it listens from, and its
            // own wake key (a grant there wins).
            const heard = await redis.exec([
              "XREAD",
              "STREAMS",
              k.readersKey,
              k.wakeKey(c.wake),
              c.bell || "0-0",
              "0-0",
            ]) as unknown;
            log.push(`${i} hear ${c.wake} from ${c.bell}: ${JSON.stringify(heard)}`);
            let grant = "", more = false, own = false, rang = false;
            for (const stream of Array.isArray(heard) ? heard : []) {
              const [from, entries] = stream as [string, [string, unknown[]][]];
              if (from === k.readersKey) {
                c.bell = entries.at(-1)![0];
                rang = true;
              } else own = true;
              const field = from === k.readersKey ? c.wake : "grant";
              for (const [, fields] of entries) {
                for (let f = 0; f + 1 < fields.length; f += 2) {
                  if (fields[f] === field) grant = String(fields[f + 1]);
                  if (
                    from === k.readersKey && fields[f] === "more" && String(fields[f + 1]) === "1"
                  ) {
                    more = true;
                  }
                }
              }
            }
            if (grant !== "" || more || own) {
              const parsed = /^(\d+):(\d+):(\d+):(.*)$/.exec(grant);
              // A reader refuses a grant made before its last look (see `waitFor`): it looks again.
              if (parsed && Number(parsed[3]) >= c.lookedAt) {
                c.state = "holding";
                c.fence = parsed[1]!;
                c.hint = parsed[4]!;
                c.leaseEnd = Number(parsed[2]);
              } else await looked(i, c, "heard");
            } else if (!rang) continue; // nothing yet: it listens on
          } else if (step.op === "pop" && c.state === "waiting" && c.kind !== "shared") {
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
            const reply = await leave(i, c, readers ? "timeout" : "");
            c.state = reply ? "holding" : "idle";
            if (reply) {
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
          const holders = await redis.hgetall<Record<string, string>>(k.holdersKey) ?? {};
          for (const [j, x] of callers.entries()) {
            if (x.state !== "holding" || x.leaseEnd <= now + 30) continue;
            let held: { token?: string; fence?: string; holds: string; mode?: string };
            if (x.kind !== "exclusive") {
              const entry = String(holders[x.token] ?? "").split("|");
              const s = /^S\d+\|\d+\|\d+\|\d+\|[01]\|(\d+)\|/.exec(record);
              held = Number(entry[0]) > now
                ? {
                  token: x.token,
                  fence: entry[1],
                  holds: entry[3] ?? "",
                  mode: s ? (s[1] === "0" ? "shared" : "semaphore") : record.slice(0, 1),
                }
                : { holds: "" };
            } else {
              const m = /^X(\d+)\|-?\d+\|-?\d+\|\d+\|[01]\|([\w-]+)\|[\d:a-f]*\|([\w,-]*)\|/.exec(
                record,
              );
              held = m
                ? { fence: m[1], token: m[2], holds: m[3]!, mode: "exclusive" }
                : { holds: "" };
            }
            const counted = held.holds.split(",").slice(1).includes(x.hold);
            assert.ok(
              held.token === x.token && held.fence === x.fence && counted &&
                held.mode === x.kind,
              `caller ${j} believes it holds ${x.kind} ${x.fence}/${x.hold}; the server: ${
                JSON.stringify(held)
              }\n${log.join("\n")}`,
            );
          }
          // The live holders' entries, and the record's lease end, which covers theirs.
          let permits = 0;
          const s = /^S(\d+)\|(\d+)\|/.exec(record);
          for (const [token, entry] of Object.entries(holders)) {
            const leaseEnd = Number(String(entry).split("|")[0]);
            if (leaseEnd <= now + 30) continue;
            permits++;
            if (readers) {
              assert.ok(
                s && Number(s[2]) >= leaseEnd,
                `${token} holds shared until ${leaseEnd} beside the record ${record}\n${
                  log.join("\n")
                }`,
              );
            }
          }
          if (semaphore) {
            assert.ok(permits <= 1, `${permits} permits held of 1\n${log.join("\n")}`);
          }
          if (readers) {
            // Never an exclusive lease believed live beside a shared one.
            const live = callers.filter((x) => x.state === "holding" && x.leaseEnd > now + 30);
            const kinds = new Set(live.map((x) => x.kind));
            assert.ok(
              kinds.size <= 1,
              `exclusive and shared leases believed live at once\n${log.join("\n")}`,
            );
          }
          const keys = [
            ...await redis.keys(`${k.lockKey}:wake:*`),
            ...readers ? await redis.keys(k.readersKey) : [],
          ];
          for (const key of keys) {
            // -1: none (-2: it expired since it was listed; 0: it expires this millisecond)
            const ttl = await redis.pttl(key);
            assert.ok(ttl !== -1, `${key} has no TTL (${ttl})\n${log.join("\n")}`);
          }
        }
      }),
      {
        numRuns: Number(Deno.env.get("SUCCESSOR_RUNS") ?? variant.runs),
        // A failure's long runs shrink for minutes at most: the property stops at 3 s a run, ten
        // times its usual time on an idle machine (a loaded one still makes every run), and a
        // failure found is reported as shrunk by then.
        ...readers && {
          interruptAfterTimeLimit: Number(Deno.env.get("SUCCESSOR_RUNS") ?? variant.runs) * 3_000,
        },
      },
    );
  });
}
