import assert from "node:assert/strict";
import { shared, startBackend } from "./_backend.ts";

async function errorOf(res: Response): Promise<string> {
  return ((await res.json()) as { error: string }).error;
}

const fixture = shared(async () => {
  const backend = await startBackend();
  const { redis, bridge, token } = backend;
  const post = (path: string, body: unknown, headers: Record<string, string> = {}) =>
    fetch(`${bridge.url}${path}`, {
      method: "POST",
      headers: { authorization: `Bearer ${token}`, ...headers },
      body: JSON.stringify(body),
    });
  return { backend, redis, bridge, token, post };
}, ({ backend }) => backend.stop());

Deno.test("strings round-trip, nil is null and integer replies are numbers", async () => {
  const { redis } = await fixture();
  assert.equal(await redis.set("s:1", "hello"), "OK");
  assert.equal(await redis.get("s:1"), "hello");
  assert.equal(await redis.get("s:missing"), null);
  assert.equal(await redis.incr("s:n"), 1);
  assert.equal(await redis.incrby("s:n", 41), 42);
  assert.equal(await redis.ping(), "PONG");
  assert.equal(await redis.type("s:1"), "string");
});

Deno.test("values that are valid base64 or JSON-looking come back unchanged", async () => {
  const { redis } = await fixture();
  for (
    const value of [
      "test",
      "abcd",
      "PONG",
      "OK",
      "😀 ünïcode",
      "a\u0000b",
      "12345678901234567890",
    ]
  ) {
    await redis.set("s:tricky", value);
    assert.equal(await redis.get<string>("s:tricky"), value);
  }
});

Deno.test("hashes, sets, sorted sets and lists keep their shapes", async () => {
  const { redis } = await fixture();
  await redis.hset("h:1", { name: "alice", n: 1 });
  assert.deepEqual(await redis.hgetall("h:1"), { name: "alice", n: 1 });
  await redis.sadd("set:1", "a", "b", "c");
  assert.deepEqual((await redis.smembers("set:1")).sort(), ["a", "b", "c"]);
  await redis.zadd("z:1", { score: 1.5, member: "m1" }, { score: 3, member: "m2" });
  assert.deepEqual(await redis.zrange("z:1", 0, -1, { withScores: true }), [
    "m1",
    1.5,
    "m2",
    3,
  ]);
  await redis.rpush("l:1", "x", "y", "z");
  assert.deepEqual(await redis.lrange("l:1", 0, -1), ["x", "y", "z"]);
  const [cursor, keys] = await redis.scan("0", { match: "h:*" });
  assert.equal(typeof cursor, "string");
  assert.ok(keys.includes("h:1"));
});

Deno.test("expiry in milliseconds is kept", async () => {
  const { redis } = await fixture();
  await redis.set("e:1", "v", { px: 1500 });
  const pttl = await redis.pttl("e:1");
  assert.ok(pttl > 1000 && pttl <= 1500, `pttl ${pttl}`);
});

Deno.test("a pipeline answers every command in order, errors in their own slot", async () => {
  const { redis } = await fixture();
  const p = redis.pipeline();
  p.set("p:1", "v");
  p.incr("p:1");
  p.get("p:1");
  const results = await p.exec({ keepErrors: true });
  assert.equal(results[0]!.result, "OK");
  assert.match(String(results[1]!.error), /not an integer/);
  assert.equal(results[2]!.result, "v");
});

Deno.test("multi-exec applies atomically and aborts whole on a queue-time error", async () => {
  const { redis, post } = await fixture();
  const tx = redis.multi();
  tx.set("m:1", "1");
  tx.incr("m:1");
  assert.deepEqual(await tx.exec(), ["OK", 2]);
  const raw = await post("/multi-exec", [["SET", "m:2", "a"], ["GET"]]);
  assert.equal(raw.status, 400);
  assert.match(await errorOf(raw), /^EXECABORT/);
  assert.equal(await redis.get("m:2"), null);
});

