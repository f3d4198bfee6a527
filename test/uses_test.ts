import assert from "node:assert/strict";
import { Hono } from "hono";
import { Redis } from "@upstash/redis";
import { createApp } from "../src/service/mod.ts";
import { cronGuard } from "../src/uses/cron.ts";
import { dedupe } from "../src/uses/dedupe.ts";
import { webhookDedupe } from "../src/hono/webhook_dedupe.ts";
import { idempotency, parseKey } from "../src/hono/idempotency.ts";
import { Jobs, type JobStart } from "../src/uses/jobs.ts";
import { recordId, Records } from "../src/uses/records.ts";
import { freePort } from "../dev/redis_server.ts";
import { keygen, shared, startBackend, until } from "./_backend.ts";

// Response.json() is typed unknown once Miniflare's types are loaded; tests read fields freely.
// deno-lint-ignore no-explicit-any
type Json = Record<string, any>;
const jsonOf = async (res: Response): Promise<Json> => await res.json() as Json;
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const SECRET = "whsec_" + btoa("a-webhook-signing-secret-32bytes");

// Records on a port nothing listens on: every call fails as with Redis down.
function unreachableRecords(): Records {
  return new Records(
    new Redis({ url: `http://127.0.0.1:${freePort()}`, token: "x", retry: false }),
  );
}

async function sign(id: string, timestamp: number, body: string, secret = SECRET) {
  const key = await crypto.subtle.importKey(
    "raw",
    Uint8Array.from(atob(secret.slice(6)), (ch) => ch.charCodeAt(0)),
    { name: "HMAC", hash: "SHA-256" },
    false,
    ["sign"],
  );
  const mac = await crypto.subtle.sign(
    "HMAC",
    key,
    new TextEncoder().encode(`${id}.${timestamp}.${body}`),
  );
  return `v1,${btoa(String.fromCharCode(...new Uint8Array(mac)))}`;
}

const fixture = shared(async () => {
  const backend = await startBackend();
  const records = new Records(backend.redis);
  const jobs = new Jobs(backend.redis);
  return { backend, records, jobs };
}, ({ backend }) => backend.stop());

Deno.test("50 concurrent submissions with one Idempotency-Key run the handler exactly once", async () => {
  const { records } = await fixture();
  let runs = 0;
  const app = new Hono();
  app.post("/orders", idempotency({ records, scope: () => "user-1" }), async (c) => {
    runs++;
    await sleep(100);
    c.header("set-cookie", "session=secret");
    return c.json({ orderId: "o-1", run: runs }, 201);
  });
  const key = crypto.randomUUID();
  const submit = () =>
    app.request("/orders", {
      method: "POST",
      headers: { "idempotency-key": key, "content-type": "application/json" },
      body: JSON.stringify({ item: "book", qty: 1 }),
    });
  const replies = await Promise.all(Array.from({ length: 50 }, submit));
  assert.equal(runs, 1);
  const statuses = replies.map((r) => r.status);
  assert.ok(statuses.every((s) => s === 201 || s === 409), statuses.join());
  assert.equal(
    statuses.filter((s) => s === 201).length,
    1 + replies.filter((r) => r.headers.get("idempotent-replayed")).length,
  );
  for (const reply of replies) {
    if (reply.status === 409) {
      assert.ok(Number(reply.headers.get("retry-after")) >= 1);
      assert.equal((await jsonOf(reply)).code, "in_progress");
    } else await reply.body?.cancel();
  }
  const replay = await submit();
  assert.equal(replay.status, 201);
  assert.equal(replay.headers.get("idempotent-replayed"), "true");
  assert.equal(replay.headers.get("content-type"), "application/json");
  assert.equal(replay.headers.get("set-cookie"), null, "Set-Cookie is never replayed");
  assert.deepEqual(await jsonOf(replay), { orderId: "o-1", run: 1 });
  assert.equal(runs, 1);

  const reordered = await app.request("/orders", {
    method: "POST",
    headers: { "idempotency-key": key, "content-type": "application/json" },
    body: '{ "qty": 1, "item": "book" }',
  });
  assert.equal(
    reordered.status,
    201,
    "the same JSON in another key order is the same payload",
  );
  await reordered.body?.cancel();
  const other = await app.request("/orders", {
    method: "POST",
    headers: { "idempotency-key": key, "content-type": "application/json" },
    body: JSON.stringify({ item: "car", qty: 1 }),
  });
  assert.equal(other.status, 422);
  assert.equal((await jsonOf(other)).code, "fingerprint_mismatch");
  assert.equal(runs, 1);
});

Deno.test("idempotency() rejects missing and malformed keys, and scopes keys per user", async () => {
  const { records } = await fixture();
  const app = new Hono();
  let runs = 0;
  app.post(
    "/pay",
    idempotency({ records, scope: (c) => c.req.header("x-user") ?? "anon" }),
    (c) => {
      runs++;
      return c.json({ ok: true });
    },
  );
  const pay = (headers: Record<string, string>) =>
    app.request("/pay", { method: "POST", headers, body: "{}" });
  assert.equal((await pay({})).status, 400);
  // '"a, b"' is how the headers '"a' and 'b"' arrive: a repeated key, joined.
  for (
    const bad of ['"a", "b"', "a, b", '"a, b"', "", "x".repeat(256), '"unterminated', "spa ce"]
  ) {
    const res = await pay({ "idempotency-key": bad });
    assert.equal(res.status, 400, JSON.stringify(bad));
    assert.equal(res.headers.get("content-type"), "application/problem+json");
    await res.body?.cancel();
  }
  assert.equal(runs, 0);
  const key = crypto.randomUUID();
  await (await pay({ "idempotency-key": key, "x-user": "alice" })).body?.cancel();
  await (await pay({ "idempotency-key": `"${key}"`, "x-user": "alice" })).body?.cancel();
  await (await pay({ "idempotency-key": key, "x-user": "bob" })).body?.cancel();
  assert.equal(runs, 2, "a quoted key is the same key; another user has their own");
  assert.equal(parseKey('"a\\"b"'), 'a"b');
});

