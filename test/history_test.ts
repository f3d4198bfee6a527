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

const shared = (token: string, start: number, extra: Partial<Operation> = {}): Operation =>
  ({ ...acquired(token, token, start), mode: "shared", ...extra }) as Operation;
const permits = (token: string, start: number, n: number): Operation =>
  ({ ...acquired(token, token, start), mode: "semaphore", limit: 3, permits: n }) as Operation;

Deno.test("check() lets readers share a name but never beside a writer", () => {
  assert.deepEqual(check([shared("r1", 1000), shared("r2", 1010), shared("r3", 1050)]), []);
  const rules = check([shared("r1", 1000), acquired("w", "w", 1020)]).map((v) => v.rule);
  assert.deepEqual(rules, ["overlap"]);
  assert.deepEqual(check([acquired("w", "w", 1000), shared("r1", 1020)]).map((v) => v.rule), [
    "overlap",
  ]);
});

Deno.test("check() counts a semaphore's permits against its limit", () => {
  assert.deepEqual(check([permits("a", 1000, 2), permits("b", 1010, 1)]), []);
  const over = check([permits("a", 1000, 2), permits("b", 1010, 1), permits("c", 1020, 1)]);
  assert.deepEqual(over.map((v) => v.rule), ["over_limit"]);
  // Once a's lease ended, its permits are free again.
  assert.deepEqual(check([permits("a", 1000, 3), permits("b", 1150, 3)]), []);
});

Deno.test("check() wants a higher fence for every later lease, and no fence twice", () => {
  const same = check([shared("r1", 1000), shared("r2", 1020, { fence: 1000 * 1000 })]);
  assert.deepEqual(same.map((v) => v.rule), ["fence_order"]);
  const lower = check([shared("r1", 1000), shared("r2", 1020, { fence: 999 })]);
  assert.deepEqual(lower.map((v) => v.rule), ["fence_order"]);
  // A lease whose first attempt was sent before another's grant may hold a lower fence.
  const retried = check([
    shared("r2", 1020),
    shared("r1", 1030, { invokedAt: 1000, fence: 1001 * 1000 }),
  ]);
  assert.deepEqual(retried, []);
});

Deno.test("check() reports a name a busy multi-name acquire took anyway", () => {
  const busy: Operation = {
    op: "acquire",
    client: "m",
    name: "n",
    token: "tm",
    invokedAt: 1000,
    completedAt: 1002,
    outcome: "busy",
    multi: true,
  };
  assert.deepEqual(check([busy, released("m", "tm", 1010, "not_held")]), []);
  assert.deepEqual(check([busy, released("m", "tm", 1010)]).map((v) => v.rule), [
    "partial_grant",
  ]);
});

Deno.test("check() takes a token's lease granted anew after its first ended as a lease of its own", () => {
  // A reentrant hold whose retry arrived after the outer lease expired: granted anew (a new
  // fence), after a reader held the name in between; its release answers for the new lease.
  const hold = (at: number, id: string, ttl: number): Operation => ({
    ...acquired("a", "ta", at, ttl),
    hold: id,
  } as Operation);
  const releaseHold = (at: number, id: string): Operation => ({
    ...released("a", "ta", at),
    hold: id,
  } as Operation);
  const history = [
    hold(1000, "outer", 100),
    shared("r", 1120, { expiresAt: 1300 }),
    released("r", "r", 1150),
    hold(1160, "inner", 50),
    releaseHold(1170, "inner"),
    acquired("b", "tb", 1180),
    releaseHold(1250, "outer"),
  ];
  assert.deepEqual(check(history), []);
  // Its second lease still excludes others while it stands.
  const overlap = check([...history.slice(0, 4), acquired("b", "tb", 1165)]);
  assert.deepEqual(overlap.map((v) => v.rule), ["overlap"]);
  // A release sent before the second grant and answered before it does not end that lease.
  const early = check([
    hold(1000, "outer", 100),
    releaseHold(1050, "outer"),
    hold(1160, "outer", 100),
    acquired("b", "tb", 1180),
  ]);
  assert.deepEqual(early.map((v) => v.rule), ["overlap"]);
});
