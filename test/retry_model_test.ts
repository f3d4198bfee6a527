// Retried releases against the guarantee, by a small reference model (fast-check): three tokens
// on two names take exclusive, shared, semaphore and multi-name leases, wait (a blocked waiter's
// look, handed the lock by a release), release, retry earlier releases by fence or by token alone,
// break, and let time pass on a redis-server whose clock the test steps. A fenced retry of a
// released lease answers true, of a lease that ended unreleased false; a release with the token
// alone means the token's latest lease on that name. Found by helper-31 (a release forgotten by
// both the record and the marks) and kept as a test.
// Runs: RETRY_RUNS (default 200; `RETRY_RUNS=3000 deno test -A test/retry_model_test.ts`).
import fc from "fast-check";
import { LockOps, Locks } from "@edgelock/edgelock";
import { startShiftedRedisServer } from "../dev/clock_shift.ts";
import { keygen, lockKeys, shared, startBackend, takeTicket } from "./_backend.ts";

const RUNS = Number(Deno.env.get("RETRY_RUNS") ?? 200);
const [SHORT, LONG, STEP, MARGIN] = [5000, 300_000, 6000, 1000];

type Cmd =
  | { k: "acq"; who: number; n: number; long: boolean; mode: "x" | "s" | "sem" }
  | { k: "all"; who: number; long: boolean }
  | { k: "rel"; who: number; n: number }
  | { k: "retry"; who: number; n: number; i: number; fenced: boolean }
  | { k: "block"; who: number; n: number; long: boolean }
  | { k: "brk"; n: number }
  | { k: "adv" };
const who = fc.integer({ min: 0, max: 2 });
const n = fc.constantFrom(0, 0, 0, 1);
const long = fc.constantFrom(false, false, false, true);
const cmd: fc.Arbitrary<Cmd> = fc.oneof(
  {
    weight: 5,
    arbitrary: fc.record({
      k: fc.constant("acq" as const),
      who,
      n,
      long,
      mode: fc.constantFrom("x" as const, "x" as const, "s" as const, "sem" as const),
    }),
  },
  { weight: 2, arbitrary: fc.record({ k: fc.constant("all" as const), who, long }) },
  { weight: 4, arbitrary: fc.record({ k: fc.constant("rel" as const), who, n }) },
  {
    weight: 5,
    arbitrary: fc.record({
      k: fc.constant("retry" as const),
      who,
      n,
      i: fc.nat(20),
      fenced: fc.constantFrom(true, true, false),
    }),
  },
  { weight: 2, arbitrary: fc.record({ k: fc.constant("block" as const), who, n, long }) },
  { weight: 1, arbitrary: fc.record({ k: fc.constant("brk" as const), n }) },
  { weight: 4, arbitrary: fc.record({ k: fc.constant("adv" as const) }) },
);

// A lease the model knows of: `end` on the test's clock (the server's, stepped).
interface Known {
  token: string;
  n: number;
  fence: number;
  end: number;
  released: boolean;
  ended: boolean;
}

const fixture = shared(async () => {
  const server = await startShiftedRedisServer();
  return { server, backend: await startBackend([], server) };
}, async ({ server, backend }) => {
  await server.shift(0);
  await backend.stop();
});