Deno.test("idempotency() answers an empty scope (an anonymous caller) with a 400 problem, not a 5xx", async () => {
  const { records } = await fixture();
  const app = new Hono();
  let runs = 0;
  app.post(
    "/pay",
    idempotency({ records, scope: (c) => c.req.header("x-user") ?? "" }),
    (c) => {
      runs++;
      return c.json({ ok: true });
    },
  );
  const res = await app.request("/pay", {
    method: "POST",
    headers: { "idempotency-key": crypto.randomUUID() },
    body: "{}",
  });
  assert.equal(res.status, 400);
  assert.equal(res.headers.get("content-type"), "application/problem+json");
  assert.match((await res.json()).detail, /no idempotency scope/);
  assert.equal(runs, 0, "the handler did not run without a record");
});

Deno.test("idempotency() never shares a record between users, whatever their scope strings", async () => {
  const { records } = await fixture();
  const app = new Hono();
  app.post(
    "/pay",
    idempotency({ records, scope: (c) => c.req.header("x-user")! }),
    (c) => c.json({ paidBy: c.req.header("x-user") }, 201),
  );
  const key = crypto.randomUUID();
  const pay = (user: string) =>
    app.request("/pay", {
      method: "POST",
      headers: { "idempotency-key": key, "x-user": user },
      body: "{}",
    });
  const alice = "alice@example.com"; // outside the name characters: stored hashed
  const digest = Array.from(
    new Uint8Array(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(alice))),
    (b) => b.toString(16).padStart(2, "0"),
  ).join("");
  assert.deepEqual(await jsonOf(await pay(alice)), { paidBy: alice });
  for (const other of [`h-${digest}`, digest, `#${digest}`]) {
    const res = await pay(other);
    assert.equal(res.headers.get("idempotent-replayed"), null, `${other} replayed alice's`);
    assert.deepEqual(await jsonOf(res), { paidBy: other });
  }
});

Deno.test("idempotency() answers 422 to any payload difference: query, bytes, big integers, type", async () => {
  const { records } = await fixture();
  const app = new Hono();
  let runs = 0;
  app.post("/orders", idempotency({ records, scope: () => "fp-user" }), (c) => {
    runs++;
    return c.json({ run: runs }, 201);
  });
  const send = (
    key: string,
    { query = "", body = "{}" as BodyInit, type = "application/json" } = {},
  ) =>
    app.request(`/orders${query}`, {
      method: "POST",
      headers: { "idempotency-key": key, "content-type": type },
      body,
    });
  const pairs: [string, Parameters<typeof send>[1], Parameters<typeof send>[1]][] = [
    ["query string", { query: "?amount=1" }, { query: "?amount=999" }],
    ["non-UTF-8 bytes", { body: new Uint8Array([0xff]) }, { body: new Uint8Array([0xfe]) }],
    [
      "integers beyond 2^53",
      { body: '{"amount":9007199254740993}' },
      { body: '{"amount":9007199254740992}' },
    ],
    ["Content-Type", { type: "application/json" }, { type: "text/plain" }],
    ["JSON's spacing, sent as text", { type: "text/plain", body: "42" }, {
      type: "text/plain",
      body: " 42\n",
    }],
  ];
  for (const [what, first, second] of pairs) {
    const key = crypto.randomUUID();
    assert.equal((await send(key, first)).status, 201, what);
    const replay = await send(key, first);
    assert.equal(replay.headers.get("idempotent-replayed"), "true", `${what}: same replays`);
    await replay.body?.cancel();
    const res = await send(key, second);
    assert.equal(res.status, 422, `${what}: a different payload is a mismatch`);
    assert.equal((await jsonOf(res)).code, "fingerprint_mismatch");
  }
  assert.equal(runs, pairs.length);
});

Deno.test("idempotency() keeps a record per method, path and key, whatever spaces they hold", async () => {
  const { records } = await fixture();
  const app = new Hono();
  let runs = 0;
  app.post("/echo/*", idempotency({ records, scope: () => "spaces" }), (c) => {
    runs++;
    return c.json({ path: c.req.path }, 201);
  });
  const key = crypto.randomUUID().slice(0, 8);
  // "POST /echo/a" with the key "b <key>" and "POST /echo/a b" with "<key>" spell one string.
  const first = await app.request("/echo/a", {
    method: "POST",
    headers: { "idempotency-key": `"b ${key}"` },
  });
  assert.equal(first.status, 201);
  const second = await app.request("/echo/a%20b", {
    method: "POST",
    headers: { "idempotency-key": key },
  });
  assert.equal(second.status, 201, "a request of its own, neither a replay nor a mismatch");
  assert.equal(second.headers.get("idempotent-replayed"), null);
  assert.equal(runs, 2);
});

Deno.test("a reply body too large to store replays marked as omitted, never as an empty real body", async () => {
  const { records } = await fixture();
  const app = new Hono();
  app.post("/report", idempotency({ records, scope: () => "big" }), (c) => {
    const size = Number(c.req.query("size"));
    return c.json({ data: "x".repeat(size) }, 200);
  });
  const call = (key: string, size: number) =>
    app.request(`/report?size=${size}`, {
      method: "POST",
      headers: { "idempotency-key": key },
    });
  const small = crypto.randomUUID();
  const first = await call(small, 36_000);
  const text = await first.text();
  const replay = await call(small, 36_000);
  assert.equal(replay.headers.get("idempotent-replayed"), "true");
  assert.equal(replay.headers.get("content-type"), "application/json");
  assert.equal(await replay.text(), text, "36,000 bytes replay whole");

  const large = crypto.randomUUID();
  await (await call(large, 40_000)).body?.cancel();
  const omitted = await call(large, 40_000);
  assert.equal(omitted.status, 200);
  assert.equal(omitted.headers.get("idempotent-replayed"), "true");
  assert.equal(omitted.headers.get("idempotent-body"), "omitted");
  assert.equal(omitted.headers.get("content-type"), null, "no type for a body it lacks");
  assert.equal(await omitted.text(), "");
});

