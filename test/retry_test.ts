// The typed client's own retries, through a fetch that loses replies (the request took effect),
// loses requests and sends requests twice: every call it retries must take effect exactly once.
// Model-based: random reentrant acquires and releases by two callers, checked against what each
// caller was told (its holds), never against the implementation's own arithmetic.
import assert from "node:assert/strict";
import fc from "fast-check";
import { createClient, type EdgelockClient } from "@edgelock/edgelock/client";
import { createApp } from "@edgelock/edgelock/service";
import type { Lease } from "@edgelock/edgelock";
import { withBroken } from "../dev/history.ts";
import { keygen, shared, startBackend } from "./_backend.ts";

const SECRET = "retry-secret-0123456789ab";
const OPERATOR = "retry-operator-0123456789";
const RUNS = Number(Deno.env.get("MODEL_RUNS") ?? 100);

type Fault = "none" | "lostReply" | "lostRequest" | "twice";

/**
 * A fetch that injects `faults` in turn (a seeded sequence): a lost reply (the request ran, the
 * client sees a network error), a lost request (it never ran), or the request sent twice (the
 * client gets the second reply). Never two faults in a row, so every call completes within two
 * attempts; `counts` tells what was injected.
 */
function faultyFetch(target: (request: Request) => Promise<Response>, faults: () => Fault) {
  const counts: Record<Fault, number> = { none: 0, lostReply: 0, lostRequest: 0, twice: 0 };
  let last: Fault = "none";
  const fetch = async (input: RequestInfo | URL, init?: RequestInit): Promise<Response> => {
    const request = new Request(input, init);
    const fault = last === "none" ? faults() : "none";
    last = fault;
    counts[fault]++;
    if (fault === "lostRequest") throw new TypeError("network error: the request was lost");
    const body = await request.clone().arrayBuffer();
    const send = () => target(new Request(request, { body: body.byteLength ? body : null }));
    if (fault === "twice") await (await send()).arrayBuffer();
    const response = await send();
    if (fault === "lostReply") {
      await response.arrayBuffer();
      throw new TypeError("network error: the reply was lost");
    }
    return response;
  };
  return { fetch: fetch as typeof globalThis.fetch, counts };
}

type Cmd =
  | { kind: "acquire"; who: number; reentrant: boolean }
  | { kind: "release"; who: number; which: number }
  | { kind: "renew"; who: number };

const command: fc.Arbitrary<Cmd> = fc.oneof(
  fc.record({
    kind: fc.constant("acquire" as const),
    who: fc.integer({ min: 0, max: 1 }),
    reentrant: fc.boolean(),
  }),
  fc.record({
    kind: fc.constant("release" as const),
    who: fc.integer({ min: 0, max: 1 }),
    which: fc.nat(),
  }),
  fc.record({ kind: fc.constant("renew" as const), who: fc.integer({ min: 0, max: 1 }) }),
);
const faults = fc.array(fc.constantFrom<Fault>("none", "lostReply", "lostRequest", "twice"), {
  minLength: 1,
  maxLength: 30,
});

const fixture = shared(async () => {
  const backend = await startBackend();
  const app = createApp({
    redis: backend.redis,
    apiKeys: [{ tenant: "r", secret: SECRET }],
    operatorKeys: [{ tenant: "ops", secret: OPERATOR }],
    limits: { requestsPerSecond: 0 },
    log: () => {},
  });
  const through = (plan: Fault[], apiKey = SECRET, service = app) => {
    let i = 0;
    const faulty = faultyFetch(
      (request) => Promise.resolve(service.fetch(request)),
      () => plan[i++ % plan.length]!,
    );
    const client = createClient({
      baseUrl: "http://edgelock.test",
      apiKey,
      fetch: faulty.fetch,
      retries: 2,
      tenant: apiKey === OPERATOR ? "r" : undefined,
    });
    return { client, counts: faulty.counts };
  };

  // An outer and an inner reentrant hold of one token on a new name.
  const nested = async (client: EdgelockClient) => {
    const name = keygen("retry");
    const outer = await client.acquire(name, { reentrant: true, ttlMs: 20_000 });
    assert.ok(outer.acquired);
    const inner = await client.acquire(name, {
      reentrant: true,
      token: outer.lease.token,
      ttlMs: 20_000,
    });
    assert.ok(inner.acquired);
    return { name, outer: outer.lease, inner: inner.lease };
  };
  return { backend, app, through, nested };
}, ({ backend }) => backend.stop());

Deno.test(`${RUNS} random reentrant sequences: each caller's holds are what it was told`, async () => {
  const { through } = await fixture();
  const injected: Record<Fault, number> = { none: 0, lostReply: 0, lostRequest: 0, twice: 0 };
  await fc.assert(
    fc.asyncProperty(
      fc.array(command, { minLength: 1, maxLength: 25 }),
      faults,
      async (cmds, plan) => {
        const { client, counts } = through(plan);
        await runSequence(client, keygen("retry"), cmds);
        for (const [fault, n] of Object.entries(counts)) injected[fault as Fault] += n;
      },
    ),
    { numRuns: RUNS },
  );
  for (const fault of ["lostReply", "lostRequest", "twice"] as const) {
    assert.ok(injected[fault] > 0, `no ${fault} injected`);
  }
});

