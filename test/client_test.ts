import assert from "node:assert/strict";
import { Hono } from "hono";
import { createClient } from "@edgelock/edgelock/client";
import { idempotency, webhookDedupe } from "@edgelock/edgelock/hono";
import { createApp } from "@edgelock/edgelock/service";
import {
  cronGuard,
  dedupe,
  Jobs,
  type JobStore,
  recordId,
  Records,
  type RecordStore,
} from "@edgelock/edgelock/uses";
import { keygen, shared, startBackend, until } from "./_backend.ts";
import { type Lease, Locks } from "@edgelock/edgelock";

const SECRET = "client-secret-0123456789";

// Tokens, fences and times differ between two runs; their presence and type must not.
function normalize(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(normalize);
  if (value === null || typeof value !== "object") return value;
  return Object.fromEntries(
    Object.entries(value).map(([key, v]) => {
      if (key === "token") return [key, typeof v === "string" ? "<token>" : v];
      if (["fence", "leaseExpiresAt", "expiresAt", "retryAfterMs"].includes(key)) {
        return [key, typeof v === "number" && v > 0 ? `<${key}>` : v];
      }
      return [key, normalize(v)];
    }),
  );
}

// The same calls on a store; what each returned, in order.
async function recordScenario(records: RecordStore, tag: string): Promise<unknown[]> {
  const out: unknown[] = [];
  for (const kind of ["idempotency", "dedupe"] as const) {
    const id = recordId(`scope-${tag}`, keygen("k"));
    const first = await records.claim(kind, id, { fingerprint: "f1", leaseMs: 5000 });
    assert.equal(first.state, "claimed");
    const token = first.state === "claimed" ? first.token : "";
    const other = "another-token-0123456789";
    out.push(first);
    out.push(await records.claim(kind, id, { fingerprint: "f1" }));
    out.push(await records.claim(kind, id, { fingerprint: "f2" }));
    out.push(await records.renew(kind, id, token, 6000));
    out.push(await records.renew(kind, id, other));
    out.push(await records.get(kind, id));
    out.push(await records.complete(kind, id, other, { status: 500 }));
    out.push(await records.complete(kind, id, token, { status: 201, body: "made" }));
    out.push(await records.claim(kind, id, { fingerprint: "f1" }));
    out.push(await records.get(kind, id));
    out.push(await records.release(kind, id, token));
    const second = recordId(`scope-${tag}`, `#${"ab".repeat(32)}${tag}`.slice(0, 65));
    const claim = await records.claim(kind, second);
    out.push(claim);
    out.push(await records.release(kind, second, claim.state === "claimed" ? claim.token : ""));
    out.push(await records.get(kind, second));
  }
  return out;
}

async function jobScenario(jobs: JobStore): Promise<unknown[]> {
  const job = keygen("job");
  const out: unknown[] = [];
  const start = await jobs.start(job, { atMostMs: 5000, atLeastMs: 1000, tick: 1 });
  assert.ok(start.run);
  out.push(start);
  out.push(await jobs.start(job, { atMostMs: 5000, tick: 1 }));
  out.push(await jobs.start(job, { atMostMs: 5000 }));
  out.push(await jobs.extend(job, start.token, 6000));
  out.push(await jobs.extend(job, "another-token-0123456789", 6000));
  out.push(await jobs.finish(job, start.token));
  out.push(await jobs.finish(job, start.token));
  out.push(await jobs.start(job, { atMostMs: 5000 }));
  return out;
}

Deno.test("jobs: a Date tick over HTTP is the same tick as the library's epoch ms", async () => {
  const { client, jobs } = await fixture();
  const job = keygen("job");
  const at = new Date("2026-12-05T03:00:00Z");
  const start = await client.jobs.start(job, { atMostMs: 5000, tick: at });
  assert.ok(start.run && await client.jobs.finish(job, start.token));
  const again = await jobs.start(job, { atMostMs: 5000, tick: at.getTime() });
  assert.equal(again.run ? "ran" : again.reason, "tick_done");
  await assert.rejects(
    client.jobs.start(job, { atMostMs: 5000, tick: new Date(Number.NaN) }),
    new RangeError("tick is an invalid Date"),
  );
});

