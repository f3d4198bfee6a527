// Upstash's per-key locking: every script flagged `allow-key-locking` runs through a bridge that
// behaves as Upstash does (strict: a key outside KEYS is refused), the EVALSHA→EVAL fallback
// works on the flagged SHA-1, a plain Redis runs them unflagged, and the runner's choice.
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { Redis } from "@upstash/redis";
import { Redis as IORedis } from "ioredis";
import { startBridge } from "../bridge/mod.ts";
import { plainScript, type Script } from "../src/core/lua/_define.ts";
import { keyLockingFor, runScript } from "../src/core/_runner.ts";
import { Locks } from "../src/core/locks.ts";
import { QuorumLocks } from "../src/quorum/mod.ts";
import { fromIORedis } from "../src/tcp/mod.ts";
import { readConfig } from "../src/service/config.ts";
import * as scripts from "../src/core/lua/mod.ts";
import * as useScripts from "../src/uses/scripts.ts";
import * as quorumScripts from "../src/quorum/scripts.ts";
import { startRedisServer } from "../dev/redis_server.ts";
import { type Backend, keygen, shared } from "./_backend.ts";
import { everyOperation } from "./_every_operation.ts";

const ALL = [scripts, useScripts, quorumScripts].flatMap(
  Object.values,
).filter((value): value is Script =>
  typeof value === "object" && value !== null && "source" in value && "keyLocked" in value
);
const sha1 = (text: string) => createHash("sha1").update(text).digest("hex");

// The client, with every script call it makes recorded: the SHA-1 or the source it sent.
function recording(redis: Redis, sent: string[]): Redis {
  const wrap = <T extends object>(target: T): T =>
    new Proxy(target, {
      get(target, prop) {
        const value = Reflect.get(target, prop);
        if (prop === "evalsha" || prop === "eval") {
          return (first: string, ...rest: unknown[]) => {
            sent.push(first);
            return (value as (...args: unknown[]) => unknown).call(target, first, ...rest);
          };
        }
        if (prop === "pipeline") return () => wrap((value as () => object).call(target));
        return typeof value === "function" ? value.bind(target) : value;
      },
    });
  return wrap(redis);
}

const fixture = shared(async () => {
  const server = await startRedisServer();
  const token = crypto.randomUUID();
  const strict = await startBridge({
    redisUrl: server.url,
    token,
    port: 0,
    strictKeyLocking: true,
  });
  const lenient = await startBridge({ redisUrl: server.url, token, port: 0 });
  const client = (url: string) => new Redis({ url, token, enableTelemetry: false, retry: false });
  const redis = client(strict.url);
  const backend = { server, bridge: strict, token, redis } as unknown as Backend;
  const bad = plainScript("bad", "return redis.call('GET', KEYS[1] .. ':undeclared')");
  const badPcall = plainScript("bad", "return redis.pcall('SET', 'elsewhere', ARGV[1])");
  return { server, token, strict, lenient, client, redis, backend, bad, badPcall };
}, async ({ server, strict, lenient }) => {
  await strict.close();
  await lenient.close();
  await server.stop();
});

Deno.test("each flagged body starts with the flag; its SHA-1 is of the flagged body", async () => {
  for (const script of ALL) {
    const flagged = script.keyLocked;
    assert.match(
      flagged.source,
      /^#!lua flags=(no-writes,)?allow-key-locking\n/,
      script.name,
    );
    assert.equal(flagged.source.slice(flagged.source.indexOf("\n") + 1), script.source);
    assert.equal(await flagged.sha1(), sha1(flagged.source));
    assert.notEqual(await flagged.sha1(), await script.sha1());
    assert.equal(flagged.keyLocked, flagged);
  }
  const readOnly = ALL.filter((s) => s.keyLocked.source.includes("no-writes")).map((s) => s.name);
  assert.deepEqual(readOnly.sort(), ["list", "ping", "read_audit", "read_stats"].sort());
});

Deno.test("every operation runs flagged through the strict bridge", async () => {
  const { token, client, redis, backend } = await fixture();
  const sent: string[] = [];
  await everyOperation(backend, false, { keyLocking: true, redis: recording(redis, sent) });
  const flaggedShas = new Set(await Promise.all(ALL.map((s) => s.keyLocked.sha1())));
  assert.ok(sent.length > 40, `${sent.length} script calls`);
  for (const first of sent) {
    assert.ok(
      flaggedShas.has(first) || first.startsWith("#!lua flags="),
      `sent unflagged: ${first.slice(0, 60)}`,
    );
  }
  // In the cluster layout too, and the quorum scripts over three databases.
  await everyOperation(backend, true, { keyLocking: true });
  const others = await Promise.all([startRedisServer(), startRedisServer()]);
  const bridges = await Promise.all(
    others.map((s) => startBridge({ redisUrl: s.url, token, port: 0, strictKeyLocking: true })),
  );
  try {
    const quorum = new QuorumLocks([redis, ...bridges.map((b) => client(b.url))], {
      keyLocking: true,
    });
    const name = keygen("q");
    const held = await quorum.acquire(name, { ttlMs: 5000 });
    assert.ok(held.acquired);
    assert.ok(await quorum.renew(held.lease));
    assert.equal((await quorum.inspect(name)).held, true);
    assert.equal(await quorum.release(held.lease), true);
  } finally {
    for (const b of bridges) await b.close();
    for (const s of others) await s.stop();
  }
});