Deno.test("a kept header too long for the store is left out of the replay, and the handler runs once", async () => {
  const { records } = await fixture();
  let runs = 0;
  const app = new Hono();
  app.post("/orders", idempotency({ records, scope: () => "long-header" }), (c) => {
    runs++;
    // e.g. a Location with a long signed query: alone past the store's 48 KiB
    return c.text("made", 201, {
      "content-language": "en",
      location: `/orders/1?sig=${"x".repeat(50_000)}`,
    });
  });
  const key = crypto.randomUUID();
  const call = () =>
    app.request("/orders", { method: "POST", headers: { "idempotency-key": key } });
  const first = await call();
  assert.equal(first.status, 201);
  assert.equal(await first.text(), "made");
  const replay = await call();
  assert.equal(replay.status, 201);
  assert.equal(replay.headers.get("idempotent-replayed"), "true");
  assert.equal(replay.headers.get("idempotent-body"), "omitted");
  assert.equal(replay.headers.get("content-language"), "en", "the headers that fit are kept");
  assert.equal(replay.headers.get("location"), null);
  assert.equal(await replay.text(), "");
  assert.equal(runs, 1);
});

Deno.test("idempotency() refuses a header name it could not read, when it is built", async () => {
  const { records } = await fixture();
  assert.throws(
    () => idempotency({ records, scope: () => "u", replayHeaders: ["content-type", "x bad"] }),
    { name: "TypeError", message: 'replayHeaders holds "x bad", which is no header name' },
  );
  assert.throws(
    () => idempotency({ records, scope: () => "u", fingerprintHeaders: ["x:y"] }),
    { name: "TypeError", message: 'fingerprintHeaders holds "x:y", which is no header name' },
  );
});

Deno.test("a reply whose body fails as it is read is stored as omitted: the handler runs once", async () => {
  const { records } = await fixture();
  let runs = 0;
  const app = new Hono();
  app.post("/stream", idempotency({ records, scope: () => "broken-stream" }), () => {
    runs++;
    const body = new ReadableStream({
      pull(controller) {
        controller.error(new Error("the upstream went away"));
      },
    });
    return new Response(body, { status: 201 });
  });
  const key = crypto.randomUUID();
  const call = () =>
    app.request("/stream", { method: "POST", headers: { "idempotency-key": key } });
  const first = await call();
  assert.equal(first.status, 201);
  await first.body?.cancel().catch(() => {}); // the stream failed already
  const replay = await call();
  assert.equal(replay.status, 201);
  assert.equal(replay.headers.get("idempotent-body"), "omitted");
  await replay.body?.cancel();
  assert.equal(runs, 1);
});

Deno.test("a reply still streaming after the lease is stored as omitted: the handler runs once", async () => {
  const { records } = await fixture();
  let runs = 0;
  const app = new Hono();
  app.post("/export", idempotency({ records, scope: () => "slow-stream", leaseMs: 1000 }), () => {
    runs++;
    let sent = 0;
    const body = new ReadableStream<Uint8Array>({
      async pull(controller) {
        await sleep(500);
        if (sent++ < 6) controller.enqueue(new TextEncoder().encode("row\n"));
        else controller.close();
      },
    });
    return new Response(body, { status: 201, headers: { "content-type": "text/csv" } });
  });
  const key = crypto.randomUUID();
  const call = () =>
    app.request("/export", { method: "POST", headers: { "idempotency-key": key } });
  const first = await call();
  assert.equal(first.status, 201);
  const retry = await call(); // the first is still streaming: its record was kept without it
  assert.equal(retry.status, 201);
  assert.equal(retry.headers.get("idempotent-body"), "omitted");
  await retry.body?.cancel();
  assert.equal(await first.text(), "row\n".repeat(6), "the first caller gets the whole stream");
  assert.equal(runs, 1);
});

Deno.test("server-sent events are stored as omitted at once, never read to their end", async () => {
  const { records } = await fixture();
  let runs = 0;
  let ticking: ReturnType<typeof setInterval> | undefined;
  const app = new Hono();
  app.post("/events", idempotency({ records, scope: () => "sse" }), () => {
    runs++;
    const body = new ReadableStream<Uint8Array>({
      start(controller) {
        ticking = setInterval(
          () => controller.enqueue(new TextEncoder().encode("data: x\n\n")),
          20,
        );
      },
      cancel() {
        clearInterval(ticking);
      },
    });
    return new Response(body, { headers: { "content-type": "text/event-stream" } });
  });
  const key = crypto.randomUUID();
  const call = () =>
    app.request("/events", { method: "POST", headers: { "idempotency-key": key } });
  const first = await call(); // answers at once, though its stream never ends
  try {
    const replay = await call();
    assert.equal(replay.headers.get("idempotent-body"), "omitted");
    await replay.body?.cancel();
    assert.equal(runs, 1);
  } finally {
    await first.body?.cancel();
    clearInterval(ticking);
  }
});

Deno.test("a reply replays with its encoding, and a body of no bytes is never stored as whole", async () => {
  const { records } = await fixture();
  let runs = 0;
  const app = new Hono();
  const middleware = idempotency({ records, scope: () => "bytes" });
  app.post("/gzip", middleware, async () => {
    runs++;
    const gzipped = new Response(
      new Blob([JSON.stringify({ order: "o-1" })]).stream().pipeThrough(
        new CompressionStream("gzip"),
      ),
    );
    return new Response(await gzipped.arrayBuffer(), {
      status: 201,
      headers: { "content-type": "application/json", "content-encoding": "gzip" },
    });
  });
  // A handler's bug: a string enqueued where bytes go (workerd sends any ArrayBuffer or view).
  app.post("/text", middleware, () => {
    runs++;
    const body = new ReadableStream({
      start(controller) {
        controller.enqueue("not bytes");
        controller.close();
      },
    });
    return new Response(body as ReadableStream<Uint8Array>, { status: 201 });
  });
  const call = (path: string, key: string) =>
    app.request(path, { method: "POST", headers: { "idempotency-key": key } });
  const key = crypto.randomUUID();
  const first = await call("/gzip", key);
  const firstBytes = new Uint8Array(await first.arrayBuffer());
  const replay = await call("/gzip", key);
  assert.equal(replay.headers.get("idempotent-replayed"), "true");
  assert.equal(replay.headers.get("content-encoding"), "gzip");
  assert.deepEqual(new Uint8Array(await replay.arrayBuffer()), firstBytes);
  const other = crypto.randomUUID();
  await (await call("/text", other)).arrayBuffer().catch(() => {}); // the caller's read fails
  const stored = await call("/text", other);
  assert.equal(stored.headers.get("idempotent-body"), "omitted");
  await stored.body?.cancel();
  assert.equal(runs, 2);
});

