// The bridge serves data, not administration: every command of Redis's own `COMMAND` list goes
// through both tokens, and every one the policy refuses answers 4xx and changes nothing in Redis.
import assert from "node:assert/strict";
import { Redis as IORedis } from "ioredis";
import { Redis } from "@upstash/redis";
import { type EdgelockError, Locks } from "@edgelock/edgelock";
import { startBridge } from "../bridge/mod.ts";
import { accessOf, allowed } from "../bridge/policy.ts";
import { startRedisServer } from "../dev/redis_server.ts";
import { keygen, shared } from "./_backend.ts";

const TOKEN = "policy-token-0123456789";
/** The ACL rules docs/bridge.md gives the bridge's Redis user. */
const ACL_RULES = "+@all -@admin -@dangerous -move -select +flushdb +flushall +keys +sort +sort_ro";
const READONLY = "policy-readonly-0123456789";

// What Redis says of itself, to compare before and after.
async function snapshot(redis: IORedis): Promise<unknown[]> {
  return await Promise.all([
    redis.call("ACL", "LIST"),
    redis.call("CONFIG", "GET", "*"),
    redis.call("FUNCTION", "LIST"),
    redis.call("DBSIZE"),
    redis.call("SCRIPT", "EXISTS", "0000000000000000000000000000000000000000"),
  ]);
}

const fixture = shared(async () => {
  const server = await startRedisServer();
  const redis = new IORedis(server.url);
  const bridge = await startBridge({
    redisUrl: server.url,
    token: TOKEN,
    readonlyToken: READONLY,
    port: 0,
    maxScripts: 50,
  });
  const send = async (token: string, command: unknown[]) => {
    const res = await fetch(bridge.url, {
      method: "POST",
      headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
      body: JSON.stringify(command),
    });
    return { status: res.status, body: await res.json() as { result?: unknown; error?: string } };
  };
  // Sample arguments that would do harm if Redis ran them.
  const harmful: Record<string, unknown[]> = {
    "acl|setuser": ["ACL", "SETUSER", "evil", "on", ">pw", "+@all", "~*"],
    "config|set": ["CONFIG", "SET", "maxmemory-policy", "allkeys-random"],
    "script|debug": ["SCRIPT", "DEBUG", "SYNC"],
    "function|load": [
      "FUNCTION",
      "LOAD",
      "#!lua name=evil\nredis.register_function('f', function() return 1 end)",
    ],
    "shutdown": ["SHUTDOWN", "NOSAVE"],
    "debug": ["DEBUG", "SLEEP", "5"],
    "swapdb": ["SWAPDB", "0", "1"],
    "client|pause": ["CLIENT", "PAUSE", "10000"],
    "client|kill": ["CLIENT", "KILL", "TYPE", "normal"],
    "replicaof": ["REPLICAOF", "127.0.0.1", "1"],
    "slaveof": ["SLAVEOF", "127.0.0.1", "1"],
    "latency|reset": ["LATENCY", "RESET"],
    "slowlog|reset": ["SLOWLOG", "RESET"],
    "module|load": ["MODULE", "LOAD", "/tmp/evil.so"],
    "restore": ["RESTORE", "evil", "0", "\u0000garbage"],
  };
  return { server, redis, bridge, send, harmful };
}, async ({ server, redis, bridge }) => {
  await bridge.close();
  redis.disconnect();
  await server.stop();
});

