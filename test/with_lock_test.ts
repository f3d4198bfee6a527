import assert from "node:assert/strict";
import { createApp } from "@edgelock/edgelock/service";
import { createClient } from "@edgelock/edgelock/client";
import { EdgelockError, Locks, withLock } from "@edgelock/edgelock";
import { hold } from "../src/core/with_lock.ts";
import { holderOf, keygen, shared, startBackend } from "./_backend.ts";

const lockKey = (name: string) => `edgelock:lock:{${name}}`;

const fixture = shared(async () => {
  const backend = await startBackend();
  const { redis } = backend;
  const locks = new Locks(redis);
  return { backend, redis, locks };
}, ({ backend }) => backend.stop());

Deno.test("withLock() runs the routine holding the lock and releases it on success", async () => {
  const { redis, locks } = await fixture();
  const name = keygen();
  const value = await locks.withLock(name, { ttlMs: 1000 }, async (lease, signal) => {
    assert.equal(signal.aborted, false);
    assert.equal(await holderOf(redis, name), lease.token);
    return "done";
  });
  assert.equal(value, "done");
  assert.equal((await new Locks(redis).inspect(name)).held, false);
});

Deno.test("withLock() releases the lock and rethrows when the routine throws", async () => {
  const { redis, locks } = await fixture();
  const name = keygen();
  const failure = new Error("the routine failed");
  await assert.rejects(
    locks.withLock(name, { ttlMs: 1000 }, () => {
      throw failure;
    }),
    (error) => error === failure,
  );
  assert.equal((await new Locks(redis).inspect(name)).held, false);
});

Deno.test("withLock() renews the lease across several TTLs while the routine runs", async () => {
  const { redis, locks } = await fixture();
  const name = keygen();
  const earlier = await locks.acquire(name);
  assert.ok(earlier.acquired);
  await locks.release(earlier.lease);
  const fence = await locks.withLock(name, { ttlMs: 600 }, async (lease, signal) => {
    await new Promise((resolve) => setTimeout(resolve, 2000)); // over three TTLs
    assert.equal(signal.aborted, false);
    const info = await locks.inspect(name);
    assert.ok(info.held && info.fence === lease.fence);
    return lease.fence;
  });
  assert.ok(fence > earlier.lease.fence, "a new lease: a later fence than the one before");
  assert.equal((await new Locks(redis).inspect(name)).held, false);
});

Deno.test("withLock() aborts the signal and rejects with lock_lost when the lock is stolen", async () => {
  const { redis, locks } = await fixture();
  const name = keygen();
  let sawAbort: unknown;
  const run = locks.withLock(name, { ttlMs: 300 }, async (_lease, signal) => {
    await redis.del(lockKey(name)); // another party takes the name
    const thief = await locks.acquire(name, { ttlMs: 5000 });
    assert.ok(thief.acquired);
    await new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, 2000);
      signal.addEventListener("abort", () => {
        clearTimeout(timer);
        sawAbort = signal.reason;
        resolve();
      });
    });
    return thief.lease;
  });
  await assert.rejects(run, (error: unknown) => {
    assert.ok(error instanceof EdgelockError);
    assert.equal(error.code, "lock_lost");
    return true;
  });
  assert.ok(sawAbort instanceof EdgelockError && sawAbort.code === "lock_lost");
  const info = await locks.inspect(name);
  assert.ok(info.held, "the thief's lock was not released by the loser");
});

Deno.test("withLock() aborts before expiry when renewals cannot reach the backend", async () => {
  const { redis } = await fixture();
  const name = keygen();
  const real = new Locks(redis);
  // The renewals go to a backend that refuses them: the lease can no longer be kept.
  const flaky = {
    acquire: real.acquire.bind(real),
    release: real.release.bind(real),
    renew: () => Promise.reject(new EdgelockError("backend_unavailable", "down")),
  };
  let abortedWithMsLeft = -1;
  await assert.rejects(
    withLock(flaky, name, { ttlMs: 500 }, async (_lease, signal) => {
      await new Promise<void>((resolve) => signal.addEventListener("abort", () => resolve()));
      const info = await new Locks(redis).inspect(name);
      abortedWithMsLeft = info.held ? info.ttlMs : -1;
    }),
    { code: "lock_lost" },
  );
  assert.ok(abortedWithMsLeft > 0, `aborted with ${abortedWithMsLeft} ms of lease left`);
});

Deno.test("withLock() throws lock_busy with retryAfterMs when the lock stays busy", async () => {
  const { locks } = await fixture();
  const name = keygen();
  const held = await locks.acquire(name, { ttlMs: 3000 });
  assert.ok(held.acquired);
  let ran = false;
  await assert.rejects(
    locks.withLock(name, { waitMs: 100 }, () => {
      ran = true;
    }),
    (error: unknown) =>
      error instanceof EdgelockError && error.code === "lock_busy" &&
      (error.retryAfterMs ?? 0) > 0,
  );
  assert.equal(ran, false);
});