Deno.test("a 5xx or a thrown error releases the claim so a retry runs again", async () => {
  const { records } = await fixture();
  let runs = 0;
  const app = new Hono();
  app.post("/flaky", idempotency({ records, scope: () => "u" }), (c) => {
    runs++;
    if (runs === 1) return c.json({ error: "down" }, 503);
    if (runs === 2) throw new Error("boom");
    return c.json({ ok: runs });
  });
  app.onError((_error, c) => c.json({ error: "handler threw" }, 500));
  const key = crypto.randomUUID();
  const call = () => app.request("/flaky", { method: "POST", headers: { "idempotency-key": key } });
  assert.equal((await call()).status, 503);
  assert.equal((await call()).status, 500);
  const third = await call();
  assert.deepEqual([third.status, await jsonOf(third)], [200, { ok: 3 }]);
  const fourth = await call();
  assert.equal(fourth.headers.get("idempotent-replayed"), "true");
  assert.deepEqual(await jsonOf(fourth), { ok: 3 });
  assert.equal(runs, 3);
});

Deno.test("with waitMs a retry waits for the first request and replays it", async () => {
  const { records } = await fixture();
  let runs = 0;
  const app = new Hono();
  app.post("/slow", idempotency({ records, scope: () => "u", waitMs: 3000 }), async (c) => {
    runs++;
    await sleep(200);
    return c.text("made", 201);
  });
  const key = crypto.randomUUID();
  const call = () => app.request("/slow", { method: "POST", headers: { "idempotency-key": key } });
  const [a, b] = await Promise.all([call(), call()]);
  assert.deepEqual([a.status, b.status], [201, 201]);
  assert.deepEqual([await a.text(), await b.text()], ["made", "made"]);
  assert.equal(runs, 1);
});

Deno.test("idempotency() answers 503 when Redis is unreachable, never passing through", async () => {
  const down = unreachableRecords();
  let runs = 0;
  const app = new Hono();
  app.post("/x", idempotency({ records: down, scope: () => "u" }), (c) => {
    runs++;
    return c.text("ran");
  });
  const res = await app.request("/x", {
    method: "POST",
    headers: { "idempotency-key": "k1" },
  });
  assert.equal(res.status, 503);
  assert.equal((await jsonOf(res)).code, "backend_unavailable");
  assert.equal(runs, 0);
});

Deno.test("webhookDedupe() answers 503 problem+json when Redis is unreachable, never passing through", async () => {
  const down = unreachableRecords();
  let runs = 0;
  const app = new Hono();
  app.post(
    "/hook",
    webhookDedupe({ records: down, secrets: [SECRET], namespace: "n" }),
    (c) => {
      runs++;
      return c.text("ok");
    },
  );
  const body = '{"a":1}';
  const timestamp = Math.floor(Date.now() / 1000);
  const res = await app.request("/hook", {
    method: "POST",
    headers: {
      "webhook-id": "msg_down",
      "webhook-timestamp": String(timestamp),
      "webhook-signature": await sign("msg_down", timestamp, body),
    },
    body,
  });
  assert.equal(res.status, 503);
  assert.equal(res.headers.get("content-type"), "application/problem+json");
  assert.equal(res.headers.get("retry-after"), "1");
  const problem = await jsonOf(res);
  assert.equal(problem.code, "backend_unavailable");
  assert.doesNotMatch(JSON.stringify(problem), /msg_down|dedupe:|claim|ECONNREFUSED/);
  assert.equal(runs, 0);
});

Deno.test("a claim whose worker died frees after its lease; the late complete is refused", async () => {
  const { records } = await fixture();
  const id = recordId("user-9", keygen("k"));
  const first = await records.claim("idempotency", id, { leaseMs: 600 });
  assert.equal(first.state, "claimed");
  assert.equal((await records.claim("idempotency", id)).state, "in_progress");
  await until(
    "the dead worker's lease ends",
    async () => (await records.get("idempotency", id)).state === "absent",
  );
  const second = await records.claim("idempotency", id, { leaseMs: 5000 });
  assert.ok(second.state === "claimed" && first.state === "claimed");
  assert.ok(second.fence > first.fence);
  assert.equal(
    await records.complete("idempotency", id, second.token, { status: 201, body: "new" }),
    true,
  );
  assert.equal(
    await records.complete("idempotency", id, first.token, { status: 500, body: "old" }),
    false,
  );
  assert.equal(await records.release("idempotency", id, first.token), false);
  const record = await records.get("idempotency", id);
  assert.ok(record.state === "completed");
  assert.deepEqual(record.response, { status: 201, body: "new" });
  const replay = await records.claim("idempotency", id);
  assert.deepEqual(replay, { state: "completed", response: { status: 201, body: "new" } });
});

Deno.test("1,000 deliveries of 100 webhook ids, shuffled and concurrent, process each id once", async () => {
  const { records } = await fixture();
  const namespace = keygen("hooks").replaceAll("-", "");
  const processed = new Map<string, number>();
  const app = new Hono();
  app.post("/hook", webhookDedupe({ records, secrets: [SECRET], namespace }), async (c) => {
    const { id } = await c.req.json();
    processed.set(id, (processed.get(id) ?? 0) + 1);
    await sleep(Math.random() * 10);
    return c.text("ok");
  });
  const ids = Array.from(
    { length: 100 },
    (_, i) => `msg_${i}_${crypto.randomUUID().slice(0, 8)}`,
  );
  const deliveries = Array.from({ length: 1000 }, (_, i) => ids[i % 100]!);
  deliveries.sort(() => Math.random() - 0.5);
  const deliver = async (id: string) => {
    const body = JSON.stringify({ id });
    const timestamp = Math.floor(Date.now() / 1000);
    for (let attempt = 0; attempt < 100; attempt++) {
      const res = await app.request("/hook", {
        method: "POST",
        headers: {
          "webhook-id": id,
          "webhook-timestamp": String(timestamp),
          "webhook-signature": await sign(id, timestamp, body),
        },
        body,
      });
      await res.body?.cancel();
      if (res.status === 200) return;
      assert.equal(res.status, 409);
      await sleep(5 + Math.random() * 20); // the provider retries later
    }
    throw new Error(`delivery of ${id} never settled`);
  };
  for (let i = 0; i < deliveries.length; i += 100) {
    await Promise.all(deliveries.slice(i, i + 100).map(deliver));
  }
  assert.equal(processed.size, 100);
  assert.ok([...processed.values()].every((n) => n === 1), JSON.stringify([...processed]));
});