Deno.test("concurrent transactions never share a connection", async () => {
  const { redis } = await fixture();
  const runs = Array.from({ length: 20 }, (_, i) => {
    const tx = redis.multi();
    tx.set(`c:${i}`, i);
    tx.incr(`c:${i}`);
    return tx.exec();
  });
  const results = await Promise.all(runs);
  results.forEach((r, i) => assert.deepEqual(r, ["OK", i + 1]));
});

Deno.test("EVAL, EVALSHA and SCRIPT LOAD work, and NOSCRIPT keeps Redis's text", async () => {
  const { redis } = await fixture();
  const source = "return {KEYS[1], ARGV[1], 7, {ARGV[2]}}";
  assert.deepEqual(await redis.eval(source, ["k"], ["a", "b"]), ["k", "a", 7, ["b"]]);
  const sha = await redis.scriptLoad(source);
  assert.deepEqual(await redis.evalsha(sha, ["k"], ["a", "b"]), ["k", "a", 7, ["b"]]);
  await redis.scriptFlush();
  await assert.rejects(redis.evalsha(sha, ["k"], ["a", "b"]), /NOSCRIPT No matching script/);
});

Deno.test("Redis error replies are 400 with the raw error text", async () => {
  const { redis, post } = await fixture();
  await redis.set("w:1", "v");
  const res = await post("/", ["HGET", "w:1", "f"]);
  assert.equal(res.status, 400);
  assert.match(await errorOf(res), /^WRONGTYPE/);
});

Deno.test("base64 encoding covers every string at every depth and never numbers", async () => {
  const { redis, post } = await fixture();
  await redis.set("b:1", "bar");
  const res = await post("/", ["EVAL", "return {ARGV[1], 5, {'OK'}}", 0, "bar"], {
    "upstash-encoding": "base64",
  });
  assert.deepEqual(await res.json(), { result: ["YmFy", 5, ["T0s="]] });
  const plain = await post("/", ["GET", "b:1"]);
  assert.deepEqual(await plain.json(), { result: "bar" });
});

Deno.test("stateful commands are refused over REST", async () => {
  const { post } = await fixture();
  for (const command of [["MULTI"], ["SELECT", "1"], ["MONITOR"], ["SUBSCRIBE", "c"]]) {
    const res = await post("/", command);
    assert.equal(res.status, 400, command[0]);
    assert.match(await errorOf(res), /not supported/);
  }
});

Deno.test("malformed bodies and unknown command paths get a JSON 400", async () => {
  const { bridge, token, post } = await fixture();
  const bad = await fetch(bridge.url, {
    method: "POST",
    headers: { authorization: `Bearer ${token}` },
    body: "{not json",
  });
  assert.equal(bad.status, 400);
  assert.ok(await errorOf(bad));
  assert.equal((await post("/", [])).status, 400);
  assert.equal((await post("/pipeline", [])).status, 400);
  const unknown = await post("/nowhere", ["PING"]);
  assert.equal(unknown.status, 400);
  assert.match(await errorOf(unknown), /unknown command/i);
  const put = await fetch(`${bridge.url}/pipeline`, {
    method: "PUT",
    headers: { authorization: `Bearer ${token}` },
  });
  assert.equal(put.status, 405);
  await put.body?.cancel();
});

Deno.test("a wrong or missing token gets 401 and the client throws", async () => {
  const { backend, bridge } = await fixture();
  const wrong = backend.client({ token: "wrong" });
  await assert.rejects(wrong.get("s:1"), /Unauthorized/);
  const res = await fetch(bridge.url, { method: "POST", body: '["PING"]' });
  assert.equal(res.status, 401);
  await res.body?.cancel();
});

Deno.test("the bridge counts the requests it served", async () => {
  const { backend, redis } = await fixture();
  const before = backend.requests();
  await redis.get("s:1");
  await redis.get("s:1");
  assert.equal(backend.requests() - before, 2);
});
