import assert from "node:assert/strict";
import { Miniflare } from "miniflare";
import { createClient } from "@edgelock/edgelock/client";
import { freePort } from "../dev/redis_server.ts";
import { keygen, shared, startBackend } from "./_backend.ts";
import { bundleWorker, sendRaw, spawnDeno } from "./_process.ts";
import { serviceSources, stripDocs } from "../dev/build_worker.ts";

const SECRET_A = "worker-secret-a-0123456789";
const SECRET_B = "worker-secret-b-0123456789";

// The bundled Worker in Miniflare (workerd), against the bridge.
const fixture = shared(async () => {
  const backend = await startBackend();
  const script = await bundleWorker();
  const bindings = {
    UPSTASH_REDIS_REST_URL: backend.bridge.url,
    UPSTASH_REDIS_REST_TOKEN: backend.token,
    LOCK_API_KEYS: `a:${SECRET_A},b:${SECRET_B}`,
  };
  const text = await Deno.readTextFile(script);
  // The Worker alone, without static assets, its bindings changed by `change`.
  const alone = (change: Record<string, string> = {}) =>
    new Miniflare({
      modules: true,
      script: text,
      compatibilityDate: "2026-08-01",
      bindings: { ...bindings, ...change },
    });
  const mf = new Miniflare({
    modules: true,
    script: text,
    compatibilityDate: "2026-08-01",
    bindings,
    // wrangler.toml's [assets], as wrangler passes it: the Worker runs first for every path.
    assets: {
      directory: script.replace(/worker\.js$/, "assets"),
      binding: "ASSETS",
      routerConfig: { has_user_worker: true, invoke_user_worker_ahead_of_assets: true },
    },
  });
  const call = async (path: string, secret: string, body?: unknown) => {
    const res = await mf.dispatchFetch(`http://edgelock.test${path}`, {
      method: body === undefined ? "GET" : "POST",
      headers: { authorization: `Bearer ${secret}`, "content-type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    return { status: res.status, body: await res.json() as Record<string, unknown> };
  };
  return { backend, script, alone, mf, call };
}, async ({ backend, script, mf }) => {
  await mf.dispose();
  await backend.stop();
  await Deno.remove(script.replace(/\/worker\.js$/, ""), { recursive: true });
});

Deno.test("acquire, renew and release through the Worker", async () => {
  const { call } = await fixture();
  const name = keygen("w");
  const acquired = await call(`/v1/locks/${name}/acquire`, SECRET_A, { ttlMs: 2000 });
  assert.equal(acquired.status, 200);
  const { token, fence } = acquired.body;
  const renewed = await call(`/v1/locks/${name}/renew`, SECRET_A, { token, ttlMs: 4000 });
  assert.equal(renewed.status, 200);
  assert.equal(renewed.body.fence, fence);
  assert.equal(renewed.body.ttlMs, 4000);
  const released = await call(`/v1/locks/${name}/release`, SECRET_A, { token });
  assert.deepEqual(released, { status: 200, body: { released: true } });
});

Deno.test("two clients contend: one acquires, the other gets 409 lock_busy", async () => {
  const { call } = await fixture();
  const name = keygen("w");
  const [first, second] = await Promise.all([
    call(`/v1/locks/${name}/acquire`, SECRET_A, {
      ttlMs: 3000,
      token: "client-one-token-0001",
    }),
    call(`/v1/locks/${name}/acquire`, SECRET_A, {
      ttlMs: 3000,
      token: "client-two-token-0002",
    }),
  ]);
  assert.deepEqual([first.status, second.status].sort(), [200, 409]);
  const busy = first.status === 409 ? first : second;
  assert.equal(busy.body.code, "lock_busy");
  assert.ok(Number(busy.body.retryAfterMs) > 0);
});

Deno.test("readers, a semaphore and a multi-name lock through the Worker", async () => {
  const { call } = await fixture();
  const rw = keygen("w");
  const readers = await Promise.all(
    [1, 2].map(() => call(`/v1/locks/${rw}/acquire`, SECRET_A, { mode: "shared" })),
  );
  assert.deepEqual(readers.map((r) => [r.status, r.body.mode]), [[200, "shared"], [
    200,
    "shared",
  ]]);
  const writer = await call(`/v1/locks/${rw}/acquire`, SECRET_A, {});
  assert.equal(writer.body.code, "lock_busy");
  const sem = await call(`/v1/locks/${rw}/acquire`, SECRET_A, { limit: 2 });
  assert.deepEqual([sem.status, sem.body.code], [409, "mode_mismatch"]);
  const tag = `{${keygen("w")}}`;
  const both = await call("/v1/locks/acquire", SECRET_A, { names: [`${tag}a`, `${tag}b`] });
  assert.equal(both.status, 200);
  assert.equal((both.body.leases as unknown[]).length, 2);
});

Deno.test("another tenant's key neither sees nor takes the lock", async () => {
  const { call } = await fixture();
  const name = keygen("w");
  const held = await call(`/v1/locks/${name}/acquire`, SECRET_A, { ttlMs: 3000 });
  assert.equal(held.status, 200, "tenant a holds it");
  const info = await call(`/v1/locks/${name}`, SECRET_B);
  assert.deepEqual(info.body, { name, held: false });
  assert.equal((await call(`/v1/locks/${name}/acquire`, SECRET_B, {})).status, 200);
});

Deno.test("the scheduled handler runs each tick once, even when triggered twice", async () => {
  const { backend, mf } = await fixture();
  // Miniflare's Fetcher typing lacks scheduled(); the method is there at run time.
  const worker = await mf.getWorker() as unknown as {
    scheduled(event: { cron: string; scheduledTime: Date }): Promise<unknown>;
  };
  const scheduledTime = new Date(Date.UTC(2026, 0, 1, 0, 5));
  await Promise.all([
    worker.scheduled({ cron: "*/5 * * * *", scheduledTime }),
    worker.scheduled({ cron: "*/5 * * * *", scheduledTime }),
  ]);
  await worker.scheduled({ cron: "*/5 * * * *", scheduledTime });
  const runs = await backend.redis.lrange("edgelock.worker:example-heartbeat:runs", 0, -1);
  assert.equal(runs.length, 1);
  assert.equal((runs[0] as unknown as { tick: number }).tick, scheduledTime.getTime());
});

Deno.test("/openapi.json comes from the Worker's static assets, and a wrong method there is 405", async () => {
  const { script, mf } = await fixture();
  const document = await Deno.readTextFile(new URL("../src/service/openapi.json", import.meta.url));
  // The script does not carry the document (bundled, it would hold `openapi:"3.1.0"`).
  const bundled = await Deno.readTextFile(script);
  assert.equal(bundled.includes('openapi:"3.1.0"'), false);
  // Nor the route table's texts, which only the document needs (the document keeps them).
  for (const text of ["A JSON object of at most 1 KiB, shown by GET", "Lease length in ms"]) {
    assert.ok(document.includes(text), text);
  }
  assert.equal(bundled.includes("A JSON object of at most 1 KiB, shown by GET"), false);
  const got = await mf.dispatchFetch("http://edgelock.test/openapi.json");
  assert.equal(got.status, 200);
  assert.match(got.headers.get("content-type") ?? "", /^application\/json/);
  assert.ok(got.headers.get("x-request-id"), "the Worker answered it, with its request id");
  assert.deepEqual(await got.json(), JSON.parse(document));
  // The document's body alone, as every entry answers it: no ETag to revalidate, no 304, no
  // range, and no redirect for a path spelt with escapes.
  assert.equal(got.headers.get("etag"), null);
  for (
    const [path, headers] of [
      ["/openapi.json", { "if-none-match": "*" }],
      ["/openapi.json", { "if-modified-since": new Date(Date.now() + 86_400_000).toUTCString() }],
      ["/openapi.json", { range: "bytes=0-9" }],
      ["/openapi%2Ejson", {}],
    ] as const
  ) {
    const res = await mf.dispatchFetch(`http://edgelock.test${path}`, { headers });
    assert.equal(res.status, 200, `${path} ${JSON.stringify(headers)}`);
    assert.deepEqual(await res.json(), JSON.parse(document));
  }
  const head = await mf.dispatchFetch("http://edgelock.test/openapi.json", { method: "HEAD" });
  assert.equal(head.status, 200);
  await head.body?.cancel();
  for (const method of ["POST", "PUT", "DELETE", "OPTIONS"]) {
    const res = await mf.dispatchFetch("http://edgelock.test/openapi.json", { method });
    assert.equal(res.status, 405, method);
    assert.equal(res.headers.get("allow"), "GET, HEAD");
    assert.equal(res.headers.get("content-type"), "application/problem+json");
    assert.ok(res.headers.get("x-request-id"));
    assert.equal((await res.json() as { code: string }).code, "method_not_allowed");
  }
});

Deno.test("the Worker build empties the service's route docs and no other description", async () => {
  const sources = await serviceSources();
  const js = 'a={description:"A JSON object of at most 1 KiB, shown by GET",x:1};' +
    "b={summary:`Claim the ${d} for one worker, or learn that it is ${l}`};" +
    'c={description:"A dependency says this of its own option"};d={description:"short"}';
  assert.equal(
    stripDocs(js, sources),
    'a={description:"",x:1};b={summary:`Claim the ${d} for one worker, or learn that it is ${l}`};' +
      'c={description:"A dependency says this of its own option"};d={description:"short"}',
  );
});

Deno.test("a GET with a body is served and a body cut short is a 400, in workerd", async () => {
  const { alone } = await fixture();
  const mf = alone();
  try {
    const port = Number((await mf.ready).port);
    const request = (line: string, body: string) =>
      `${line} HTTP/1.1\r\nHost: edgelock.test\r\nAuthorization: Bearer ${SECRET_A}\r\n` +
      `Content-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n${body}`;
    // workerd refuses to copy a GET's body, which a body limit on every route did (a 500).
    for (const line of ["GET /v1/me", "GET /v1/locks?limit=5"]) {
      const got = await sendRaw(port, request(line, "2\r\n{}\r\n0\r\n\r\n"));
      assert.equal(got.status, 200, `${line}: ${got.body}`);
    }
    // No last chunk. (A malformed chunk size is a 400 here too, but workerd logs it loudly.)
    const cut = await sendRaw(port, request(`POST /v1/locks/${keygen()}/acquire`, "2\r\n{}\r\n"));
    assert.equal(cut.status, 400, cut.body);
    assert.match(JSON.parse(cut.body).detail, /could not be read/);
  } finally {
    await mf.dispose();
  }
});

Deno.test("a wrong key gets 401 problem+json", async () => {
  const { call } = await fixture();
  const name = keygen("w");
  const res = await call(`/v1/locks/${name}`, "not-a-key");
  assert.equal(res.status, 401);
  assert.equal(res.body.code, "unauthorized");
});

Deno.test("a misconfigured Worker answers 500 config_error naming the variable, not its value", async () => {
  const { alone } = await fixture();
  const cases: [Record<string, string>, RegExp][] = [
    [{ LOCK_API_KEYS: "" }, /LOCK_API_KEYS is not set/],
    [{ LOCK_API_KEYS: "a:too-short" }, /secret of tenant "a" must be 16–256/],
    [
      { UPSTASH_REDIS_REST_URL: "not a url" },
      /UPSTASH_REDIS_REST_URL is not an http\(s\) URL/,
    ],
    [{ UPSTASH_REDIS_REST_TOKEN: "" }, /UPSTASH_REDIS_REST_TOKEN is not set/],
  ];
  for (const [change, message] of cases) {
    const bad = alone(change);
    try {
      const res = await bad.dispatchFetch("http://edgelock.test/v1/locks/x");
      const body = await res.json() as Record<string, unknown>;
      assert.equal(res.status, 500);
      assert.equal(res.headers.get("content-type"), "application/problem+json");
      assert.equal(body.code, "config_error");
      assert.match(String(body.detail), message);
      assert.equal(res.headers.get("cache-control"), "no-store");
      assert.equal(res.headers.get("x-request-id"), body.requestId);
      assert.ok(!JSON.stringify(body).includes("too-short"), "never the value");
    } finally {
      await bad.dispose();
    }
  }
});

Deno.test("a Worker deployed without its [assets] answers /openapi.json 500 config_error, and serves locks", async () => {
  const { alone } = await fixture();
  const bare = alone();
  try {
    const res = await bare.dispatchFetch("http://edgelock.test/openapi.json");
    const body = await res.json() as Record<string, unknown>;
    assert.equal(res.status, 500);
    assert.equal(res.headers.get("content-type"), "application/problem+json");
    assert.equal(body.code, "config_error");
    assert.doesNotMatch(JSON.stringify(body), /undefined|fetch|ASSETS/);
    const lock = await bare.dispatchFetch(`http://edgelock.test/v1/locks/${keygen("w")}/acquire`, {
      method: "POST",
      headers: { authorization: `Bearer ${SECRET_A}`, "content-type": "application/json" },
      body: "{}",
    });
    assert.equal(lock.status, 200);
    await lock.body?.cancel();
  } finally {
    await bare.dispose();
  }
});

Deno.test("a refused Upstash token is 500 config_error, not a retryable 503", async () => {
  const { alone } = await fixture();
  const name = keygen("w");
  const bad = alone({ UPSTASH_REDIS_REST_TOKEN: "wrong-token" });
  try {
    for (const path of ["/healthz", `/v1/locks/${name}`]) {
      const res = await bad.dispatchFetch(`http://edgelock.test${path}`, {
        headers: { authorization: `Bearer ${SECRET_A}` },
      });
      const body = await res.json() as Record<string, unknown>;
      assert.equal(res.status, 500, path);
      assert.equal(body.code, "config_error");
      assert.equal(res.headers.get("retry-after"), null);
      assert.doesNotMatch(JSON.stringify(body), /Unauthorized|WRONGPASS|command was/);
    }
  } finally {
    await bad.dispose();
  }
});

Deno.test("wrangler dev runs the [build] command and serves the Worker against the bridge", async () => {
  const backend = await startBackend();
  const dir = await Deno.makeTempDir({ prefix: "edgelock-wrangler-" });
  // The README's .dev.vars, as a file outside the repository.
  await Deno.writeTextFile(
    `${dir}/dev.vars`,
    [
      `UPSTASH_REDIS_REST_URL=${backend.bridge.url}`,
      `UPSTASH_REDIS_REST_TOKEN=${backend.token}`,
      `LOCK_API_KEYS=local:${SECRET_A}`,
    ].join("\n") + "\n",
  );
  const port = freePort();
  const wrangler = await spawnDeno(
    [
      "run",
      "-A",
      "npm:wrangler@4.164.0",
      "dev",
      "--ip",
      "127.0.0.1",
      "--port",
      String(port),
      "--env-file",
      `${dir}/dev.vars`,
      "--persist-to",
      `${dir}/state`,
      "--show-interactive-dev-session=false",
    ],
    { PATH: Deno.env.get("PATH") ?? "", HOME: dir, WRANGLER_SEND_METRICS: "false", CI: "true" },
    /Running: deno task build:worker[^]*Ready on http:\/\/127\.0\.0\.1:(\d+)\n/,
    90_000,
  );
  try {
    const locks = createClient({
      baseUrl: `http://127.0.0.1:${wrangler.ready[1]}`,
      apiKey: SECRET_A,
    });
    const result = await locks.acquire(keygen("wd"), { ttlMs: 2000 });
    assert.ok(result.acquired);
    const renewed = await locks.renew(result.lease, { ttlMs: 3000 });
    assert.ok(renewed.renewed && renewed.lease.fence === result.lease.fence);
    assert.equal(await locks.release(result.lease), true);
    // wrangler.toml's [assets]: the document through the binding, a wrong method the Worker's 405.
    const base = `http://127.0.0.1:${wrangler.ready[1]}/openapi.json`;
    const document = await fetch(base);
    assert.equal(document.status, 200);
    assert.equal((await document.json()).openapi, "3.1.0");
    const post = await fetch(base, { method: "POST" });
    assert.deepEqual([post.status, post.headers.get("allow")], [405, "GET, HEAD"]);
    assert.equal((await post.json()).code, "method_not_allowed");
  } finally {
    await wrangler.stop("SIGINT");
    await backend.stop();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("idempotency() in workerd stores the bytes its caller got, whatever view a stream sent", async () => {
  const { backend } = await fixture();
  const dir = await Deno.makeTempDir({ prefix: "edgelock-idempotent-" });
  const bundled = await new Deno.Command(Deno.execPath(), {
    args: ["bundle", "--platform=browser", "-o", `${dir}/worker.js`, "test/_idempotent_worker.ts"],
    stdout: "null",
    stderr: "piped",
  }).output();
  assert.ok(bundled.success, new TextDecoder().decode(bundled.stderr));
  const mf = new Miniflare({
    modules: true,
    script: await Deno.readTextFile(`${dir}/worker.js`),
    compatibilityDate: "2026-08-01",
    bindings: {
      UPSTASH_REDIS_REST_URL: backend.bridge.url,
      UPSTASH_REDIS_REST_TOKEN: backend.token,
    },
  });
  try {
    for (const view of ["buffer", "u16"]) {
      const key = crypto.randomUUID();
      const call = () =>
        mf.dispatchFetch(`http://worker.test/${view}`, {
          method: "POST",
          headers: { "idempotency-key": key },
        });
      const first = new Uint8Array(await (await call()).arrayBuffer());
      assert.ok(first.length > 0, view);
      const replay = await call();
      assert.equal(replay.headers.get("idempotent-replayed"), "true", view);
      assert.equal(replay.headers.get("idempotent-body"), null, `${view}: stored whole`);
      assert.deepEqual(new Uint8Array(await replay.arrayBuffer()), first, view);
    }
    assert.equal(await (await mf.dispatchFetch("http://worker.test/runs")).text(), "2");
  } finally {
    await mf.dispose();
    await Deno.remove(dir, { recursive: true });
  }
});