Deno.test("a webhook handler slower than its lease keeps the id: a redelivery meanwhile gets 409", async () => {
  const { records } = await fixture();
  const namespace = keygen("slowhooks").replaceAll("-", "");
  let runs = 0;
  let entered!: () => void;
  const inHandler = new Promise<void>((resolve) => entered = resolve);
  let finish!: () => void;
  const finished = new Promise<void>((resolve) => finish = resolve);
  const app = new Hono();
  app.post(
    "/hook",
    webhookDedupe({ records, secrets: [SECRET], namespace, leaseMs: 1000 }),
    async (c) => {
      if (++runs > 1) return c.text("again"); // a second run while the first goes on
      entered();
      await finished;
      return c.text("ok");
    },
  );
  const id = `msg_${crypto.randomUUID().slice(0, 8)}`;
  const deliver = async () => {
    const body = JSON.stringify({ id });
    const timestamp = Math.floor(Date.now() / 1000);
    return await app.request("/hook", {
      method: "POST",
      headers: {
        "webhook-id": id,
        "webhook-timestamp": String(timestamp),
        "webhook-signature": await sign(id, timestamp, body),
      },
      body,
    });
  };
  const first = deliver();
  try {
    await inHandler;
    await sleep(3000); // three leases: the claim lives only because it is renewed
    const meanwhile = await deliver();
    assert.equal(meanwhile.status, 409, await meanwhile.text());
  } finally {
    finish();
  }
  assert.equal((await first).status, 200);
  const after = await deliver();
  assert.deepEqual(await after.json(), { duplicate: true });
  assert.equal(runs, 1);
});

Deno.test("webhook signatures are checked over the raw body, each endpoint with its own secrets", async () => {
  const { records } = await fixture();
  let runs = 0;
  const endpoint = (secrets: string[]) => {
    const app = new Hono();
    const namespace = keygen("sig").replaceAll("-", "");
    app.post("/hook", webhookDedupe({ records, secrets, namespace }), (c) => {
      runs++;
      return c.text("ok");
    });
    return app;
  };
  const deliver = async (app: Hono, body: BodyInit, signedAs: string, secret: string) => {
    const id = `msg_${crypto.randomUUID().slice(0, 8)}`;
    const timestamp = Math.floor(Date.now() / 1000);
    const res = await app.request("/hook", {
      method: "POST",
      headers: {
        "webhook-id": id,
        "webhook-timestamp": String(timestamp),
        "webhook-signature": await sign(id, timestamp, signedAs, secret),
      },
      body,
    });
    await res.body?.cancel();
    return res.status;
  };
  // Two secrets, "abc" and "def"; and one, "abcdef", whose base64 holds a newline that atob skips.
  const two = endpoint(["whsec_YWJj", "ZGVm"]);
  const one = endpoint(["whsec_YWJj\nZGVm"]);
  assert.equal(await deliver(two, "{}", "{}", "whsec_YWJj"), 200);
  assert.equal(
    await deliver(one, "{}", "{}", "whsec_YWJj"),
    401,
    "not the other endpoint's secret",
  );
  assert.equal(await deliver(one, "{}", "{}", "whsec_YWJjZGVm"), 200);
  // Bytes that are not UTF-8 pass only a signature over those bytes, not over their decoding.
  const bytes = new Uint8Array([0x7b, 0xfe, 0x7d]);
  assert.equal(await deliver(two, bytes, "{\ufffd}", "whsec_YWJj"), 401);
  assert.equal(runs, 2);
});

Deno.test("a bad or stale webhook signature gets 401 and claims nothing", async () => {
  const { records } = await fixture();
  const namespace = "hooks-sig";
  let runs = 0;
  const app = new Hono();
  app.post("/hook", webhookDedupe({ records, secrets: [SECRET], namespace }), (c) => {
    runs++;
    return c.text("ok");
  });
  const body = '{"a":1}';
  const now = Math.floor(Date.now() / 1000);
  const post = async (id: string, timestamp: number, signature: string) => {
    const res = await app.request("/hook", {
      method: "POST",
      headers: {
        "webhook-id": id,
        "webhook-timestamp": String(timestamp),
        "webhook-signature": signature,
      },
      body,
    });
    await res.body?.cancel();
    return res.status;
  };
  const other = "whsec_" + btoa("another-secret-another-secret!!!");
  assert.equal(await post("msg_bad", now, await sign("msg_bad", now, body, other)), 401);
  assert.equal(await post("msg_old", now - 600, await sign("msg_old", now - 600, body)), 401);
  assert.equal(await post("msg_garbage", now, "v1,!!!"), 401);
  assert.equal(await post("msg_tamper", now, await sign("msg_tamper", now, '{"a":2}')), 401);
  assert.equal(runs, 0);
  for (const id of ["msg_bad", "msg_old", "msg_garbage", "msg_tamper"]) {
    assert.deepEqual(await records.get("dedupe", recordId(namespace, id)), { state: "absent" });
  }
  assert.equal(await post("msg_good", now, await sign("msg_good", now, body)), 200);
  assert.equal(runs, 1);
});

Deno.test("dedupe() returns claimed once, then in_progress, then duplicate", async () => {
  const { records } = await fixture();
  const id = crypto.randomUUID();
  const first = await dedupe(records, { namespace: "orders", id });
  assert.equal(first.state, "claimed");
  assert.equal((await dedupe(records, { namespace: "orders", id })).state, "in_progress");
  assert.ok(first.state === "claimed" && await first.done());
  assert.deepEqual(await dedupe(records, { namespace: "orders", id }), { state: "duplicate" });
});

