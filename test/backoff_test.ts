import assert from "node:assert/strict";
import { backoffDelay, sleep } from "../src/core/_backoff.ts";

Deno.test("backoffDelay() is full jitter under a doubling ceiling, capped", () => {
  const max = () => 0.999999;
  assert.equal(backoffDelay(0, 10_000, { random: max }), 20);
  assert.equal(backoffDelay(3, 10_000, { random: max }), 160);
  assert.equal(backoffDelay(20, 10_000, { random: max }), 1000);
  assert.equal(backoffDelay(5, 10_000, { random: () => 0 }), 1, "never a zero-delay spin");
});

Deno.test("backoffDelay() never waits past the server's retryAfterMs or the time left", () => {
  const max = () => 0.999999;
  assert.equal(backoffDelay(10, 37, { random: max }), 37);
  assert.equal(backoffDelay(10, 0.4, { random: max }), 1);
});

Deno.test("sleep() rejects with the signal's reason as soon as it aborts", async () => {
  const controller = new AbortController();
  const slept = sleep(10_000, controller.signal);
  controller.abort(new Error("stop"));
  await assert.rejects(slept, /stop/);
  await assert.rejects(sleep(10, AbortSignal.abort(new Error("already"))), /already/);
});
