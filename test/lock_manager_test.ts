// The Web Locks API over edgelock: LockManager against a real redis-server through the bridge.
import assert from "node:assert/strict";
import { EdgelockError, type HeldLock, LockManager, LockOps, Locks } from "@edgelock/edgelock";
import { acquired, keygen, shared, startBackend, until } from "./_backend.ts";

const fixture = shared(startBackend, (backend) => backend.stop());

// Until `name` is held, with `waiters` queued behind its holder.
function heldWith(locks: Locks, name: string, waiters = 0) {
  return until(`${name} held, ${waiters} waiting`, async () => {
    const info = await locks.inspect(name);
    return info.held && (info.waiters ?? 0) === waiters;
  });
}

// A promise and the function that settles it, for callbacks the test lets finish.
function gate<T = void>() {
  let open!: (value: T) => void;
  const opened = new Promise<T>((resolve) => open = resolve);
  return { opened, open };
}

Deno.test("a request holds the lock while its callback is pending, then the next is granted", async () => {
  const backend = await fixture();
  const manager = new LockManager(backend.redis);
  const other = new LockManager(backend.redis); // another instance, as on another isolate
  const name = keygen("wl");
  const first = gate();
  const steps: string[] = [];
  let firstLock: HeldLock | null = null;
  const one = manager.request(name, async (lock) => {
    firstLock = lock;
    steps.push("first starts");
    await first.opened;
    steps.push("first ends");
    return "one";
  });
  await until("first granted", () => Promise.resolve(firstLock !== null));
  const two = other.request(name, (lock) => {
    steps.push("second starts");
    assert.ok(lock!.fence > firstLock!.fence, "a higher fence");
    return "two";
  });
  await heldWith(new Locks(backend.redis), name, 1);
  assert.deepEqual(steps, ["first starts"]);
  first.open();
  assert.deepEqual(await Promise.all([one, two]), ["one", "two"]);
  assert.deepEqual(steps, ["first starts", "first ends", "second starts"]);
  assert.equal((await new Locks(backend.redis).inspect(name)).held, false, "released at the end");
});

Deno.test("a callback that throws rejects the request with its error and releases the lock", async () => {
  const backend = await fixture();
  const manager = new LockManager(backend.redis);
  const name = keygen("wl");
  const failure = new Error("the work failed");
  await assert.rejects(manager.request(name, () => Promise.reject(failure)), failure);
  assert.equal((await new Locks(backend.redis).inspect(name)).held, false);
  assert.equal(await manager.request(name, (lock) => lock!.name), name);
});

Deno.test("shared requests hold together; an exclusive one waits for them all", async () => {
  const backend = await fixture();
  const manager = new LockManager(backend.redis);
  const name = keygen("wl");
  const readers = gate();
  let reading = 0;
  const reads = [0, 1, 2].map(() =>
    manager.request(name, { mode: "shared" }, async (lock) => {
      assert.equal(lock!.mode, "shared");
      reading++;
      await readers.opened;
      reading--;
    })
  );
  await until("three readers", () => Promise.resolve(reading === 3));
  let wrote = false;
  const write = manager.request(name, (lock) => {
    assert.equal(reading, 0, "no reader holds it");
    assert.equal(lock!.mode, "exclusive");
    wrote = true;
  });
  await heldWith(new Locks(backend.redis), name, 1);
  assert.equal(wrote, false);
  readers.open();
  await Promise.all([...reads, write]);
  assert.ok(wrote);
});

Deno.test("ifAvailable calls back with null when the lock is held, and with the lock when free", async () => {
  const backend = await fixture();
  const manager = new LockManager(backend.redis);
  const name = keygen("wl");
  const held = gate();
  const holding = manager.request(name, () => held.opened);
  await heldWith(new Locks(backend.redis), name);
  assert.equal(await manager.request(name, { ifAvailable: true }, (lock) => lock), null);
  // While it is told "not available", the request is neither held nor pending.
  const seen = await manager.request(name, { ifAvailable: true }, () => manager.query());
  assert.deepEqual(seen.pending, []);
  held.open();
  await holding;
  const fence = await manager.request(name, { ifAvailable: true }, (lock) => lock?.fence);
  assert.equal(typeof fence, "number");
});

Deno.test("steal ends the holder's lease with an audit entry: its signal aborts, its request rejects lock_lost", async () => {
  const backend = await fixture();
  const victim = new LockManager(backend.redis, { ttlMs: 1_500, clientId: "victim" });
  const thief = new LockManager(backend.redis, { clientId: "thief" });
  const name = keygen("wl");
  let stolenFence = 0;
  const victimRequest = victim.request(name, async (lock) => {
    stolenFence = lock!.fence;
    // The work stops when its lease is gone: the next renewal finds it broken.
    await new Promise((resolve) => lock!.signal.addEventListener("abort", resolve));
    return "stopped";
  });
  await until("the victim holds it", () => Promise.resolve(stolenFence > 0));
  const fence = await thief.request(name, { steal: true }, (lock) => lock!.fence);
  assert.ok(fence > stolenFence);
  await assert.rejects(
    victimRequest,
    (error: unknown) => error instanceof EdgelockError && error.code === "lock_lost",
  );
  const [entry] = (await new LockOps(backend.redis).audit({ limit: 100 }))
    .filter((e) => e.name === name);
  assert.equal(entry?.by, "thief");
  assert.equal(entry?.fence, stolenFence);
  assert.match(entry!.reason, /steal/);
});