Deno.test("every command the policy refuses answers 4xx to both tokens and changes nothing", async () => {
  const { redis, send, harmful } = await fixture();
  await redis.set("migrate-me", "v");
  const before = await snapshot(redis);
  // A listener MIGRATE would connect to, were it run.
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  let connected = 0;
  const accepting = (async () => {
    for await (const conn of listener) {
      connected++;
      conn.close();
    }
  })();
  harmful["migrate"] = [
    "MIGRATE",
    "127.0.0.1",
    String((listener.addr as Deno.NetAddr).port),
    "migrate-me",
    "0",
    "1000",
  ];
  const table = await redis.call("COMMAND") as unknown[][];
  const commands: string[] = [];
  for (const entry of table) {
    const subs = entry[9] as unknown[][] | undefined;
    if (Array.isArray(subs) && subs.length > 0) {
      subs.forEach((sub) => commands.push(String(sub[0])));
    } else commands.push(String(entry[0]));
  }
  assert.ok(commands.length > 300, `${commands.length} commands and subcommands`);
  let refused = 0;
  for (const key of commands) {
    const [name, sub] = key.split("|") as [string, string | undefined];
    if (accessOf(name, sub ? [sub] : []) !== undefined) continue;
    refused++;
    const command = harmful[key] ??
      [name.toUpperCase(), ...(sub ? [sub.toUpperCase()] : []), "x"];
    for (const token of [TOKEN, READONLY]) {
      const { status, body } = await send(token, command);
      assert.ok(status >= 400 && status < 500, `${key}: ${status}`);
      assert.match(body.error ?? "", /not supported over REST|unknown command/, key);
    }
  }
  assert.ok(refused > 100, `${refused} refused`);
  listener.close();
  await accepting.catch(() => {});
  assert.equal(connected, 0, "MIGRATE made no connection");
  assert.deepEqual(await snapshot(redis), before, "ACL, CONFIG, FUNCTION and keys unchanged");
  assert.equal(await redis.get("migrate-me"), "v");
  // The pool is sound: no connection was taken over (SCRIPT DEBUG, CLIENT PAUSE).
  assert.deepEqual(await send(TOKEN, ["EVAL", "return 1", "0"]), {
    status: 200,
    body: { result: 1 },
  });
  assert.equal(await redis.ping(), "PONG", "a direct client is not held up");
});

Deno.test("the read-only token reads; every write command is NOPERM and writes nothing", async () => {
  const { redis, send } = await fixture();
  const key = keygen("ro");
  await redis.set(key, "v");
  let writes = 0;
  for (const [entry, access] of allowed()) {
    const [name, sub] = entry.split("|") as [string, string | undefined];
    if (access !== "write") continue;
    writes++;
    const command = [name.toUpperCase(), ...(sub ? [sub.toUpperCase()] : []), key, "x", "1"];
    const { status, body } = await send(READONLY, command);
    assert.equal(status, 400, entry);
    assert.match(body.error ?? "", /NOPERM this token is read-only/, entry);
  }
  assert.ok(writes > 100, `${writes} write commands`);
  assert.equal(await redis.get(key), "v", "nothing was written");
  assert.deepEqual((await send(READONLY, ["GET", key])).body, { result: "v" });
});