const fixture = shared(async () => {
  const backend = await startBackend();
  const app = createApp({
    redis: backend.redis,
    apiKeys: [{ tenant: "t", secret: SECRET }],
    log: () => {},
  });
  const client = createClient({
    baseUrl: "http://edgelock.test",
    apiKey: SECRET,
    fetch: (input, init) => Promise.resolve(app.fetch(new Request(input, init))),
  });
  // The service keeps tenant t under edgelock:t: the embedded stores share its records.
  const records = new Records(backend.redis, { prefix: "edgelock:t" });
  const jobs = new Jobs(backend.redis, { prefix: "edgelock:t" });
  return { backend, app, client, records, jobs };
}, ({ backend }) => backend.stop());

Deno.test("records: claim, renew, complete, release and get match Records", async () => {
  const { client, records } = await fixture();
  const embedded = normalize(await recordScenario(records, "e"));
  const remote = normalize(await recordScenario(client.records, "r"));
  assert.deepEqual(remote, embedded);
  // And the scenario checks what it should: each outcome occurs.
  const states = (embedded as { state?: string }[]).map((r) => r.state).filter(Boolean);
  for (const state of ["claimed", "in_progress", "mismatch", "completed", "absent"]) {
    assert.ok(states.includes(state), state);
  }
});

Deno.test("jobs: start, extend and finish match Jobs", async () => {
  const { client, jobs } = await fixture();
  const embedded = normalize(await jobScenario(jobs));
  assert.deepEqual(normalize(await jobScenario(client.jobs)), embedded);
  const reasons = (embedded as { reason?: string }[]).map((r) => r.reason).filter(Boolean);
  assert.deepEqual(reasons, ["tick_done", "running", "too_soon"]);
});

Deno.test("dedupe(), cronGuard() and idempotency() run on the client as on the library", async () => {
  const { client, records, jobs } = await fixture();
  const namespace = keygen("ns");
  const claim = await dedupe(client.records, { namespace, id: "evt_1" });
  assert.equal(claim.state, "claimed");
  assert.equal(
    (await dedupe(client.records, { namespace, id: "evt_1" })).state,
    "in_progress",
  );
  assert.equal(claim.state === "claimed" && await claim.done(), true);
  assert.deepEqual(await dedupe(records, { namespace, id: "evt_1" }), { state: "duplicate" });

  const job = keygen("cron");
  const ran = await cronGuard(
    client.jobs,
    job,
    { atMostMs: 5000, tick: "t1" },
    (run) => run.fence,
  );
  assert.ok(ran.ran && ran.value > 0);
  const again = await cronGuard(jobs, job, { atMostMs: 5000, tick: "t1" }, () => 0);
  assert.deepEqual(again.ran ? "ran" : again.reason, "tick_done");

  let runs = 0;
  const shop = new Hono();
  shop.post(
    "/orders",
    idempotency({ records: client.records, scope: () => "u1" }),
    (c) => {
      runs++;
      return c.json({ order: runs }, 201);
    },
  );
  const key = { "idempotency-key": crypto.randomUUID() };
  const first = await shop.request("/orders", { method: "POST", headers: key });
  const replay = await shop.request("/orders", { method: "POST", headers: key });
  assert.deepEqual([first.status, await first.json()], [201, { order: 1 }]);
  assert.deepEqual([replay.status, await replay.json()], [201, { order: 1 }]);
  assert.equal(replay.headers.get("idempotent-replayed"), "true");
  assert.equal(runs, 1);
});

Deno.test("a busy acquire through the client says when the lease ends", async () => {
  const { client } = await fixture();
  const name = keygen();
  const held = await client.acquire(name, { ttlMs: 4000 });
  const busy = await client.acquire(name);
  assert.ok(held.acquired && !busy.acquired);
  assert.ok(Math.abs(busy.lockExpiresAt! - held.lease.expiresAt) <= 5);
});