Deno.test("5 concurrent triggers of one tick run the job exactly once", async () => {
  const { jobs } = await fixture();
  const job = keygen("job");
  let runs = 0;
  const tick = Date.now();
  const results = await Promise.all(
    Array.from(
      { length: 5 },
      () =>
        cronGuard(jobs, job, { atMostMs: 5000, tick }, async () => {
          runs++;
          await sleep(50);
          return "done";
        }),
    ),
  );
  assert.equal(runs, 1);
  assert.equal(results.filter((r) => r.ran).length, 1);
  for (const r of results) if (!r.ran) assert.ok(["running", "tick_done"].includes(r.reason));
  const again = await cronGuard(jobs, job, { atMostMs: 5000, tick }, () => runs++);
  assert.deepEqual(again.ran ? "ran" : again.reason, "tick_done");
  // The job is free (no atLeastMs): a later tick may start it now, not once the tick is forgotten.
  assert.equal(again.ran ? -1 : again.retryAfterMs, 0);
  const held = await cronGuard(
    jobs,
    job,
    { atMostMs: 5000, atLeastMs: 3000, tick: tick + 1 },
    () => {},
  );
  assert.ok(held.ran);
  const done = await cronGuard(jobs, job, { atMostMs: 5000, tick: tick + 1 }, () => runs++);
  assert.ok(
    !done.ran && done.reason === "tick_done" && done.retryAfterMs > 0,
    JSON.stringify(done),
  );
  assert.ok(done.retryAfterMs <= 3000, "at most until the atLeastMs window ends");
  assert.equal(runs, 1);
});

Deno.test("a start retried with its run's token is that run again; any other token still skips", async () => {
  const { jobs } = await fixture();
  const tick = Date.now();
  const token = "a-trigger-own-token-0001";
  const other = "another-trigger-token-01";
  for (const options of [{ atMostMs: 5000, tick }, { atMostMs: 5000 }]) {
    const job = keygen("job");
    const first = await jobs.start(job, { ...options, token });
    assert.ok(first.run, JSON.stringify(first));
    // The first start's reply was lost: its retry is told to run, with the same fence.
    const retry = await jobs.start(job, { ...options, token });
    assert.ok(retry.run, JSON.stringify(retry));
    assert.equal(retry.fence, first.fence);
    const rival = await jobs.start(job, { ...options, token: other });
    assert.ok(!rival.run);
    assert.equal(rival.reason, "tick" in options ? "tick_done" : "running");
    assert.ok(await jobs.finish(job, token));
    const late = await jobs.start(job, { ...options, token });
    if ("tick" in options) assert.ok(!late.run, "a finished tick is not run again by its token");
    else assert.ok(late.run && late.fence > first.fence, "a free job starts a new run");
  }
});

Deno.test("a Date tick names the same tick as its epoch ms; a bad tick is refused by name", async () => {
  const { jobs } = await fixture();
  const job = keygen("job");
  const at = new Date("2026-12-05T03:00:00Z");
  const first = await jobs.start(job, { atMostMs: 5000, tick: at });
  assert.ok(first.run);
  assert.ok(await jobs.finish(job, first.token));
  const again = await jobs.start(job, { atMostMs: 5000, tick: at.getTime() });
  assert.equal(again.run ? "ran" : again.reason, "tick_done");
  for (
    const [tick, error] of [
      [new Date("not a date"), new RangeError("tick is an invalid Date")],
      [
        Number.NaN,
        new RangeError("tick must be a whole number ≥ 0 (as the HTTP API takes it), not NaN"),
      ],
      [-1, new RangeError("tick must be a whole number ≥ 0 (as the HTTP API takes it), not -1")],
      [1.5, new RangeError("tick must be a whole number ≥ 0 (as the HTTP API takes it), not 1.5")],
      [{ at: 1 }, new TypeError("tick must be a string, a number or a Date, not an object")],
      [null, new TypeError("tick must be a string, a number or a Date, not null")],
    ] as const
  ) {
    await assert.rejects(jobs.start(job, { atMostMs: 5000, tick: tick as never }), error);
  }
});

Deno.test("a run closer than atLeastMs to the last start is skipped as too_soon", async () => {
  const { jobs } = await fixture();
  const job = keygen("job");
  const first = await cronGuard(jobs, job, { atMostMs: 5000, atLeastMs: 2000 }, () => 1);
  assert.ok(first.ran);
  const second = await cronGuard(jobs, job, { atMostMs: 5000, atLeastMs: 2000 }, () => 2);
  assert.ok(!second.ran && second.reason === "too_soon");
  assert.ok(second.retryAfterMs > 1000 && second.retryAfterMs <= 2000);
});

Deno.test("a crashed run frees the job after atMostMs", async () => {
  const { jobs } = await fixture();
  const job = keygen("job");
  const start = await jobs.start(job, { atMostMs: 600 }); // never finished: it crashed
  assert.ok(start.run);
  const blocked = await jobs.start(job, { atMostMs: 600 });
  assert.ok(!blocked.run && blocked.reason === "running");
  const starts: JobStart[] = [];
  await until("the crashed run's atMostMs ends", async () => {
    starts.push(await jobs.start(job, { atMostMs: 600 }));
    return starts.at(-1)!.run;
  });
  const next = starts.at(-1)!;
  assert.ok(next.run && next.fence > start.fence);
  assert.equal(
    await jobs.finish(job, start.token),
    false,
    "the crashed run cannot finish the new one",
  );
});

Deno.test("a long job is extended while it runs, past atMostMs", async () => {
  const { jobs } = await fixture();
  const job = keygen("job");
  const result = await cronGuard(jobs, job, { atMostMs: 600 }, async (run, signal) => {
    await sleep(2000); // over three atMostMs
    assert.equal(signal.aborted, false);
    const blocked = await jobs.start(job, { atMostMs: 600 });
    assert.ok(!blocked.run && blocked.reason === "running");
    return run.fence;
  });
  assert.ok(result.ran);
  assert.ok((await jobs.start(job, { atMostMs: 600 })).run, "finished without atLeastMs");
});

