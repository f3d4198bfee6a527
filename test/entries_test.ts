import assert from "node:assert/strict";
import { Redis as IORedis } from "ioredis";
import { createClient } from "@edgelock/edgelock/client";
import { EdgelockError } from "@edgelock/edgelock";
import { freePort } from "../dev/redis_server.ts";
import { keygen, startBackend } from "./_backend.ts";
import { LISTENING, spawnDeno } from "./_process.ts";

const SECRET = "deno-entry-secret-0123456789";

Deno.test("the Deno entry serves the API to the typed client over real HTTP", async (t) => {
  const backend = await startBackend();
  const service = await spawnDeno(["run", "-A", "worker/deno.ts"], {
    PORT: "0", // the service binds a free port itself and prints it: no port to race for
    UPSTASH_REDIS_REST_URL: backend.bridge.url,
    UPSTASH_REDIS_REST_TOKEN: backend.token,
    LOCK_API_KEYS: `app:${SECRET}`,
  }, LISTENING);
  const port = Number(service.ready[1]);
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
      const fences = await locks.withLock(name, { ttlMs: 600 }, async (lease, signal) => {
        await new Promise((resolve) => setTimeout(resolve, 2000)); // over three TTLs
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
  // Wait for every line the test reads, each up to its newline: the key is printed last.
  const dev = await spawnDeno(
    ["run", "-A", "dev/server.ts"],
    { PORT: "0", PATH: Deno.env.get("PATH") ?? "" },
    /redis-server on redis:\/\/127\.0\.0\.1:(\d+)[^]*edgelock on http:\/\/127\.0\.0\.1:(\d+)\n[^]*Dev API key \(tenant "dev"\): (\S+)\n/,
  );
  const [, redisPort, port, key] = dev.ready.map(String);
  try {
    const locks = createClient({ baseUrl: `http://127.0.0.1:${port}`, apiKey: key! });
    const result = await locks.acquire("dev-demo");
    assert.ok(result.acquired);
    // The README's restart guarantee assumes every write is in the AOF before the reply.
    const redis = new IORedis(Number(redisPort), "127.0.0.1", { retryStrategy: () => null });
    try {
      assert.deepEqual(await redis.config("GET", "appendonly"), ["appendonly", "yes"]);
      assert.deepEqual(await redis.config("GET", "appendfsync"), ["appendfsync", "always"]);
    } finally {
      redis.disconnect();
    }
  } finally {
    const status = await dev.stop("SIGINT");
    assert.equal(status.code, 0, dev.output());
  }
  await assert.rejects(Deno.connect({ hostname: "127.0.0.1", port: Number(port) }), "stopped");
  await assert.rejects(Deno.connect({ hostname: "127.0.0.1", port: Number(redisPort) }), "redis");
});