Deno.test("withLock() after a wait longer than the TTL times the lease from its grant, in both clients", async () => {
  const { redis } = await fixture();
  const secret = "with-lock-secret-0123456789";
  const app = createApp({ redis, apiKeys: [{ tenant: "w", secret }], log: () => {} });
  const remote = createClient({
    baseUrl: "http://edgelock.test",
    apiKey: secret,
    fetch: async (input, init) => await app.fetch(new Request(input, init)),
  });
  const direct = new Locks(redis, { prefix: "edgelock:w" }); // the tenant's own keys
  for (const [label, client] of [["library", direct], ["HTTP client", remote]] as const) {
    const name = keygen();
    const holder = await direct.acquire(name, { ttlMs: 5000 });
    assert.ok(holder.acquired);
    setTimeout(() => direct.release(holder.lease), 1500); // busy for 1.5 TTLs
    const started = performance.now();
    const value = await client.withLock(
      name,
      { ttlMs: 1000, waitMs: 5000 },
      async (_lease, signal) => {
        const waited = performance.now() - started;
        await new Promise((resolve) => setTimeout(resolve, 300));
        assert.equal(signal.aborted, false, `${label}: aborted after a ${waited} ms wait`);
        return waited;
      },
    );
    assert.ok(value >= 1400, `${label} waited ${value} ms`);
  }
});

Deno.test("a nested reentrant withLock with a shorter TTL never lets another token in while the outer runs", async () => {
  const { redis, locks } = await fixture();
  const name = keygen();
  let intruded = false;
  await locks.withLock(name, { ttlMs: 6000, reentrant: true }, async (outer, signal) => {
    await locks.withLock(
      name,
      { ttlMs: 300, reentrant: true, token: outer.token },
      async () => {},
    );
    // Well past the inner 300 ms: the outer lease holds until its own end.
    for (let i = 0; i < 4; i++) {
      await new Promise((resolve) => setTimeout(resolve, 200));
      if ((await new Locks(redis).acquire(name)).acquired) intruded = true;
    }
    assert.equal(signal.aborted, false);
  });
  assert.equal(intruded, false, "another token was granted the name");
  assert.equal((await locks.inspect(name)).held, false, "released at the end");
});

Deno.test("withLock() rejects a missing routine with a TypeError", async () => {
  const { locks } = await fixture();
  await assert.rejects(locks.withLock(keygen(), {}, undefined as never), TypeError);
});

Deno.test("a middleware's claim, renewAfterAbort, stays renewed while its handler runs on after the abort", async () => {
  let renewals = 0;
  let stalled!: () => void;
  const unstall = new Promise<void>((resolve) => stalled = resolve);
  let renewedAfterAbort!: () => void;
  const renewedAgain = new Promise<void>((resolve) => renewedAfterAbort = resolve);
  let signal!: AbortSignal;
  const outcome = hold({
    what: "a lease",
    ttlMs: 300,
    grantedAt: performance.now(),
    renewAfterAbort: true,
    renew: async () => {
      renewals++;
      // The second renewal hangs, as against a paused Redis, until the watchdog aborts the
      // routine's signal; then the backend answers: the lease is still this token's.
      if (renewals === 2) await unstall;
      if (renewals === 3) renewedAfterAbort();
      return true;
    },
  }, async (given) => {
    signal = given;
    given.addEventListener("abort", () => stalled(), { once: true });
    // A handler that cannot stop (a middleware's): it runs until the lease was renewed again.
    await renewedAgain;
  });
  await assert.rejects(outcome, { code: "lock_lost", message: /could not be renewed in time/ });
  assert.ok(signal.aborted);
  assert.ok(renewals >= 3, `renewed ${renewals} times`);
});

Deno.test("a signal aborted while the lease was acquired aborts the routine at once", async () => {
  const controller = new AbortController();
  controller.abort(new Error("the caller gave up"));
  let seen: boolean | undefined;
  const outcome = hold({
    what: "a lease",
    ttlMs: 10_000,
    grantedAt: performance.now(),
    renew: () => Promise.resolve(true),
    signal: controller.signal,
  }, (signal) => {
    seen = signal.aborted;
  });
  await assert.rejects(outcome, { message: "the caller gave up" });
  assert.equal(seen, true);
});

Deno.test("withLock stops renewing once its signal aborted: a renewal by token could take a later lease", async () => {
  // A token may be reused (a retry, a chosen token): once the lease may have lapsed, a renewal by
  // token could renew that token's next lease and hand it to this routine, which then frees it.
  let renewals = 0;
  let stalled!: () => void;
  const unstall = new Promise<void>((resolve) => stalled = resolve);
  const outcome = hold({
    what: "a lease",
    ttlMs: 300,
    grantedAt: performance.now(),
    renew: async () => {
      renewals++;
      if (renewals === 2) await unstall;
      return true;
    },
  }, async (signal) => {
    await new Promise((resolve) => signal.addEventListener("abort", resolve, { once: true }));
    stalled();
    await new Promise((resolve) => setTimeout(resolve, 900)); // three TTLs after the abort
  });
  await assert.rejects(outcome, { code: "lock_lost" });
  assert.equal(renewals, 2, "no renewal after the abort");
});