Deno.test("a retried acquire's first attempt that lands after the release is refused, not granted", async () => {
  const { app, backend } = await fixture();
  // The first attempt fails at the client (a reset, a proxy's 503) but is still on its way.
  const late: Request[] = [];
  const client = createClient({
    baseUrl: "http://edgelock.test",
    apiKey: SECRET,
    fetch: (input, init) => {
      const request = new Request(input, init);
      if (late.length === 0 && request.url.endsWith("/acquire")) {
        late.push(request.clone());
        return Promise.reject(new TypeError("connection reset"));
      }
      return Promise.resolve(app.fetch(request));
    },
  });
  const locks = new Locks(backend.redis, { prefix: "edgelock:t" });
  for (const options of [{}, { reentrant: true }, { mode: "shared" as const }]) {
    const name = keygen();
    late.length = 0;
    const held = await client.acquire(name, { ttlMs: 60_000, ...options });
    assert.ok(held.acquired, "the retry was granted");
    assert.equal(await client.release(held.lease), true);
    const copy = await app.fetch(late[0]!);
    assert.equal(copy.status, 409, await copy.clone().text());
    assert.equal((await copy.json()).code, "lock_lost");
    assert.equal((await client.inspect(name)).held, false, "no lease left behind");
    const next = await locks.acquire(name, { ttlMs: 1000 });
    assert.ok(next.acquired, "the name is free for the next caller");
    await locks.release(next.lease);
  }
  // A token the caller chose may be used again: that acquire is granted, as before.
  const name = keygen();
  const token = "chosen-token-again-0001";
  const first = await client.acquire(name, { token });
  assert.ok(first.acquired && await client.release(first.lease));
  const again = await client.acquire(name, { token });
  assert.ok(again.acquired && again.lease.fence > first.lease.fence);
  assert.equal(await client.release(again.lease), true);
});

Deno.test("the client's renewal tells the lease as the service does, not as the reference said", async () => {
  const { client } = await fixture();
  const name = keygen();
  const token = "client-renew-kind-0001";
  const shared = await client.acquire(name, { token, mode: "shared" });
  assert.ok(shared.acquired && await client.release(shared.lease));
  const reentrant = await client.acquire(name, { token, reentrant: true });
  assert.ok(reentrant.acquired && await client.release(reentrant.lease));
  const plain = await client.acquire(name, { token });
  assert.ok(plain.acquired);
  const stale = { name, token, mode: "shared", holdCount: 1 } as never;
  const renewed = await client.renew(stale);
  assert.ok(renewed.renewed);
  const { mode, holdCount, hold } = renewed.lease;
  assert.deepEqual({ mode, holdCount, hold }, {
    mode: undefined,
    holdCount: undefined,
    hold: undefined,
  });
  const [many] = await client.renewMany([stale]);
  assert.ok(many?.renewed && many.lease.mode === undefined);
  assert.deepEqual(
    await client.renew({ name, token, hold: reentrant.lease.hold! }),
    { renewed: false },
    "a released hold is not renewed",
  );
  assert.equal(await client.release(renewed.lease), true);
  assert.equal((await client.inspect(name)).held, false);
});

Deno.test("the client checks a renewal's lease as the library does, before any request", async () => {
  const { client, backend } = await fixture();
  const locks = new Locks(backend.redis);
  const before = backend.requests();
  const bad: [unknown, RegExp][] = [
    [{ name: "n", token: "a-token-0000000001", hold: 5 }, /hold id must be a string/],
    [{ name: "n", token: "a-token-0000000001", hold: "x" }, /hold id must be 8–32/],
    [{ name: "n", token: "a-token-0000000001", next: "!!" }, /next/],
  ];
  for (const [lease, message] of bad) {
    for (const renew of [client.renew, locks.renew.bind(locks)]) {
      await assert.rejects(renew(lease as Lease), message);
    }
    await assert.rejects(client.renewMany([lease as Lease]), message);
  }
  await assert.rejects(client.renewMany(new Array(2)), TypeError);
  await assert.rejects(client.acquire("n", { meta: new Date() as never }), TypeError);
  assert.equal(backend.requests(), before, "nothing was sent");
});

Deno.test("a lease whose fence is not a fence is a RangeError, as in the library, and ends nothing", async () => {
  const { client, backend } = await fixture();
  const name = keygen();
  const token = "chosen-token-00000000005";
  const first = await client.acquire(name, { token, ttlMs: 60_000 });
  assert.ok(first.acquired);
  assert.equal(await client.release(first.lease), true);
  const second = await client.acquire(name, { token, ttlMs: 60_000 });
  assert.ok(second.acquired);
  // A lease kept as JSON text: its fence a string. Dropped, the release would mean the token's
  // latest lease, the second (helper-32's case).
  for (const fence of [String(first.lease.fence), Number.NaN, 0, -1, 1.5]) {
    const stale = { name, token, fence } as unknown as Lease;
    await assert.rejects(client.release(stale), RangeError);
    await assert.rejects(new Locks(backend.redis).release(stale), RangeError);
    await assert.rejects(client.renew(stale), RangeError, "renew refuses it too");
    await assert.rejects(client.renewMany([stale]), RangeError);
  }
  const info = await client.inspect(name);
  assert.ok(info.held && info.fence === second.lease.fence, "the second lease stands");
  // The first lease itself, fence and all, is lost: a renewal goes by the fence it is sent.
  assert.deepEqual(await client.renew(first.lease, { ttlMs: 120_000 }), { renewed: false });
  assert.deepEqual(await client.renewMany([first.lease]), [{ renewed: false }]);
  const kept = await client.inspect(name);
  assert.ok(kept.held && kept.ttlMs! <= 60_000, "the second lease keeps its own end");
  assert.equal(await client.release(second.lease), true);
});

