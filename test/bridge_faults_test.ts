// The bridge as a user of the whole Upstash REST surface finds it: the REST docs' path form and
// `_token`, CORS, a byte-counted body limit, /healthz, blocking commands on connections of their
// own, connection-state commands refused, a command timeout, and a shutdown a stuck command
// cannot hold. Each against a real redis-server, with the unmodified @upstash/redis client.
import assert from "node:assert/strict";
import { Redis } from "@upstash/redis";
import { startBridge } from "../bridge/mod.ts";
import { startRedisServer } from "../dev/redis_server.ts";
import { spawnDeno } from "./_process.ts";
import { keygen, shared } from "./_backend.ts";

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

const fixture = shared(async () => {
  const server = await startRedisServer();
  const token = crypto.randomUUID();
  const bridge = await startBridge({
    redisUrl: server.url,
    token,
    port: 0,
    poolSize: 2,
    maxBlocking: 4,
    commandTimeoutMs: 2500,
  });
  const redis = new Redis({ url: bridge.url, token, enableTelemetry: false, retry: false });
  const get = (path: string, init: RequestInit = {}) =>
    fetch(`${bridge.url}${path}`, {
      ...init,
      headers: { authorization: `Bearer ${token}`, ...init.headers },
    });
  const body = async (res: Response) => await res.json() as { result?: unknown; error?: string };
  const send = (command: unknown[]) =>
    get("/", { method: "POST", body: JSON.stringify(command) }).then(body);
  return { server, token, bridge, redis, get, body, send };
}, async ({ server, bridge }) => {
  await bridge.close();
  await server.stop();
});

Deno.test("path-style commands, as in the REST docs' curl examples", async () => {
  const { redis, get, body } = await fixture();
  const key = keygen("p");
  assert.deepEqual(await body(await get(`/set/${key}/bar`)), { result: "OK" });
  assert.deepEqual(await body(await get(`/get/${key}`)), { result: "bar" });
  const posted = await get(`/set/${key}`, { method: "POST", body: "a value/with ? and €" });
  assert.deepEqual(await body(posted), { result: "OK" });
  assert.equal(await redis.get(key), "a value/with ? and €");
  assert.deepEqual(await body(await get(`/set/${key}/x?EX=100`)), { result: "OK" });
  assert.ok(await redis.ttl(key) > 90);
  assert.deepEqual(await body(await get(`/set/${encodeURIComponent(`${key}/y z`)}/1`)), {
    result: "OK",
  });
  assert.equal(await redis.get(`${key}/y z`), 1);
  const unknown = await get("/nosuchcommand/a");
  assert.equal(unknown.status, 400);
  assert.match((await body(unknown)).error!, /unknown command/i);
});

Deno.test("the _token query parameter authenticates; a wrong one is 401", async () => {
  const { token, bridge, redis, body } = await fixture();
  const key = keygen("q");
  await redis.set(key, "v");
  const ok = await fetch(`${bridge.url}/get/${key}?_token=${token}`);
  assert.deepEqual(await body(ok), { result: "v" });
  const wrong = await fetch(`${bridge.url}/get/${key}?_token=nope`);
  assert.equal(wrong.status, 401);
  await wrong.body?.cancel();
  const notBearer = await fetch(`${bridge.url}/get/${key}`, {
    headers: { authorization: token },
  });
  assert.equal(notBearer.status, 401);
  await notBearer.body?.cancel();
});

Deno.test("CORS: a preflight is answered and every reply allows any origin", async () => {
  const { bridge, get } = await fixture();
  const pre = await fetch(bridge.url, {
    method: "OPTIONS",
    headers: {
      origin: "https://app.example",
      "access-control-request-method": "POST",
      "access-control-request-headers": "authorization, content-type, upstash-encoding",
    },
  });
  assert.equal(pre.status, 204);
  assert.equal(pre.headers.get("access-control-allow-origin"), "*");
  assert.match(pre.headers.get("access-control-allow-headers")!, /authorization/);
  assert.match(pre.headers.get("access-control-allow-methods")!, /POST/);
  const reply = await get("/get/x", { headers: { origin: "https://app.example" } });
  assert.equal(reply.headers.get("access-control-allow-origin"), "*");
  await reply.body?.cancel();
  const denied = await fetch(`${bridge.url}/get/x`);
  assert.equal(denied.headers.get("access-control-allow-origin"), "*", "401s too");
  await denied.body?.cancel();
});

