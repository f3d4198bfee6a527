import assert from "node:assert/strict";
import { Redis } from "@upstash/redis";
import { Redis as IORedis } from "ioredis";
import { createClient } from "@edgelock/edgelock/client";
import { EdgelockError } from "@edgelock/edgelock";
import { freePort } from "../dev/redis_server.ts";
import { keygen, shared, startBackend } from "./_backend.ts";
import { LISTENING, spawnDeno } from "./_process.ts";

const SECRET = "deno-entry-secret-0123456789";

const fixture = shared(async () => {
  const backend = await startBackend();
  const service = await spawnDeno(["run", "-A", "worker/deno.ts"], {
    PORT: "0", // the service binds a free port itself and prints it: no port to race for
    UPSTASH_REDIS_REST_URL: backend.bridge.url,
    UPSTASH_REDIS_REST_TOKEN: backend.token,
    LOCK_API_KEYS: `app:${SECRET}`,
  }, LISTENING);
  const port = Number(service.ready[1]);
  const locks = createClient({ baseUrl: `http://127.0.0.1:${port}`, apiKey: SECRET });
  return { backend, service, port, locks };
}, async ({ backend, service }) => {
  await service.stop();
  await backend.stop();
});

Deno.test("the client acquires, renews, inspects and releases", async () => {
  const { locks } = await fixture();
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

Deno.test("withLock() through the service renews across several TTLs", async () => {
  const { locks } = await fixture();
  const name = keygen();
  // A renewal every 500 ms, each with 700 ms to come back before the signal would abort: room for
  // a loaded machine, where a 600 ms TTL left 280 ms and once aborted.
  const fences = await locks.withLock(name, { ttlMs: 1500 }, async (lease, signal) => {
    await new Promise((resolve) => setTimeout(resolve, 5000)); // over three TTLs
    assert.equal(signal.aborted, false);
    const info = await locks.inspect(name);
    assert.ok(info.held);
    return [lease.fence, info.fence];
  });
  assert.equal(fences[0], fences[1]);
  assert.deepEqual(await locks.inspect(name), { name, held: false });
});

Deno.test("withLock() through the service aborts when the lock is stolen", async () => {
  const { backend, locks } = await fixture();
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

Deno.test("the client reports a wrong key as refused, not as missing", async () => {
  const { port } = await fixture();
  const wrong = createClient({ baseUrl: `http://127.0.0.1:${port}`, apiKey: "nope" });
  await assert.rejects(wrong.inspect(keygen()), {
    code: "unauthorized",
    message: /^The API key was refused/,
  });
});

Deno.test("the client names a wrong baseUrl as config_error: Redis's URL, a /v1 suffix, a subpath", async () => {
  const { port, backend } = await fixture();
  const service = `http://127.0.0.1:${port}`;
  // The Redis REST URL in place of the service's, with either token: never "HTTP 401".
  for (const apiKey of [SECRET, backend.token]) {
    const redis = createClient({ baseUrl: backend.bridge.url, apiKey, retries: 0 });
    const error = await redis.acquire(keygen()).then(() => undefined, (error) => error);
    assert.ok(error instanceof EdgelockError && error.code === "config_error", String(error));
    assert.match(error.message, /answered like a Redis REST endpoint .*not UPSTASH_REDIS_REST_URL/);
    assert.equal(error.retryAfterMs, undefined, "a misconfiguration is no hint to retry");
  }
  assert.throws(
    () => createClient({ baseUrl: `${service}/v1`, apiKey: SECRET }),
    new TypeError(
      `baseUrl "${service}/v1" ends in /v1: give the service's root (${service}); ` +
        "the client adds /v1",
    ),
  );
  const nested = createClient({ baseUrl: `${service}/locks`, apiKey: SECRET });
  await assert.rejects(nested.inspect(keygen()), {
    code: "config_error",
    message: `The server at ${service}/locks has no edgelock API there (HTTP 404, no such ` +
      "route): baseUrl is the service's root, where /openapi.json is",
  });
});

Deno.test("the client names why it cannot reach the service: nothing listening, TLS to HTTP", async () => {
  const { port } = await fixture();
  const origin = `http://127.0.0.1:${freePort()}`;
  const closed = createClient({ baseUrl: origin, apiKey: SECRET, retries: 1 });
  const refused = await closed.acquire(keygen()).then(() => undefined, (error) => error);
  assert.ok(refused instanceof EdgelockError, String(refused));
  assert.equal(refused.code, "backend_unavailable", "a service restarting looks the same");
  assert.equal(
    refused.message,
    `The lock service is unavailable: Nothing accepts connections at ${origin} (refused): ` +
      "check baseUrl",
  );
  assert.match(Deno.inspect(refused), /Connection refused|ECONNREFUSED/);
  // https:// to the plain-HTTP service: a misconfiguration, told at once, not retried.
  const tls = createClient({ baseUrl: `https://127.0.0.1:${port}`, apiKey: SECRET, retries: 10 });
  await assert.rejects(tls.inspect(keygen()), {
    code: "config_error",
    message: `TLS failed with https://127.0.0.1:${port}: is it a plain http:// server? check ` +
      "baseUrl",
  });
});

Deno.test("the client gives up on a service that accepts and never answers, and retries first", async () => {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const held: Deno.Conn[] = [];
  const accepting = (async () => {
    for await (const conn of listener) held.push(conn); // read nothing, answer nothing
  })();
  try {
    const silent = createClient({
      baseUrl: `http://127.0.0.1:${listener.addr.port}`,
      apiKey: SECRET,
      retries: 1,
      timeoutMs: 200,
    });
    await assert.rejects(silent.inspect(keygen()), {
      code: "backend_unavailable",
      message: /^The lock service at http:\/\/127\.0\.0\.1:\d+ is unavailable$/,
    });
    assert.equal(held.length, 2, "the attempt and its retry");
    assert.throws(
      () => createClient({ baseUrl: "http://x.test", apiKey: SECRET, timeoutMs: 5 }),
      new RangeError("timeoutMs must be an integer from 100 to 120000 milliseconds"),
    );
  } finally {
    listener.close();
    for (const conn of held) conn.close();
    await accepting.catch(() => {});
  }
});

Deno.test("deno task dev starts redis-server, bridge and service, and Ctrl-C stops them all", async () => {
  // Wait for every line the test reads, each up to its newline: the key is printed last.
  const dev = await spawnDeno(
    ["run", "-A", "dev/server.ts"],
    { PORT: "0", BRIDGE_PORT: "0", PATH: Deno.env.get("PATH") ?? "" },
    /redis-server on redis:\/\/127\.0\.0\.1:(\d+)[^]*UPSTASH_REDIS_REST_URL=(\S+)\n\s*UPSTASH_REDIS_REST_TOKEN=(\S+)\n[^]*edgelock on http:\/\/127\.0\.0\.1:(\d+)\n[^]*Dev API key \(tenant "dev"\): (\S+)\n/,
  );
  const [, redisPort, bridgeUrl, bridgeToken, port, key] = dev.ready.map(String);
  try {
    const locks = createClient({ baseUrl: `http://127.0.0.1:${port}`, apiKey: key! });
    const result = await locks.acquire("dev-demo");
    assert.ok(result.acquired);
    // The printed bridge URL and token work for any Upstash client (a `wrangler dev` Worker).
    const upstash = new Redis({ url: bridgeUrl!, token: bridgeToken!, enableTelemetry: false });
    assert.equal(await upstash.ping(), "PONG");
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

// deno task dev and the Deno entry refuse a bad configuration with one clear line:
const run = async (entry: string, env: Record<string, string>, args: string[] = []) => {
  const { code, stdout, stderr } = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", entry, ...args],
    env: { PATH: Deno.env.get("PATH") ?? "", NO_COLOR: "1", PORT: "0", BRIDGE_PORT: "0", ...env },
    clearEnv: true,
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder().decode(stderr) + new TextDecoder().decode(stdout);
  return { code, text };
};
const good = {
  UPSTASH_REDIS_REST_URL: "http://127.0.0.1:1",
  UPSTASH_REDIS_REST_TOKEN: "token",
  LOCK_API_KEYS: `app:${SECRET}`,
};

Deno.test("the Deno entry exits 1 naming the variable, never its value", async () => {
  const cases: [Record<string, string>, RegExp][] = [
    [{ UPSTASH_REDIS_REST_URL: "" }, /UPSTASH_REDIS_REST_URL is not set/],
    [{ UPSTASH_REDIS_REST_URL: "rediss://default:pw@x.upstash.io:6379" }, /not its TCP URL/],
    [{ UPSTASH_REDIS_REST_TOKEN: "" }, /UPSTASH_REDIS_REST_TOKEN is not set/],
    [{ LOCK_API_KEYS: "" }, /LOCK_API_KEYS is not set/],
    [{ LOCK_API_KEYS: "app:short-secret" }, /secret of tenant "app" must be 16–256/],
    [
      { LOCK_MAX_WAIT: "5" },
      /LOCK_MAX_WAIT is not an edgelock setting \(did you mean LOCK_MAX_WAITS\?\)/,
    ],
  ];
  for (const [change, message] of cases) {
    const { code, text } = await run("worker/deno.ts", { ...good, ...change });
    assert.equal(code, 1, text);
    assert.match(text, message);
    assert.equal(text.trim().split("\n").length, 1, text);
    assert.ok(!text.includes("short-secret") && !text.includes("pw@"), "no values echoed");
  }
});

Deno.test(
  "deno task dev exits 1 on a bad LOCK_API_KEYS and stops what it started",
  async () => {
    const { code, text } = await run("dev/server.ts", { LOCK_API_KEYS: "nocolon" });
    assert.equal(code, 1, text);
    assert.match(text, /edgelock dev: LOCK_API_KEYS: each entry is tenant:secret/);
    const dir = /data in (\S+)\)/.exec(text)?.[1];
    if (dir) await assert.rejects(Deno.stat(dir), Deno.errors.NotFound, "its temp dir is gone");
  },
);

Deno.test("deno task dev explains a port already in use", async () => {
  const taken = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  try {
    const port = String((taken.addr as Deno.NetAddr).port);
    const { code, text } = await run("dev/server.ts", { PORT: port });
    assert.equal(code, 1, text);
    assert.match(text, new RegExp(`port ${port} \\(the service\\) is in use.*--port or PORT`));
  } finally {
    taken.close();
  }
});

Deno.test(
  "deno task dev answers --help and rejects unknown flags and bad values",
  async () => {
    const help = await run("dev/server.ts", {}, ["--help"]);
    assert.equal(help.code, 0);
    assert.match(help.text, /--port <number>/);
    const unknown = await run("dev/server.ts", {}, ["--prot", "1"]);
    assert.equal(unknown.code, 2);
    assert.match(unknown.text, /unknown argument --prot/);
    const bad = await run("dev/server.ts", {}, ["--port", "abc"]);
    assert.equal(bad.code, 2);
    assert.match(bad.text, /--port must be a number from 0 to 65535, not "abc"/);
  },
);

Deno.test("the Deno entry as Deno Deploy runs it: cron before serve, one run per tick", async () => {
  const backend = await startBackend();
  const dir = await Deno.makeTempDir({ prefix: "edgelock-deploy-" });
  // Stands in for the platform: records when Deno.cron is called, then fires the job twice in
  // the same tick, as two isolates (or a retry) would.
  const preload = `${dir}/platform.js`;
  await Deno.writeTextFile(
    preload,
    `let served = false;
const serve = Deno.serve;
Deno.serve = (...args) => { served = true; return serve(...args); };
Deno.cron = (name, schedule, fn) => {
  console.log("CRON " + name + " " + schedule + " before-serve=" + !served);
  setTimeout(async () => { await fn(); await fn(); console.log("CRON-FIRED-TWICE"); }, 0);
  return Promise.resolve();
};
`,
  );
  const service = await spawnDeno(
    ["run", "-A", `--preload=${preload}`, "worker/deno.ts"],
    {
      DENO_SERVE_ADDRESS: "tcp:127.0.0.1:0", // how the platform sets the address
      PORT: "99999", // not a port: the platform's address wins
      UPSTASH_REDIS_REST_URL: backend.bridge.url,
      UPSTASH_REDIS_REST_TOKEN: backend.token,
      LOCK_API_KEYS: `app:${SECRET}`,
    },
    /CRON (\S+) (.+) before-serve=(\w+)\n[^]*Listening on http:\/\/127\.0\.0\.1:(\d+)\/[^]*CRON-FIRED-TWICE\n/,
  );
  try {
    const [, name, schedule, beforeServe, port] = service.ready;
    assert.deepEqual([name, schedule, beforeServe], ["example-heartbeat", "*/5 * * * *", "true"]);
    const health = await fetch(`http://127.0.0.1:${port}/healthz`);
    assert.deepEqual(await health.json(), { ok: true });
    assert.match(service.output(), /example-heartbeat: skipped \(tick_done\)/);
    const runs = await backend.redis.lrange("edgelock.deno:example-heartbeat:runs", 0, -1);
    assert.equal(runs.length, 1, "the second firing of the tick did not run");
  } finally {
    await service.stop();
    await backend.stop();
    await Deno.remove(dir, { recursive: true });
  }
});