Deno.test("the client's lease keeps next, and its release through another instance hands over in place", async () => {
  const { client, backend } = await fixture();
  const other = createApp({ redis: backend.redis, apiKeys: [{ tenant: "t", secret: SECRET }] });
  const elsewhere = createClient({
    baseUrl: "http://edgelock.test",
    apiKey: SECRET,
    fetch: (input, init) => Promise.resolve(other.fetch(new Request(input, init))),
  });
  const name = keygen();
  const queueKey = `edgelock:t:lock:{${name}}:queue`;
  const held = await client.acquire(name, { ttlMs: 10_000 });
  assert.ok(held.acquired);
  const first = client.acquire(name, { ttlMs: 10_000, waitMs: 20_000 });
  await until("one waiter", async () => await backend.redis.zcard(queueKey) === 1);
  const second = client.acquire(name, { ttlMs: 10_000, waitMs: 20_000 });
  await until("two waiters", async () => await backend.redis.zcard(queueKey) === 2);
  assert.equal(await elsewhere.release(held.lease), true);
  const lease = await first;
  assert.ok(lease.acquired && typeof lease.lease.next === "string");
  await assert.rejects(
    elsewhere.release({ ...lease.lease, next: "not,a,next:" }),
    (error: unknown) => error instanceof TypeError && /lease's next/.test(error.message),
  );
  // A renewed lease keeps it, through either call.
  const renewed = await client.renew(lease.lease, { ttlMs: 10_000 });
  assert.ok(renewed.renewed && renewed.lease.next === lease.lease.next);
  const [many] = await client.renewMany([renewed.lease], { ttlMs: 10_000 });
  assert.ok(many?.renewed && many.lease.next === lease.lease.next);
  const before = backend.requests();
  assert.equal(await elsewhere.release(many.lease), true);
  const last = await second;
  assert.ok(last.acquired);
  assert.equal(backend.requests() - before, 1, "the release alone");
  assert.equal(await client.release(last.lease), true);
});

Deno.test("bad record ids and kinds are RangeErrors before any request", async () => {
  const { client } = await fixture();
  await assert.rejects(client.records.get("idempotency", "one-segment"), /scope\/key/);
  await assert.rejects(client.records.get("other" as never, "a/b"), /kind must be/);
  const cycle: Record<string, unknown> = {};
  cycle.self = cycle;
  await assert.rejects(
    client.records.complete("idempotency", "a/b", "t".repeat(16), cycle),
    { name: "TypeError", message: /response cannot be sent as JSON/ },
  );
  // An acquire's options are checked by the library's own checks (the signal too).
  await assert.rejects(client.acquire("a", { signal: 5 as never }), {
    name: "TypeError",
    message: "signal must be an AbortSignal",
  });
  // The client's list checks its page as LockOps does, before any request.
  await assert.rejects(client.list({ limit: 0 }), {
    name: "RangeError",
    message: "limit must be an integer from 1 to 1000",
  });
  assert.throws(
    () => createClient(undefined as never),
    /createClient\(\) needs \{ baseUrl, apiKey \}/,
  );
  const wrong = { fetch: /fetch must be a function/, tenant: /tenant must be a string/ };
  for (const [option, message] of Object.entries(wrong)) {
    assert.throws(
      () => createClient({ baseUrl: "http://edgelock.test", apiKey: SECRET, [option]: 5 } as never),
      { name: "TypeError", message },
    );
  }
  await assert.rejects(client.jobs.start("a b", { atMostMs: 1000 }), /job name/);
});

