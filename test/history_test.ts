import assert from "node:assert/strict";
import { check, FencedResource, type Operation } from "../dev/history.ts";

const acquired = (client: string, token: string, start: number, ttl = 100): Operation => ({
  op: "acquire",
  client,
  name: "n",
  token,
  invokedAt: start - 1,
  completedAt: start + 1,
  outcome: "acquired",
  fence: start * 1000,
  serverTime: start,
  expiresAt: start + ttl,
});
const released = (client: string, token: string, at: number, outcome = "released"): Operation => ({
  op: "release",
  client,
  name: "n",
  token,
  invokedAt: at,
  completedAt: at + 1,
  outcome: outcome as "released",
});

Deno.test("check() passes a history of leases one after another", () => {
  const history = [
    acquired("a", "ta", 1000),
    released("a", "ta", 1050),
    acquired("b", "tb", 1060),
    acquired("c", "tc", 1200), // b's lease expired at 1160
  ];
  assert.deepEqual(check(history), []);
});

Deno.test("check() reports two acquired leases that overlap", () => {
  const violations = check([acquired("a", "ta", 1000), acquired("b", "tb", 1050)]);
  assert.equal(violations.length, 1);
  assert.equal(violations[0]!.rule, "overlap");
});

Deno.test("check() ends a lease at a release's invocation, whatever the release answered", () => {
  for (const outcome of ["released", "not_held", "failed"]) {
    const history = [
      acquired("a", "ta", 1000),
      released("a", "ta", 1020, outcome),
      acquired("b", "tb", 1030),
    ];
    assert.deepEqual(check(history), [], outcome);
  }
});

Deno.test("check() reports a release answered true after another lease began", () => {
  const history = [
    acquired("a", "ta", 1000),
    acquired("b", "tb", 1150), // a expired at 1100
    released("a", "ta", 1160),
  ];
  assert.deepEqual(check(history).map((v) => v.rule), ["foreign_release"]);
});

Deno.test("check() reports a renewal granted to a token another lease displaced", () => {
  const history: Operation[] = [
    acquired("a", "ta", 1000),
    acquired("b", "tb", 1150),
    {
      op: "renew",
      client: "a",
      name: "n",
      token: "ta",
      invokedAt: 1170,
      completedAt: 1172,
      outcome: "renewed",
      serverTime: 1171,
      expiresAt: 1271,
    },
  ];
  assert.ok(check(history).some((v) => v.rule === "foreign_renew"));
});

Deno.test("FencedResource refuses older fences and check() finds lost updates", () => {
  const resource = new FencedResource();
  assert.equal(resource.read("n", 10), 0);
  assert.equal(resource.read("n", 20), 0);
  assert.equal(resource.write("n", 10, 1), false, "the stale holder's write is refused");
  assert.equal(resource.write("n", 20, 1), true);
  assert.equal(resource.rejected, 1);
  assert.deepEqual(check([], { resource }), []);
  // Two holders sharing one fence (a broken lock) lose an update.
  assert.equal(resource.read("m", 5), 0);
  assert.equal(resource.read("m", 5), 0);
  resource.write("m", 5, 1);
  resource.write("m", 5, 1);
  assert.deepEqual(check([], { resource }).map((v) => v.rule), ["lost_update"]);
  assert.throws(() => resource.read("m", undefined as unknown as number), TypeError);
});
