import assert from "node:assert/strict";
import { createApp, parseApiKeys, readConfig } from "@edgelock/edgelock/service";
import { startBackend } from "./_backend.ts";

const GOOD = {
  UPSTASH_REDIS_REST_URL: "https://eu1-example.upstash.io",
  UPSTASH_REDIS_REST_TOKEN: "AXYZ-token",
  LOCK_API_KEYS: "app:app-secret-0123456789",
};

Deno.test("readConfig names the variable of each mistake and what to do, never its value", () => {
  const cases: [Record<string, string>, RegExp][] = [
    [
      { UPSTASH_REDIS_REST_URL: "" },
      /^UPSTASH_REDIS_REST_URL is not set: copy the database's REST URL/,
    ],
    [
      { UPSTASH_REDIS_REST_URL: "eu1-example.upstash.io" },
      /^UPSTASH_REDIS_REST_URL is not an http\(s\) URL/,
    ],
    [{ UPSTASH_REDIS_REST_URL: "https://user:pw@x.upstash.io" }, /without credentials/],
    [
      { UPSTASH_REDIS_REST_URL: "rediss://default:pw@x.upstash.io:6379" },
      /is a redis:\/\/ URL: use the database's REST URL/,
    ],
    [{ UPSTASH_REDIS_REST_TOKEN: "  " }, /^UPSTASH_REDIS_REST_TOKEN is not set/],
    [
      { UPSTASH_REDIS_REST_TOKEN: '"AXYZ-token"' },
      /^UPSTASH_REDIS_REST_TOKEN holds spaces, quotes/,
    ],
    [{ UPSTASH_REDIS_REST_TOKEN: "AXYZ token" }, /^UPSTASH_REDIS_REST_TOKEN holds spaces, quotes/],
    [{ LOCK_API_KEYS: "" }, /^LOCK_API_KEYS is not set: give comma-separated tenant:secret pairs/],
    [{ LOCK_API_KEYS: " , " }, /^LOCK_API_KEYS is not set/],
    [{ LOCK_API_KEYS: "app-secret-0123456789" }, /^LOCK_API_KEYS: each entry is tenant:secret/],
    [{ LOCK_API_KEYS: "a b:app-secret-0123456789" }, /^LOCK_API_KEYS: each entry is tenant:secret/],
    [{ LOCK_API_KEYS: "app:pw-123" }, /^LOCK_API_KEYS: the secret of tenant "app" must be 16–256/],
    [
      { LOCK_API_KEYS: "a:same-secret-0123456789,b:same-secret-0123456789" },
      /two tenants share a secret/,
    ],
    [{ LOCK_KEY_PREFIX: "my prefix" }, /^LOCK_KEY_PREFIX must be 1–64 characters/],
    [
      { REDIS_TIMEOUT_MS: "abc" },
      /^REDIS_TIMEOUT_MS must be a whole number of milliseconds from 1 to 60000/,
    ],
    [{ REDIS_TIMEOUT_MS: "0" }, /^REDIS_TIMEOUT_MS must be a whole number/],
    [{ REDIS_TIMEOUT_MS: "60001" }, /^REDIS_TIMEOUT_MS must be a whole number/],
    [
      { LOCK_MAX_WAITS: "-1" },
      /^LOCK_MAX_WAITS must be a whole number of waits per tenant from 1 to 10000/,
    ],
    [{ LOCK_RATE_LIMIT: "1e3" }, /^LOCK_RATE_LIMIT must be a whole number/],
    [{ LOCK_KEY_LAYOUT: "clustered" }, /^LOCK_KEY_LAYOUT must be single \(one Redis/],
    [
      { LOCK_API_KEY: "x" },
      /^LOCK_API_KEY is not an edgelock setting \(did you mean LOCK_API_KEYS\?\)/,
    ],
    [
      { LOCK_TTL: "5" },
      /^LOCK_TTL is not an edgelock setting; the settings are UPSTASH_REDIS_REST_URL/,
    ],
  ];
  for (const [change, message] of cases) {
    const env = { ...GOOD, ...change };
    assert.throws(() => readConfig(env), (error: unknown) => {
      assert.ok(error instanceof RangeError, String(error));
      assert.match(error.message, message);
      for (const value of ["pw@", "pw-123", "AXYZ", "same-secret", "my prefix"]) {
        assert.ok(!error.message.includes(value), `${error.message} echoes a value`);
      }
      return true;
    }, JSON.stringify(change));
  }
});

Deno.test("readConfig reads a good configuration, with defaults", () => {
  const config = readConfig({ ...GOOD, REDIS_TIMEOUT_MS: "500", PATH: "/bin", OTHER: 1 });
  assert.deepEqual(config, {
    redisUrl: GOOD.UPSTASH_REDIS_REST_URL,
    redisToken: GOOD.UPSTASH_REDIS_REST_TOKEN,
    apiKeys: [{ tenant: "app", secret: "app-secret-0123456789" }],
    keyPrefix: "edgelock",
    redisTimeoutMs: 500,
    limits: {},
    operatorKeys: [],
    cluster: false,
  });
  assert.equal(readConfig({ ...GOOD, LOCK_KEY_LAYOUT: "cluster" }).cluster, true);
});

Deno.test("two keys of one tenant both work during a rotation, on the same locks", async () => {
  const backend = await startBackend();
  try {
    const [OLD, NEW] = ["old-secret-0123456789", "new-secret-0123456789"];
    const app = createApp({
      redis: backend.redis,
      apiKeys: parseApiKeys(`app:${OLD},app:${NEW}`),
      log: () => {},
    });
    const post = (secret: string, path: string) =>
      app.request(path, {
        method: "POST",
        headers: { authorization: `Bearer ${secret}`, "content-type": "application/json" },
        body: "{}",
      });
    const held = await post(OLD, "/v1/locks/rotate/acquire");
    assert.equal(held.status, 200);
    const { token } = await held.json();
    const busy = await post(NEW, "/v1/locks/rotate/acquire");
    assert.equal(busy.status, 409, "the new key sees the old key's lock: one tenant");
    await busy.body?.cancel();
    const released = await app.request("/v1/locks/rotate/release", {
      method: "POST",
      headers: { authorization: `Bearer ${NEW}`, "content-type": "application/json" },
      body: JSON.stringify({ token }),
    });
    assert.deepEqual(await released.json(), { released: true });
  } finally {
    await backend.stop();
  }
});