Deno.test("an option the client or a helper does not take is a TypeError naming the likeliest", async () => {
  const { client, app } = await fixture();
  const name = keygen();
  const slip = (where: string, key: string, meant: string) => ({
    name: "TypeError",
    message: `${where} has no option "${key}"; did you mean "${meant}"?`,
  });
  assert.throws(
    () => createClient({ baseUrl: "http://edgelock.test", apiKey: SECRET, retry: 1 } as never),
    slip("createClient()", "retry", "retries"),
  );
  await assert.rejects(
    client.acquire(name, { ttl: 5000 } as never),
    slip("acquire()", "ttl", "ttlMs"),
  );
  await assert.rejects(
    client.acquireAll([name], { waitMS: 10 } as never),
    slip("acquireAll()", "waitMS", "waitMs"),
  );
  await assert.rejects(
    client.withLock(name, { ifAvaliable: true } as never, () => {}),
    slip("withLock()", "ifAvaliable", "ifAvailable"),
  );
  await assert.rejects(
    client.withLocks([name], { ttl: 5000 } as never, () => {}),
    slip("withLocks()", "ttl", "ttlMs"),
  );
  await assert.rejects(
    cronGuard(client.jobs, name, { atMost: 5000 } as never, () => {}),
    slip("cronGuard()", "atMost", "atMostMs"),
  );
  await assert.rejects(
    client.jobs.start(name, { atMostMs: 5000, ticks: 1 } as never),
    slip("start()", "ticks", "tick"),
  );
  await assert.rejects(
    client.records.claim("dedupe", `n/${name}`, { lease: 5 } as never),
    slip("claim()", "lease", "leaseMs"),
  );
  await assert.rejects(client.list({ limt: 1 } as never), slip("list()", "limt", "limit"));
  await assert.rejects(client.audit({ limt: 1 } as never), slip("audit()", "limt", "limit"));
  await assert.rejects(
    client.break(name, { reson: "x" } as never),
    slip("break()", "reson", "reason"),
  );
  await assert.rejects(
    dedupe(client.records, { namespace: "n", id: name, lease: 1 } as never),
    slip("dedupe()", "lease", "leaseMs"),
  );
  const { records } = await fixture();
  await assert.rejects(
    records.claim("idempotency", `s/${name}`, { ttl: 5000 } as never),
    { name: "TypeError", message: 'claim() has no option "ttl"' },
  );
  assert.throws(
    () => idempotency({ records, scope: () => "u", wait: 1 } as never),
    slip("idempotency()", "wait", "waitMs"),
  );
  assert.throws(
    () => webhookDedupe({ records, secrets: ["whsec_AAAA"], namespace: "b", ttl: 1 } as never),
    { name: "TypeError", message: 'webhookDedupe() has no option "ttl"' },
  );
  // Over HTTP, the service names the field it does not know and the likeliest meant.
  const problem = await app.request(`/v1/locks/${name}/acquire`, {
    method: "POST",
    headers: { authorization: `Bearer ${SECRET}`, "content-type": "application/json" },
    body: JSON.stringify({ ttl: 5000 }),
  });
  assert.equal(problem.status, 400);
  assert.deepEqual((await problem.json()).errors, [
    { path: "(body)", message: "unknown field: ttl (did you mean ttlMs?)" },
  ]);
  const two = await app.request(`/v1/locks/${name}/acquire`, {
    method: "POST",
    headers: { authorization: `Bearer ${SECRET}`, "content-type": "application/json" },
    body: JSON.stringify({ ttl: 5000, wait: 10, colour: "red" }),
  });
  assert.deepEqual((await two.json()).errors, [{
    path: "(body)",
    message: "unknown fields: ttl (did you mean ttlMs?), wait (did you mean waitMs?), colour",
  }]);
});

Deno.test("a cron trigger whose start reply is lost runs the tick once, through the client's retry", async () => {
  const { app } = await fixture();
  let lost = 0;
  const client = createClient({
    baseUrl: "http://edgelock.test",
    apiKey: SECRET,
    fetch: async (input, init) => {
      const request = new Request(input, init);
      const response = await app.fetch(request);
      // The first start reaches the service; its reply does not reach the client.
      if (request.url.endsWith("/start") && lost++ === 0) throw new TypeError("connection reset");
      return response;
    },
  });
  const job = keygen("nightly");
  let runs = 0;
  const first = await cronGuard(client.jobs, job, { atMostMs: 60_000, tick: 1 }, () => runs++);
  assert.ok(first.ran, JSON.stringify(first));
  const second = await cronGuard(client.jobs, job, { atMostMs: 60_000, tick: 1 }, () => runs++);
  assert.deepEqual(second.ran ? "ran" : second.reason, "tick_done");
  assert.equal(runs, 1);
  assert.equal(lost, 3, "the lost start, its retry, and the second trigger's start");
});
