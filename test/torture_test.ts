import assert from "node:assert/strict";
import { FAULT_KINDS } from "../dev/fault_proxy.ts";
import { runTorture } from "../dev/torture.ts";

Deno.test("a short torture run under every fault kind has no violations", async () => {
  const report = await runTorture({ clients: 24, names: 4, seconds: 8, fuzzRuns: 500 });
  assert.deepEqual(report.violations, []);
  for (const kind of FAULT_KINDS) assert.ok(report.faults[kind] > 0, `no ${kind} fault injected`);
  assert.ok(report.redisRestarts >= 1 && report.scriptFlushes >= 1);
  assert.ok((report.operations["acquire:acquired"] ?? 0) > 100);
  assert.ok(report.staleWritesRefused > 0, "a paused holder's write was refused by its fence");
  assert.equal(report.fuzzCases, 500);
});

Deno.test("the checker catches a release that skips the token check", async () => {
  const report = await runTorture({
    clients: 24,
    names: 4,
    seconds: 4,
    fuzzRuns: 50,
    broken: true,
  });
  assert.ok(report.violations.length > 0, "the broken variant must be caught");
});