Deno.test("the body limit counts bytes: 4 M three-byte characters are refused", async () => {
  const { redis, get } = await fixture();
  const big = JSON.stringify(["SET", "big", "€".repeat(4 * 1024 * 1024)]);
  assert.ok(big.length < 10 * 1024 * 1024 && new TextEncoder().encode(big).length > 12e6);
  const res = await get("/", { method: "POST", body: big });
  assert.equal(res.status, 413);
  await res.body?.cancel();
  // Streamed without a content-length (chunked): refused before a byte of it is read.
  const stream = new Blob([big]).stream();
  const streamed = await get("/", { method: "POST", body: stream });
  assert.equal(streamed.status, 411);
  await streamed.body?.cancel();
  assert.equal(await redis.exists("big"), 0, "nothing was written");
});

Deno.test("/healthz answers without a token and says whether Redis answers", async () => {
  const { bridge } = await fixture();
  const res = await fetch(`${bridge.url}/healthz`);
  assert.equal(res.status, 200);
  assert.deepEqual(await res.json(), { ok: true });
});

Deno.test("blocking commands wait on connections of their own: ordinary commands never stall", async () => {
  const { redis, send } = await fixture();
  const stream = keygen("s");
  const list = keygen("l");
  // More blocking calls than the pool has connections, all blocked for 1.5 s: one through
  // the client, two as raw requests (the client would batch them into one pipeline).
  const reads = [
    redis.xread(stream, "$", { blockMS: 1500 }),
    send(["XREAD", "BLOCK", 1500, "STREAMS", stream, "$"]),
    send(["XREAD", "BLOCK", 1500, "STREAMS", stream, "$"]),
  ];
  // The client has no BLPOP: sent as the REST docs send it.
  const blpop = () => send(["BLPOP", list, 2]);
  const pop = blpop();
  await sleep(100);
  const started = performance.now();
  for (let i = 0; i < 20; i++) assert.equal(await redis.get(`${stream}:none`), null);
  const ordinaryMs = performance.now() - started;
  assert.ok(ordinaryMs < 900, `20 GETs took ${ordinaryMs} ms beside the blocked calls`);
  // One more than maxBlocking is refused at once, with a clear error.
  assert.match((await blpop()).error!, /too many blocking commands in flight \(at most 4\)/);
  await redis.rpush(list, "job");
  assert.deepEqual(await pop, { result: [list, "job"] });
  assert.deepEqual(await Promise.all(reads), [null, { result: null }, { result: null }]);
});

Deno.test("a blocking command past the command timeout fails; the bridge goes on", async () => {
  const { redis, get, body } = await fixture();
  const started = performance.now();
  const res = await get("/", {
    method: "POST",
    body: JSON.stringify(["BLPOP", keygen("l"), 0]),
  });
  assert.equal(res.status, 504);
  assert.match((await body(res)).error!, /ran past 2500 ms/);
  assert.ok(performance.now() - started < 6000);
  assert.equal(await redis.set(keygen("k"), "v"), "OK");
});

Deno.test("subscribe and psubscribe stream messages as server-sent events", async () => {
  const { redis, send } = await fixture();
  const channel = keygen("chat");
  const events: unknown[] = [];
  const sub = redis.subscribe([channel]);
  const psub = redis.psubscribe([`${channel}:*`]);
  sub.on("subscribe", (count) => events.push(["subscribe", count]));
  sub.on("message", ({ channel, message }) => events.push(["message", channel, message]));
  psub.on(
    "pmessage",
    ({ pattern, channel, message }) => events.push(["pmessage", pattern, channel, message]),
  );
  sub.on("error", (error) => events.push(["error", String(error)]));
  psub.on("error", (error) => events.push(["error", String(error)]));
  // Both streams are up once Redis counts two subscribers on the server.
  const subscribers = async () => {
    const { result: [, channels] } = await send(["PUBSUB", "NUMSUB", channel]) as {
      result: [string, number];
    };
    return channels + ((await send(["PUBSUB", "NUMPAT"])).result as number);
  };
  for (let i = 0; i < 100 && await subscribers() < 2; i++) await sleep(20);
  assert.equal(await subscribers(), 2);
  assert.equal(await redis.publish(channel, "hello, world"), 1);
  assert.equal(await redis.publish(channel, { n: 1 }), 1);
  // The client parses a pattern message as JSON, strictly.
  assert.equal(await redis.publish(`${channel}:room`, ["ping"]), 1);
  for (let i = 0; i < 100 && events.length < 4; i++) await sleep(20);
  // Each stream keeps its order; the two streams interleave as they arrive.
  const byStream = (
    list: unknown[],
  ) => [
    list.filter((e) => (e as unknown[])[0] === "pmessage"),
    list.filter((e) => (e as unknown[])[0] !== "pmessage"),
  ];
  assert.deepEqual(
    byStream(events),
    byStream([
      ["subscribe", 1],
      ["message", channel, "hello, world"],
      ["message", channel, { n: 1 }],
      ["pmessage", `${channel}:*`, `${channel}:room`, ["ping"]],
    ]),
  );
  // Unsubscribing aborts the stream; the bridge drops its Redis connection.
  await sub.unsubscribe();
  await psub.unsubscribe();
  for (let i = 0; i < 100 && await subscribers() > 0; i++) await sleep(20);
  assert.equal(await subscribers(), 0);
  assert.equal(await redis.publish(channel, "nobody"), 0);
});