Deno.test("strict, a flagged script that touches a key outside KEYS is refused", async () => {
  const { server, strict, lenient, client, bad, badPcall } = await fixture();
  const run = (url: string, script: Script) =>
    runScript(client(url), script, [keygen("k")], ["v"], {
      timeoutMs: 2000,
      keyLocking: true,
    });
  await assert.rejects(run(strict.url, bad), /did not declare in KEYS/);
  await assert.rejects(run(strict.url, badPcall), /touched the key elsewhere/);
  const direct = new IORedis(server.url);
  assert.equal(await direct.get("elsewhere"), null, "the refused script wrote nothing");
  direct.disconnect();
  // The lenient bridge runs them (as a plain Redis would): strict mode is what catches them.
  assert.equal(await run(lenient.url, bad), null);
  // Unflagged, strict mode does not look at them.
  assert.equal(
    await runScript(client(strict.url), bad, [keygen("k")], [], {
      timeoutMs: 2000,
      keyLocking: false,
    }),
    null,
  );
});

Deno.test("EVALSHA of a flagged body falls back to EVAL, then hits", async () => {
  const { server, strict, lenient, client } = await fixture();
  const script = plainScript("probe", `return KEYS[1] .. '${crypto.randomUUID()}'`);
  const fresh = client(strict.url);
  const options = { timeoutMs: 2000, keyLocking: true };
  const requests = () => strict.stats().requests;
  let before = requests();
  assert.match(String(await runScript(fresh, script, ["k"], [], options)), /^k/);
  assert.equal(requests() - before, 2, "NOSCRIPT, then EVAL");
  before = requests();
  await runScript(fresh, script, ["k"], [], options);
  assert.equal(requests() - before, 1, "EVALSHA hits");
  // After SCRIPT FLUSH, and through a bridge that never saw the body, it still runs.
  const direct = new IORedis(server.url);
  await direct.script("FLUSH");
  direct.disconnect();
  assert.match(String(await runScript(fresh, script, ["k"], [], options)), /^k/);
  assert.match(String(await runScript(client(lenient.url), script, ["k"], [], options)), /^k/);
  // SCRIPT LOAD and SCRIPT EXISTS speak the flagged SHA-1.
  const other = plainScript("probe", `return '${crypto.randomUUID()}'`).keyLocked;
  assert.equal(await fresh.scriptLoad(other.source), await other.sha1());
  assert.deepEqual(await fresh.scriptExists(await other.sha1()), [1]);
});

Deno.test("a plain Redis runs the scripts unflagged; forced on, a clear error", async () => {
  const { server } = await fixture();
  const tcp = new IORedis(server.url);
  try {
    const redisLike = fromIORedis(tcp);
    assert.equal(keyLockingFor(redisLike, undefined), false);
    const locks = new Locks(redisLike, { prefix: keygen("plain") });
    const held = await locks.acquire("n");
    assert.ok(held.acquired);
    await locks.release(held.lease);
    const forced = new Locks(redisLike, { prefix: keygen("plain"), keyLocking: true });
    await assert.rejects(forced.acquire("n"), (error: Error & { code?: string }) => {
      assert.equal(error.code, "config_error");
      assert.match(error.message, /does not know Upstash's allow-key-locking/);
      return true;
    });
  } finally {
    tcp.disconnect();
  }
});

Deno.test("the runner turns key locking on for Upstash databases only, unless told", () => {
  const rest = (url: string) => new Redis({ url, token: "t", enableTelemetry: false });
  assert.equal(keyLockingFor(rest("https://eu1-fond-fox-12345.upstash.io"), undefined), true);
  assert.equal(keyLockingFor(rest("https://upstash.io.evil.example"), undefined), false);
  assert.equal(keyLockingFor(rest("http://127.0.0.1:8079"), undefined), false);
  assert.equal(keyLockingFor(rest("https://eu1-x.upstash.io"), false), false);
  assert.equal(keyLockingFor(rest("http://127.0.0.1:8079"), true), true);
  assert.throws(() => keyLockingFor(rest("http://127.0.0.1"), "yes"), TypeError);
  assert.throws(
    () => new Locks(rest("http://127.0.0.1"), { keyLocking: 1 as unknown as boolean }),
    /keyLocking must be true or false/,
  );
  const config = (value?: string) =>
    readConfig({
      UPSTASH_REDIS_REST_URL: "https://x.upstash.io",
      UPSTASH_REDIS_REST_TOKEN: "t",
      LOCK_API_KEYS: "app:app-secret-0123456789",
      ...(value !== undefined && { LOCK_KEY_LOCKING: value }),
    });
  assert.equal(config().keyLocking, undefined);
  assert.equal(config("auto").keyLocking, undefined);
  assert.equal(config("on").keyLocking, true);
  assert.equal(config("off").keyLocking, false);
  assert.throws(() => config("yes"), /LOCK_KEY_LOCKING must be auto/);
});