Deno.test(`retried releases answer as the guarantee says, in ${RUNS} random histories`, async () => {
  const { server, backend } = await fixture();
  const redis = backend.redis;
  let offset = 0;
  const now = () => Date.now() + offset;
  await fc.assert(
    fc.asyncProperty(
      fc.array(cmd, { minLength: 1, maxLength: 30, size: "max" }),
      fc.boolean(),
      async (cmds, shortWindow) => {
        offset = 0;
        await server.shift(0);
        const options = shortWindow ? { fenceWindowMs: 1000 } : {};
        const locks = new Locks(redis, options);
        const ops = new LockOps(redis, options);
        const id = crypto.randomUUID().slice(0, 8);
        const names = [keygen(`{g${id}}a`), keygen(`{g${id}}b`)];
        const tokens = [0, 1, 2].map((i) => `token${i}-${id}-${id}`);
        const leases: Known[] = [];
        const violations: string[] = [];
        const seen: string[] = [];
        const add = (token: string, n: number, fence: number, end: number) => {
          const old = leases.find((l) => l.n === n && l.fence === fence && l.token === token);
          if (old) old.end = Math.max(old.end, end);
          else leases.push({ token, n, fence, end, released: false, ended: false });
        };
        const failed = (error: unknown) =>
          `error:${(error as { code?: string }).code ?? (error as Error).message}`;
        const step = async (c: Cmd): Promise<string> => {
          switch (c.k) {
            case "acq": {
              const token = tokens[c.who]!;
              const mode = c.mode === "s" ? { mode: "shared" as const } : {};
              const limit = c.mode === "sem" ? { limit: 2 } : {};
              try {
                const ttlMs = c.long ? LONG : SHORT;
                const r = await locks.acquire(names[c.n]!, { token, ttlMs, ...mode, ...limit });
                if (!r.acquired) return `busy:${r.reason}`;
                add(token, c.n, r.lease.fence, r.lease.expiresAt);
                return "granted";
              } catch (error) {
                return failed(error);
              }
            }
            case "all": {
              const token = tokens[c.who]!;
              try {
                const r = await locks.acquireAll(names, { token, ttlMs: c.long ? LONG : SHORT });
                if (!r.acquired) return `busy:${r.reason}`;
                r.leases.forEach((l, i) => add(token, i, l.fence, l.expiresAt));
                return "granted";
              } catch (error) {
                return failed(error);
              }
            }
            case "block": { // a blocked waiter's look: it stays queued with its offer
              const token = tokens[c.who]!;
              const name = names[c.n]!;
              const wakeId = `w${c.who}x${name.slice(-6)}`;
              try {
                const ttlMs = c.long ? LONG : SHORT;
                const r = await takeTicket(redis, name, token, 20_000, {
                  maxWaiters: 8,
                  wakeId,
                  ttlMs,
                });
                if (r[0] !== 1) return `busy:${r[0]}:${r[3]}`;
                add(token, c.n, r[1]!, r[3]! + r[2]!);
                return "granted";
              } catch (error) {
                return failed(error);
              }
            }
            case "rel":
            case "retry": {
              const token = tokens[c.who]!;
              const mine = leases.filter((l) => l.token === token && l.n === c.n);
              const lease = c.k === "rel"
                ? mine.at(-1)
                : c.fenced
                ? mine[c.i % Math.max(mine.length, 1)]
                : mine.reduce<Known | undefined>(
                  (a, l) => !a || l.fence > a.fence ? l : a,
                  undefined,
                );
              if (!lease && (c.k === "rel" || c.fenced)) return "none";
              const fence = c.k === "rel" || c.fenced ? lease!.fence : undefined;
              const t = now();
              // The guarantee's answer, unless the lease ends too close to now to tell.
              let expected: boolean | undefined = false; // never granted here: nothing to release
              if (lease) {
                if (lease.released) expected = true;
                else if (!lease.ended && lease.end > t + MARGIN) expected = true;
                else if (lease.ended || lease.end < t - MARGIN) expected = false;
                else expected = undefined;
              }
              let answer: string;
              try {
                const got = await locks.release({
                  name: names[c.n]!,
                  token,
                  ...(fence !== undefined && { fence }),
                });
                answer = String(got);
                if (got && lease && !lease.released && !lease.ended && lease.end > t) {
                  lease.released = true;
                }
              } catch (error) {
                answer = failed(error);
              }
              if (expected !== undefined && answer !== String(expected)) {
                const kind = c.k === "rel" ? "release" : c.fenced ? "fenced retry" : "token retry";
                violations.push(
                  `${kind} of token ${c.who}'s lease ${
                    lease ? leases.indexOf(lease) : "-"
                  } on name ${c.n}: ${answer}, expected ${expected}`,
                );
              }
              // A release may hand the name to a blocked waiter: the model learns that lease.
              const info = await locks.inspect(names[c.n]!);
              const raw = await redis.get(lockKeys(names[c.n]!)[0]);
              const m = typeof raw === "string"
                ? /^X(\d+)\|-?\d+\|-?\d+\|\d+\|[01]\|([\w-]+)\|/.exec(raw)
                : null;
              if (info.held && m && Number(m[1]) === info.fence) {
                add(m[2]!, c.n, info.fence, t + info.ttlMs);
              }
              return answer;
            }
            case "brk": {
              const r = await ops.break(names[c.n]!, { by: "test" });
              if (r.broken) {
                for (const l of leases) {
                  if (l.n === c.n && !l.released) l.ended = true;
                }
              }
              return `broken:${r.broken}`;
            }
            case "adv":
              offset += STEP;
              await server.shift(offset);
              return "adv";
          }
        };
        for (const c of cmds) seen.push(`${JSON.stringify(c)} -> ${await step(c)}`);
        if (violations.length > 0) {
          throw new Error(
            `${violations.join("; ")} (fence window ${shortWindow ? 1000 : "default"}):\n${
              seen.join("\n")
            }`,
          );
        }
      },
    ),
    {
      numRuns: RUNS,
      // helper-31's first find: a token's release, another token's lease that runs out, the token
      // again, and a retry of its first release by its fence.
      examples: [[[
        { k: "acq", who: 0, n: 0, long: true, mode: "x" },
        { k: "rel", who: 0, n: 0 },
        { k: "acq", who: 1, n: 0, long: false, mode: "x" },
        { k: "adv" },
        { k: "acq", who: 0, n: 0, long: true, mode: "x" },
        { k: "retry", who: 0, n: 0, i: 0, fenced: true },
      ], false]],
    },
  );
});
