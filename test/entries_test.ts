import assert from "node:assert/strict";
import { createClient, EdgelockError } from "../src/mod.ts";
import { freePort } from "../dev/redis_server.ts";
import { keygen, startBackend } from "./_backend.ts";
import { spawnDeno } from "./_process.ts";

const SECRET = "deno-entry-secret-0123456789";

Deno.test("the Deno entry serves the API to the typed client over real HTTP", async (t) => {
  const backend = await startBackend();
  const port = freePort();
  const service = await spawnDeno(["run", "-A", "worker/deno.ts"], {
    PORT: String(port),
    UPSTASH_REDIS_REST_URL: backend.bridge.url,
    UPSTASH_REDIS_REST_TOKEN: backend.token,
    LOCK_API_KEYS: `app:${SECRET}`,
  }, /Listening on/);
  const locks = createClient({ baseUrl: `http://127.0.0.1:${port}`, apiKey: SECRET });

  try {
    await t.step("the client acquires, renews, inspects and releases", async () => {
      const name = keygen();
      const result = await locks.acquire(name, { ttlMs: 2000, meta: { by: "client" } });
      assert.ok(result.acquired);
      const busy = await locks.acquire(name);
      assert.ok(!busy.acquired && busy.retryAfterMs > 0);
      const renewed = await locks.renew(result.lease, { ttlMs: 3000 });
      assert.ok(renewed.renewed && renewed.lease.fence === result.lease.fence);
      const info = await locks.inspect(name);
      assert.ok(info.held && info.fence === result.lease.fence);
      assert.deepEqual(info.meta, { by: "client" });
      assert.equal(await locks.release(result.lease), true);
      assert.equal(await locks.release(result.lease), true, "a retried release answers the same");
      assert.deepEqual(await locks.renew(result.lease), { renewed: false });
    });

    await t.step("withLock() through the service renews across several TTLs", async () => {
      const name = keygen();
      const fences = await locks.withLock(name, { ttlMs: 300 }, async (lease, signal) => {
        await new Promise((resolve) => setTimeout(resolve, 1200)); // four TTLs
        assert.equal(signal.aborted, false);
        const info = await locks.inspect(name);
        assert.ok(info.held);
        return [lease.fence, info.fence];
      });
      assert.equal(fences[0], fences[1]);
      assert.deepEqual(await locks.inspect(name), { name, held: false });
    });

    await t.step("withLock() through the service aborts when the lock is stolen", async () => {
      const name = keygen();
      let aborted = false;
      await assert.rejects(
        locks.withLock(name, { ttlMs: 300 }, async (_lease, signal) => {
          await backend.redis.del(`edgelock:app:lock:{${name}}`);
          await new Promise<void>((resolve) => {
            const timer = setTimeout(resolve, 3000);
            signal.addEventListener("abort", () => {
              aborted = true;
              clearTimeout(timer);
              resolve();
            });
          });
        }),
        (error: unknown) => error instanceof EdgelockError && error.code === "lock_lost",
      );
      assert.ok(aborted);
    });

    await t.step("the client reports a wrong key as unauthorized", async () => {
      const wrong = createClient({ baseUrl: `http://127.0.0.1:${port}`, apiKey: "nope" });
      await assert.rejects(wrong.inspect(keygen()), { code: "unauthorized" });
    });

    await t.step("the client turns an unreachable service into backend_unavailable", async () => {
      const closed = createClient({
        baseUrl: `http://127.0.0.1:${freePort()}`,
        apiKey: SECRET,
        retries: 1,
      });
      await assert.rejects(closed.acquire(keygen()), { code: "backend_unavailable" });
    });
  } finally {
    await service.stop();
    await backend.stop();
  }
});

Deno.test("deno task dev starts redis-server, bridge and service, and Ctrl-C stops them all", async () => {
  const port = freePort();
  const dev = await spawnDeno(["run", "-A", "dev/server.ts"], {
    PORT: String(port),
    PATH: Deno.env.get("PATH") ?? "",
  }, /edgelock on http/);
  let redisPort = 0;
  try {
    redisPort = Number(/redis-server on redis:\/\/127\.0\.0\.1:(\d+)/.exec(dev.output())?.[1]);
    const key = /Dev API key \(tenant "dev"\): (\S+)/.exec(dev.output())?.[1];
    assert.ok(redisPort > 0 && key, dev.output());
    const locks = createClient({ baseUrl: `http://127.0.0.1:${port}`, apiKey: key });
    const result = await locks.acquire("dev-demo");
    assert.ok(result.acquired);
  } finally {
    const status = await dev.stop("SIGINT");
    assert.equal(status.code, 0, dev.output());
  }
  await assert.rejects(Deno.connect({ hostname: "127.0.0.1", port }), "the service stopped");
  await assert.rejects(Deno.connect({ hostname: "127.0.0.1", port: redisPort }), "redis stopped");
});