Deno.test("a reentrant release whose reply was lost, retried, ends only its own hold", async () => {
  const { through, nested } = await fixture();
  const { client, counts } = through(["none", "none", "lostReply"]);
  const { name, outer, inner } = await nested(client);
  assert.equal(await client.release(inner), true); // its first reply lost, then retried
  assert.equal(counts.lostReply, 1);
  const other = await client.acquire(name);
  assert.equal(other.acquired, false, "the outer hold still holds the name");
  assert.equal(await client.release(outer), true);
  assert.equal((await client.inspect(name)).held, false);
});

Deno.test("with a retried hold release that ends another hold, the same retry frees the name", async () => {
  const { backend, through, nested } = await fixture();
  const brokenApp = createApp({
    redis: withBroken(backend.redis, "hold"),
    apiKeys: [{ tenant: "r", secret: SECRET }],
    limits: { requestsPerSecond: 0 },
    log: () => {},
  });
  const { client } = through(["lostReply"], SECRET, brokenApp);
  const { name, inner } = await nested(client);
  await client.release(inner); // its reply lost, retried
  assert.equal((await client.inspect(name)).held, false, "the break shows");
});

Deno.test("a break whose reply was lost, retried, answers the same and ends nothing more", async () => {
  const { app, through } = await fixture();
  const name = keygen("retry");
  const { client: tenant } = through(["none"]);
  const first = await tenant.acquire(name, { ttlMs: 20_000 });
  assert.ok(first.acquired);
  let after: Lease | undefined;
  // The break's first reply is lost; before its retry arrives, another lease is granted.
  const operator = createClient({
    baseUrl: "http://edgelock.test",
    apiKey: OPERATOR,
    tenant: "r",
    retries: 2,
    fetch: (async (input: RequestInfo | URL, init?: RequestInit) => {
      const request = new Request(input, init);
      const body = await request.clone().text();
      const response = await app.fetch(new Request(request, { body: body || null }));
      if (after === undefined && request.url.endsWith(`/break?tenant=r`)) {
        await response.arrayBuffer();
        const next = await tenant.acquire(name, { ttlMs: 20_000 });
        assert.ok(next.acquired, "the break went through");
        after = next.lease;
        throw new TypeError("network error: the reply was lost");
      }
      return response;
    }) as typeof fetch,
  });
  const broken = await operator.break(name, { reason: "stuck" });
  assert.deepEqual(broken, { broken: true, fence: first.lease.fence }, "the same answer");
  assert.ok(after, "a lease was granted between the break and its retry");
  const info = await tenant.inspect(name);
  assert.ok(info.held && info.fence === after.fence, "the new lease stands");
  assert.equal(await tenant.release(after), true);
});

/** Runs `cmds` through `client`; each caller's holds are the leases it was told it holds. */
async function runSequence(client: EdgelockClient, name: string, cmds: Cmd[]) {
  const tokens = [0, 1].map((i) => `retry-token-${i}-${name.slice(-16)}`);
  const holds: Lease[][] = [[], []];
  const seen: string[] = [];
  const fail = (message: string): never => {
    throw new Error(`${message}\nafter: ${seen.join(" → ")}`);
  };
  for (const cmd of cmds) {
    seen.push(JSON.stringify(cmd));
    const mine = holds[cmd.who]!;
    const other = holds[1 - cmd.who]!;
    switch (cmd.kind) {
      case "acquire": {
        // A plain acquire by a holder is a retry of its lease, no hold: only reentrant ones here.
        if (mine.length > 0 && !cmd.reentrant) break;
        const result = await client.acquire(name, {
          token: tokens[cmd.who]!,
          ttlMs: 30_000,
          ...(cmd.reentrant && { reentrant: true }),
        });
        if (other.length > 0) {
          if (result.acquired) fail("granted while the other caller holds it");
          break;
        }
        if (!result.acquired) fail("busy while nobody holds it");
        else {
          mine.push(result.lease);
          const expected = mine.length;
          if (cmd.reentrant && result.lease.holdCount !== expected) {
            fail(`holdCount ${result.lease.holdCount}, told ${expected} holds`);
          }
        }
        break;
      }
      case "release": {
        if (mine.length === 0) break;
        const [lease] = mine.splice(cmd.which % mine.length, 1);
        if (!await client.release(lease!)) fail("a held lease's release said false");
        const info = await client.inspect(name);
        if (info.held !== (mine.length > 0)) {
          fail(`held ${info.held} with ${mine.length} holds told`);
        }
        if (info.held && info.permits !== mine.length) {
          fail(`${info.permits} holds, told ${mine.length}`);
        }
        break;
      }
      case "renew": {
        if (mine.length === 0) break;
        const result = await client.renew(mine[0]!);
        if (!result.renewed) fail("a held lease's renew said lost");
        break;
      }
    }
  }
  for (const mine of holds) for (const lease of mine) await client.release(lease);
  if ((await client.inspect(name)).held) fail("still held after every hold was released");
}