Deno.test("a lock through the read-only token is a config_error that says so, not an outage", async () => {
  const { bridge } = await fixture();
  const locks = new Locks(new Redis({ url: bridge.url, token: READONLY, retry: false }));
  await assert.rejects(locks.acquire(keygen()), (error: EdgelockError) => {
    assert.equal(error.code, "config_error", error.message);
    assert.match(error.message, /read-only REST token cannot run edgelock's scripts/);
    return true;
  });
});

Deno.test("every command the policy allows is one this Redis knows", async () => {
  const { redis } = await fixture();
  const known = new Set<string>();
  for (const entry of await redis.call("COMMAND") as unknown[][]) {
    known.add(String(entry[0]));
    for (const sub of (entry[9] ?? []) as unknown[][]) known.add(String(sub[0]));
  }
  const newer = new Set(["waitaof"]); // Redis 7.2
  const unknown = [...allowed().keys()].filter((name) => !known.has(name) && !newer.has(name));
  assert.deepEqual(unknown, []);
});

Deno.test("scripts run as the bridge's Redis user: with the documented ACL, not even a script administers", async () => {
  const { server, redis, send } = await fixture();
  // The default: the bridge made a restricted user of its own, so a script cannot either.
  for (const token of [TOKEN, READONLY]) {
    const slowlog = await send(token, [
      "EVAL_RO",
      "return redis.call('SLOWLOG', 'GET')",
      "0",
    ]);
    assert.match(slowlog.body.error ?? "", /can't run this command/);
  }
  const swap = await send(TOKEN, ["EVAL", "return redis.call('SWAPDB', '0', '0')", "0"]);
  assert.match(swap.body.error ?? "", /can't run this command/);
  // As configured (the default user here), a script reaches what Redis allows scripts.
  const open = await startBridge({
    redisUrl: server.url,
    token: TOKEN,
    port: 0,
    scriptUser: "as-configured",
  });
  try {
    const res = await fetch(open.url, {
      method: "POST",
      headers: { authorization: `Bearer ${TOKEN}` },
      body: JSON.stringify(["EVAL", "return redis.call('SWAPDB', '0', '0')", "0"]),
    });
    assert.deepEqual(await res.json(), { result: "OK" }, "the gap the default closes");
  } finally {
    await open.close();
  }
  await redis.call(
    "ACL",
    "SETUSER",
    "edgelock-bridge",
    "on",
    ">bridge-password-0123",
    "~*",
    "&*",
    ...ACL_RULES.split(" "),
  );
  const url = new URL(server.url);
  url.username = "edgelock-bridge";
  url.password = "bridge-password-0123";
  const guarded = await startBridge({ redisUrl: url.href, token: TOKEN, port: 0 });
  try {
    const run = async (script: string) => {
      const res = await fetch(guarded.url, {
        method: "POST",
        headers: { authorization: `Bearer ${TOKEN}` },
        body: JSON.stringify(["EVAL", script, "0"]),
      });
      return await res.json() as { result?: unknown; error?: string };
    };
    for (
      const call of ["'MIGRATE', '127.0.0.1', '1', 'k', '0', '100'", "'SWAPDB', '0', '0'"]
    ) {
      assert.match(
        (await run(`return redis.call(${call})`)).error ?? "",
        /can't run this command/,
      );
    }
    // Locks work through it, stats and all.
    const { Redis } = await import("@upstash/redis");
    const { LockOps, Locks } = await import("../src/core/mod.ts");
    const redis = new Redis({ url: guarded.url, token: TOKEN, enableTelemetry: false });
    const locks = new Locks(redis);
    const got = await locks.acquire(keygen("acl"));
    assert.ok(got.acquired && await locks.release(got.lease));
    assert.equal((await new LockOps(redis).stats()).total.acquire.granted, 1);
  } finally {
    await guarded.close();
  }
});

Deno.test("a token may add at most its share of scripts to Redis's script cache", async () => {
  const { redis, bridge, send } = await fixture();
  const cachedScripts = async () =>
    Number((await redis.info("memory")).match(/number_of_cached_scripts:(\d+)/)?.[1]);
  const before = await cachedScripts();
  // Scripts that do not compile are not cached, and take nothing of the share.
  const broken = Array.from({ length: 100 }, (_, i) => ["EVAL_RO", `return ${i} +`, "0"]);
  const res = await fetch(`${bridge.url}/pipeline`, {
    method: "POST",
    headers: { authorization: `Bearer ${READONLY}` },
    body: JSON.stringify(broken),
  });
  await res.body?.cancel();
  let refusedAt = -1;
  for (let i = 0; i < 20; i++) {
    const { status, body } = await send(READONLY, ["EVAL_RO", `return "ro-${i}"`, "0"]);
    if (status !== 200) {
      refusedAt = i;
      assert.match(body.error ?? "", /may add no more scripts to the cache \(5 scripts/);
      break;
    }
  }
  assert.equal(refusedAt, 5, "the read-only token's share: a tenth of 50");
  assert.ok((await cachedScripts()) - before <= 5);
  // Scripts the bridge has cached already still run; the read-write token has its own share.
  assert.deepEqual((await send(READONLY, ["EVAL_RO", 'return "ro-0"', "0"])).body, {
    result: "ro-0",
  });
  assert.deepEqual((await send(TOKEN, ["EVAL", "return 'rw'", "0"])).body, { result: "rw" });
});