Deno.test("a stream sends a heartbeat and past the bound a subscribe is refused", async () => {
  const { server, token, body } = await fixture();
  const small = await startBridge({
    redisUrl: server.url,
    token,
    port: 0,
    maxSubscriptions: 1,
    heartbeatMs: 50,
  });
  try {
    const open = (channel: string) =>
      fetch(`${small.url}/subscribe/${channel}`, {
        method: "POST",
        headers: { authorization: `Bearer ${token}`, accept: "text/event-stream" },
        body: "[]",
      });
    const first = await open("c1");
    assert.equal(first.headers.get("content-type"), "text/event-stream");
    const reader = first.body!.pipeThrough(new TextDecoderStream()).getReader();
    let text = "";
    while (!text.includes(": ping")) text += (await reader.read()).value;
    assert.match(text, /^data: subscribe,c1,1\n\n/);
    const second = await open("c2");
    assert.equal(second.status, 503);
    assert.match((await body(second)).error!, /too many subscriptions open \(at most 1\)/);
    // Closing the bridge ends an open stream at once.
    await small.close();
    while (!(await reader.read()).done) { /* drain */ }
  } finally {
    await small.close();
  }
});

Deno.test("commands that change a pooled connection's state are refused; the pool stays sound", async () => {
  const { redis, get, body } = await fixture();
  for (
    const command of [
      ["CLIENT", "REPLY", "OFF"],
      ["CLIENT", "REPLY", "SKIP"],
      ["CLIENT", "SETNAME", "x"],
      ["CLIENT", "TRACKING", "ON"],
      ["MONITOR"],
      ["SUBSCRIBE", "c"],
      ["READONLY"],
      ["SELECT", "1"],
    ]
  ) {
    const res = await get("/", { method: "POST", body: JSON.stringify(command) });
    assert.equal(res.status, 400, command.join(" "));
    assert.match((await body(res)).error!, /not supported over REST/);
    const piped = await get("/pipeline", {
      method: "POST",
      body: JSON.stringify([command, ["PING"]]),
    });
    const slots = await piped.json() as { result?: unknown; error?: string }[];
    assert.match(slots[0]!.error!, /not supported/);
    assert.deepEqual(slots[1], { result: "PONG" });
  }
  assert.match(String((await body(await get("/client/id"))).result), /^\d+$/);
  // Every pooled connection still answers in order.
  const keys = Array.from({ length: 8 }, () => keygen("k"));
  await Promise.all(keys.map((key) => redis.set(key, key)));
  assert.deepEqual(await Promise.all(keys.map((key) => redis.get(key))), keys);
});

Deno.test("SIGTERM stops the bridge within its grace even while a command is stuck", async () => {
  const server = await startRedisServer();
  const token = crypto.randomUUID();
  const bridge = await spawnDeno(
    ["run", "-A", "bridge/main.ts", "--port", "0", "--redis", server.url, "--grace-ms", "500"],
    { UPSTASH_REDIS_REST_TOKEN: token },
    /Upstash REST bridge on (http:\/\/127\.0\.0\.1:\d+) in front of .*\n/,
  );
  try {
    const url = bridge.ready[1]!;
    const stuck = fetch(url, {
      method: "POST",
      headers: { authorization: `Bearer ${token}` },
      body: JSON.stringify(["BLPOP", "never", 0]),
    }).then(async (res) => [res.status, await res.text()] as const, () => "dropped" as const);
    await sleep(200);
    const started = performance.now();
    const status = await bridge.stop("SIGTERM");
    const stoppedMs = performance.now() - started;
    assert.equal(status.code, 0, bridge.output());
    assert.ok(stoppedMs < 4000, `stopped after ${stoppedMs} ms`);
    const outcome = await stuck;
    assert.ok(outcome === "dropped" || outcome[0] === 500, String(outcome));
  } finally {
    await bridge.stop("SIGKILL");
    await server.stop();
  }
});