Deno.test("the library calls of the three uses reject bad arguments precisely", async () => {
  const { records, jobs } = await fixture();
  const job = keygen("job");
  await assert.rejects(jobs.start(job, {} as never), {
    name: "TypeError",
    message: /atMostMs is required/,
  });
  await assert.rejects(
    jobs.start(job, { atMostMs: 99 }),
    /atMostMs must be an integer from 100/,
  );
  await assert.rejects(
    jobs.start(job, { atMostMs: 1000, atLeastMs: 2000 }),
    /atLeastMs must not exceed/,
  );
  await assert.rejects(jobs.start("a b", { atMostMs: 1000 }), /job name/);
  await assert.rejects(records.claim("idempotency", "no spaces allowed"), RangeError);
  // Another kind would name another key space: "lock" is a lock's own record.
  for (const [kind, said] of [["lock", '"lock"'], ["x", '"x"'], ["", '""'], [10n, "a bigint"]]) {
    await assert.rejects(records.claim(kind as never, recordId("u", "k")), {
      name: "RangeError",
      message: `kind must be "idempotency" or "dedupe", not ${said}`,
    });
  }
  const cycle: Record<string, unknown> = {};
  cycle.self = cycle;
  await assert.rejects(
    records.complete("idempotency", recordId("u", "k"), "t".repeat(16), cycle as never),
    { name: "TypeError", message: /response cannot be sent as JSON/ },
  );
  await assert.rejects(
    records.claim("idempotency", recordId("u", "k"), { leaseMs: 50 }),
    /leaseMs/,
  );
  await assert.rejects(
    records.claim("idempotency", recordId("u", "k"), { fingerprint: "f".repeat(129) }),
    /fingerprint/,
  );
  await assert.rejects(
    records.complete("idempotency", recordId("u", "k"), "t".repeat(16), {
      b: "x".repeat(50_000),
    }),
    /at most 49152 bytes/,
  );
  assert.throws(() => recordId("a/b", "k"), RangeError);
  await assert.rejects(dedupe(records, { namespace: "ns", id: "" }), TypeError);
  await assert.rejects(
    cronGuard(jobs, job, { atMostMs: 1000 }, undefined as never),
    TypeError,
  );
  assert.throws(() => idempotency({ records, scope: undefined as never }), TypeError);
  assert.throws(() => webhookDedupe({ records, secrets: [], namespace: "ns" }), TypeError);
  assert.throws(
    () => webhookDedupe({ records, secrets: ["whsec_!!"], namespace: "ns" }),
    TypeError,
  );
  // Each would have been accepted here and then failed at the first delivery.
  for (
    const [secrets, message] of [
      [[""], /secret 1 is empty/],
      [["whsec_"], /secret 1 is empty/],
      [["  "], /secret 1 is empty: set the endpoint's signing secret/],
      [[SECRET, undefined], /secret 2 is undefined: set the endpoint's signing secret/],
      [[SECRET, 42], /secret 2 is number/],
    ] as const
  ) {
    assert.throws(
      () => webhookDedupe({ records, secrets: secrets as never, namespace: "ns" }),
      message,
    );
  }
  await assert.rejects(
    jobs.start(job, { atMostMs: 1000, tickRetentionMs: 5 }),
    { name: "RangeError", message: /^tickRetentionMs must be an integer/ },
  );
  assert.deepEqual(
    await jobs.start(job, { atMostMs: 1000 }).then((r) => r.run),
    true,
    "nothing was written before",
  );
});

Deno.test("the HTTP routes of the three uses follow the contract", async () => {
  const { backend } = await fixture();
  const secret = "uses-secret-0123456789abc";
  const app = createApp({
    redis: backend.redis,
    apiKeys: [{ tenant: "t", secret }],
    log: () => {},
  });
  const call = async (path: string, body?: unknown) => {
    const res = await app.request(path, {
      method: body === undefined ? "GET" : "POST",
      headers: { authorization: `Bearer ${secret}`, "content-type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    return {
      status: res.status,
      body: await jsonOf(res),
      type: res.headers.get("content-type"),
    };
  };
  const key = crypto.randomUUID();
  const idem = `/v1/idempotency/user-1/${key}`;
  const claim = await call(`${idem}/claim`, { fingerprint: "fp1" });
  assert.equal(claim.status, 201);
  assert.equal(claim.body.state, "claimed");
  assert.equal((await call(`${idem}/claim`, { fingerprint: "fp1" })).body.code, "in_progress");
  assert.equal((await call(`${idem}/claim`, { fingerprint: "fp2" })).status, 422);
  assert.equal((await call(idem)).body.state, "in_progress");
  const response = { status: 201, headers: { "content-type": "text/plain" }, body: "hi" };
  assert.equal(
    (await call(`${idem}/complete`, { token: "x".repeat(20), response })).status,
    409,
  );
  assert.deepEqual(
    (await call(`${idem}/complete`, { token: claim.body.token, response })).body,
    { state: "completed" },
  );
  assert.deepEqual(await call(`${idem}/claim`, { fingerprint: "fp1" }), {
    status: 200,
    body: { state: "completed", response },
    type: "application/json",
  });
  assert.ok(!JSON.stringify((await call(idem)).body).includes(claim.body.token));

  const hook = `/v1/dedupe/stripe/evt_${key.slice(0, 8)}`;
  const d = await call(`${hook}/claim`, {});
  assert.equal(d.status, 201);
  assert.equal((await call(`${hook}/claim`, {})).status, 409);
  assert.deepEqual((await call(`${hook}/release`, { token: d.body.token })).body, {
    released: true,
  });
  const d2 = await call(`${hook}/claim`, {});
  assert.deepEqual((await call(`${hook}/done`, { token: d2.body.token })).body, {
    state: "done",
  });
  assert.deepEqual((await call(`${hook}/claim`, {})).body, { state: "done" });
  assert.equal((await call(hook)).body.state, "done");

  const job = `/v1/jobs/${keygen("job")}`;
  const s = await call(`${job}/start`, {
    atMostMs: 5000,
    atLeastMs: 1000,
    tick: 1700000000000,
  });
  assert.equal(s.body.run, true);
  assert.deepEqual((await call(`${job}/start`, { atMostMs: 5000 })).body.reason, "running");
  assert.deepEqual((await call(`${job}/finish`, { token: s.body.token })).body, {
    finished: true,
  });
  assert.equal((await call(`${job}/start`, { atMostMs: 5000 })).body.reason, "too_soon");

  const bad: [string, unknown][] = [
    [`${idem}/claim`, { leaseMs: 50 }],
    [`${idem}/claim`, { retentionMs: 999 }],
    [`${idem}/claim`, { fingerprint: "f".repeat(129) }],
    [`${idem}/complete`, { token: claim.body.token, response: "not an object" }],
    [`${idem}/complete`, { token: claim.body.token, response: [201] }],
    [`${idem}/renew`, { token: claim.body.token, leaseMs: 5 }],
    [`${job}/extend`, { token: claim.body.token }],
    [`${idem}/complete`, {
      token: claim.body.token,
      response: { status: 200, body: "x".repeat(50_000) },
    }],
    [`/v1/idempotency/a b/k/claim`, {}],
    [`${hook}/done`, {}],
    [`${hook}/claim`, { retentionMs: 2_592_000_001 }],
    [`${job}/start`, {}],
    [`${job}/start`, { atMostMs: 99 }],
    [`${job}/start`, { atMostMs: 1000, atLeastMs: 2000 }],
    [`${job}/start`, { atMostMs: 1000, tick: "a b" }],
    [`${job}/finish`, { token: 5 }],
  ];
  for (const [path, body] of bad) {
    const r = await call(path, body);
    assert.ok(
      r.status >= 400 && r.status < 500,
      `${path} ${JSON.stringify(body).slice(0, 80)} → ${r.status}`,
    );
    assert.equal(r.type, "application/problem+json");
  }
});

// On Workers the client and the secrets live in `c.env`: the middleware is given factories.
type WorkerEnv = {
  Bindings: { REDIS_URL?: string; REDIS_TOKEN?: string; WEBHOOK_SECRET?: string };
};

function workerApp() {
  const records = (c: { env: WorkerEnv["Bindings"] }) =>
    new Records(new Redis({ url: c.env.REDIS_URL!, token: c.env.REDIS_TOKEN! }));
  const app = new Hono<WorkerEnv>();
  app.post(
    "/hook",
    webhookDedupe({
      records,
      secrets: (c) => [c.env.WEBHOOK_SECRET!],
      namespace: keygen("wk").replaceAll("-", ""),
    }),
    (c) => c.text("processed"),
  );
  app.post(
    "/orders",
    idempotency({ records, scope: () => "user-1" }),
    (c) => c.json({ id: crypto.randomUUID() }, 201),
  );
  return app;
}

Deno.test("webhookDedupe() reads its records and secrets from c.env per request, as on Workers", async () => {
  const { backend } = await fixture();
  const app = workerApp();
  const env = { REDIS_URL: backend.bridge.url, REDIS_TOKEN: backend.token, WEBHOOK_SECRET: SECRET };
  const body = "{}";
  const timestamp = Math.floor(Date.now() / 1000);
  const delivery = async () => ({
    method: "POST",
    headers: {
      "webhook-id": "msg_env",
      "webhook-timestamp": String(timestamp),
      "webhook-signature": await sign("msg_env", timestamp, body),
    },
    body,
  });
  const first = await app.request("/hook", await delivery(), env);
  assert.equal(first.status, 200);
  assert.equal(await first.text(), "processed");
  const again = await app.request("/hook", await delivery(), env);
  assert.deepEqual(await jsonOf(again), { duplicate: true });
  // Another secret in the environment: the same signature no longer matches.
  const rotated = { ...env, WEBHOOK_SECRET: "whsec_" + btoa("another-secret-of-32-bytes-long!") };
  assert.equal((await app.request("/hook", await delivery(), rotated)).status, 401);
});

Deno.test("a missing WEBHOOK_SECRET or Redis binding is a config_error naming it, not a bare 500", async () => {
  const { backend } = await fixture();
  const app = workerApp();
  const noSecret = await app.request("/hook", { method: "POST", body: "{}" }, {
    REDIS_URL: backend.bridge.url,
    REDIS_TOKEN: backend.token,
  });
  assert.equal(noSecret.status, 500);
  assert.equal(noSecret.headers.get("content-type"), "application/problem+json");
  const problem = await jsonOf(noSecret);
  assert.equal(problem.code, "config_error");
  assert.equal(
    problem.detail,
    "webhookDedupe's secrets setting is wrong: Webhook secret 1 is undefined: " +
      "set the endpoint's signing secret (whsec_…)",
  );
  const badSecret = await app.request("/hook", { method: "POST", body: "{}" }, {
    REDIS_URL: backend.bridge.url,
    REDIS_TOKEN: backend.token,
    WEBHOOK_SECRET: "not base64!",
  });
  assert.match((await jsonOf(badSecret)).detail, /Webhook secret 1 must be base64/);
  // A factory that throws (here @upstash/redis refusing a missing URL) is told with its message.
  const noRedis = await app.request("/orders", {
    method: "POST",
    headers: { "idempotency-key": "k1" },
  }, {});
  assert.equal(noRedis.status, 500);
  const detail = (await jsonOf(noRedis)).detail as string;
  assert.match(
    detail,
    /^idempotency's records setting is wrong: Records got an @upstash\/redis client without a URL/,
  );
  assert.doesNotMatch(detail, new RegExp(backend.token));
});

Deno.test("idempotency() with a per-request store replays the first response", async () => {
  const { backend } = await fixture();
  const app = workerApp();
  const env = { REDIS_URL: backend.bridge.url, REDIS_TOKEN: backend.token };
  const key = keygen("order");
  const post = () =>
    app.request("/orders", { method: "POST", headers: { "idempotency-key": key } }, env);
  const [first, second] = [await post(), await post()];
  assert.equal(first.status, 201);
  assert.equal(second.headers.get("idempotent-replayed"), "true");
  assert.deepEqual(await jsonOf(second), await jsonOf(first));
});

Deno.test("a misconfigured store is a 500 problem+json config_error, its cause in the log", async () => {
  const { backend } = await fixture();
  const wrong = new Records(backend.client({ token: "not-the-token" }));
  const app = new Hono();
  app.post("/x", idempotency({ records: wrong, scope: () => "u" }), (c) => c.text("ran"));
  const logged: string[] = [];
  const error = console.error;
  console.error = (...args: unknown[]) => logged.push(args.join(" "));
  try {
    const res = await app.request("/x", { method: "POST", headers: { "idempotency-key": "k1" } });
    assert.equal(res.status, 500);
    assert.match(res.headers.get("content-type") ?? "", /problem\+json/);
    const problem = await jsonOf(res);
    assert.equal(problem.code, "config_error");
    assert.doesNotMatch(JSON.stringify(problem), /127\.0\.0\.1|TOKEN|WRONGPASS/);
  } finally {
    console.error = error;
  }
  assert.match(logged.join("\n"), /idempotency store failed: Redis refused the REST token/);
});