Deno.test("a signal aborts a wait with its reason, and the request leaves the queue", async () => {
  const backend = await fixture();
  const manager = new LockManager(backend.redis);
  const name = keygen("wl");
  const held = gate();
  const holding = manager.request(name, () => held.opened);
  await heldWith(new Locks(backend.redis), name);
  const controller = new AbortController();
  let called = false;
  const waiting = manager.request(name, { signal: controller.signal }, () => {
    called = true;
  });
  await heldWith(new Locks(backend.redis), name, 1);
  assert.equal((await manager.query()).pending.length, 1);
  const reason = new DOMException("the user left", "AbortError");
  controller.abort(reason);
  await assert.rejects(waiting, reason);
  assert.equal(called, false);
  const info = await new Locks(backend.redis).inspect(name);
  assert.ok(info.held && !info.waiters, "the queue is empty again");
  held.open();
  await holding;
});

Deno.test("the Web Locks refusals: a '-' name, invalid option mixes, an aborted signal", async () => {
  const backend = await fixture();
  const manager = new LockManager(backend.redis);
  const name = keygen("wl");
  const cb = () => "ran";
  const notSupported = (message: string) => ({ name: "NotSupportedError", message });
  for (
    const [options, message] of [
      [{ steal: true, ifAvailable: true }, "steal and ifAvailable cannot be used together"],
      [{ steal: true, mode: "shared" }, 'steal needs mode "exclusive"'],
      [
        { ifAvailable: true, signal: new AbortController().signal },
        "signal cannot be used with steal or ifAvailable",
      ],
    ] as const
  ) {
    await assert.rejects(manager.request(name, options, cb), notSupported(message));
  }
  await assert.rejects(
    manager.request("-reserved", cb),
    notSupported("lock names starting with '-' are reserved"),
  );
  const reason = new Error("gone already");
  await assert.rejects(manager.request(name, { signal: AbortSignal.abort(reason) }, cb), reason);
  await assert.rejects(manager.request(name, {}, undefined as never), TypeError);
  await assert.rejects(
    manager.request(name, { mode: "write" as never }, cb),
    new TypeError('mode must be "exclusive" or "shared", not "write"'),
  );
  await assert.rejects(manager.request("a b", cb), RangeError);
  await assert.rejects(
    manager.request(name, { ifAvaliable: true } as never, cb),
    new TypeError('request() has no option "ifAvaliable"; did you mean "ifAvailable"?'),
  );
  assert.throws(
    () => new LockManager(backend.redis, { ttl: 5 } as never),
    /ttl.*ttlMs/,
  );
});

Deno.test("query reports the held locks, whose are this manager's, and its pending requests", async () => {
  const backend = await fixture();
  const prefix = keygen("p");
  const manager = new LockManager(backend.redis, { prefix, clientId: "me" });
  const elsewhere = new Locks(backend.redis, { prefix });
  const [mine, theirs] = [keygen("mine"), keygen("theirs")];
  const lease = acquired(await elsewhere.acquire(theirs, { mode: "shared", ttlMs: 10_000 }));
  const held = gate();
  const holding = manager.request(mine, () => held.opened);
  await heldWith(elsewhere, mine);
  const waiting = manager.request(theirs, () => "late");
  await heldWith(elsewhere, theirs, 1);
  const snapshot = await manager.query();
  const byName = (a: { name: string }, b: { name: string }) => a.name.localeCompare(b.name);
  assert.deepEqual(
    snapshot.held.sort(byName),
    [
      { name: mine, mode: "exclusive", clientId: "me" },
      { name: theirs, mode: "shared" },
    ].sort(byName),
  );
  assert.deepEqual(snapshot.pending, [{ name: theirs, mode: "exclusive", clientId: "me" }]);
  held.open();
  await holding;
  await elsewhere.release(lease);
  assert.equal(await waiting, "late");
  assert.deepEqual(await manager.query(), { held: [], pending: [] });
});

Deno.test("a callback that outlives the lease's TTL keeps the lock: the lease is renewed", async () => {
  const backend = await fixture();
  const manager = new LockManager(backend.redis, { ttlMs: 1_500 });
  const name = keygen("wl");
  const fence = await manager.request(name, async (lock) => {
    await new Promise((resolve) => setTimeout(resolve, 3_500));
    assert.equal(lock!.signal.aborted, false);
    const info = await new Locks(backend.redis).inspect(name);
    assert.ok(info.held && info.fence === lock!.fence, "still held, by the same lease");
    return lock!.fence;
  });
  assert.ok(fence > 0);
});
