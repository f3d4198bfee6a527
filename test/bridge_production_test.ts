// The bridge run as a production service: read-only and read-write tokens, TLS, Prometheus
// metrics, a request log that never holds a key, and configuration by environment alone.
import assert from "node:assert/strict";
import { Redis } from "@upstash/redis";
import { bridgeOptionsFromEnv, type RequestLog, startBridge } from "../bridge/mod.ts";
import { startRedisServer } from "../dev/redis_server.ts";
import { spawnDeno } from "./_process.ts";
import { keygen, shared } from "./_backend.ts";

const fixture = shared(async () => {
  const server = await startRedisServer();
  const token = crypto.randomUUID();
  const readonlyToken = crypto.randomUUID();
  const log: RequestLog[] = [];
  const bridge = await startBridge({
    redisUrl: server.url,
    token,
    readonlyToken,
    port: 0,
    log: (entry) => log.push(entry),
  });
  const writer = new Redis({ url: bridge.url, token, enableTelemetry: false, retry: false });
  const reader = new Redis({
    url: bridge.url,
    token: readonlyToken,
    enableTelemetry: false,
    retry: false,
    enableAutoPipelining: false,
  });
  const send = async (who: string, path: string, command: unknown) => {
    const res = await fetch(`${bridge.url}${path}`, {
      method: "POST",
      headers: { authorization: `Bearer ${who}` },
      body: JSON.stringify(command),
    });
    return { status: res.status, body: await res.json() };
  };
  return { server, token, readonlyToken, log, bridge, writer, reader, send };
}, async ({ server, bridge }) => {
  await bridge.close();
  await server.stop();
});

Deno.test("a read-only token reads but cannot write, publish or run a script", async () => {
  const { readonlyToken, bridge, writer, reader, send } = await fixture();
  const key = keygen("ro");
  await writer.set(key, "v");
  assert.equal(await reader.get(key), "v");
  assert.equal(await reader.exists(key), 1);
  assert.deepEqual(await reader.scan(0, { match: key }), ["0", [key]]);
  assert.equal(await reader.evalRo("return redis.call('GET', KEYS[1])", [key], []), "v");
  await assert.rejects(reader.set(key, "w"), /NOPERM this token is read-only: 'set'/);
  await assert.rejects(reader.del(key), /NOPERM/);
  await assert.rejects(reader.publish("c", "m"), /NOPERM/);
  await assert.rejects(reader.eval("return 1", [], []), /NOPERM.*'eval'/);
  await assert.rejects(reader.scriptLoad("return 1"), /NOPERM.*'script load'/);
  await assert.rejects(reader.flushall(), /NOPERM/);
  for (const command of [["CONFIG", "SET", "maxmemory", "1"], ["CLIENT", "KILL", "x"]]) {
    const { status, body } = await send(readonlyToken, "/", command);
    assert.equal(status, 400);
    assert.match(body.error, /not supported over REST/, command.join(" "));
  }
  // In a pipeline the refused command fails in its slot; a transaction is refused whole.
  const piped = await send(readonlyToken, "/pipeline", [["SET", key, "x"], ["GET", key]]);
  assert.match(piped.body[0].error, /NOPERM/);
  assert.deepEqual(piped.body[1], { result: "v" });
  const multi = await send(readonlyToken, "/multi-exec", [["GET", key], ["SET", key, "x"]]);
  assert.equal(multi.status, 400);
  assert.match(multi.body.error, /NOPERM/);
  const path = await fetch(`${bridge.url}/set/${key}/x?_token=${readonlyToken}`);
  assert.match((await path.json()).error, /NOPERM/);
  assert.equal(await writer.get(key), "v", "nothing was written");
  // The read-write token is not narrowed.
  assert.equal(await writer.set(key, "w"), "OK");
});

Deno.test("/metrics counts requests, errors, latency and pool use", async () => {
  const { token, readonlyToken, bridge, writer, send } = await fixture();
  const key = keygen("m");
  await writer.set(key, "v");
  await writer.get(key);
  // Traffic of its own to count, whatever ran before: refused commands (400s, command errors)
  // and two pipelines of reads.
  for (let i = 0; i < 10; i++) await send(readonlyToken, "/", ["SET", key, "x"]);
  for (let i = 0; i < 2; i++) {
    await send(token, "/pipeline", Array.from({ length: 5 }, () => ["GET", key]));
  }
  const res = await fetch(`${bridge.url}/metrics`);
  assert.equal(res.status, 200);
  assert.match(res.headers.get("content-type")!, /^text\/plain; version=0\.0\.4/);
  const text = await res.text();
  const value = (series: string) => {
    const line = text.split("\n").find((l) => l.startsWith(`${series} `));
    assert.ok(line, `${series} in\n${text}`);
    return Number(line.split(" ")[1]);
  };
  assert.ok(value('edgelock_bridge_requests_total{route="pipeline",status="200"}') >= 2);
  assert.ok(value('edgelock_bridge_requests_total{route="command",status="400"}') >= 5);
  assert.ok(value("edgelock_bridge_command_errors_total") >= 10);
  assert.ok(value("edgelock_bridge_commands_total") >= 20);
  const count = value('edgelock_bridge_request_duration_seconds_count{route="pipeline"}');
  assert.equal(
    value('edgelock_bridge_request_duration_seconds_bucket{route="pipeline",le="+Inf"}'),
    count,
  );
  assert.equal(value('edgelock_bridge_pool_size{pool="shared"}'), 4);
  assert.equal(value('edgelock_bridge_pool_in_use{pool="blocking"}'), 0);
  assert.ok(!text.includes(key) && !text.includes(token), "no key or token in the metrics");
});

Deno.test("the request log names route, command and status, never a key", async () => {
  const { token, readonlyToken, log, send } = await fixture();
  log.length = 0;
  const key = keygen("secret-key");
  await send(token, "/", ["SET", key, "secret-value"]);
  await send(readonlyToken, "/", ["DEL", key]);
  await send("wrong", "/", ["GET", key]);
  assert.equal(log.length, 3);
  assert.deepEqual(
    log.map(({ route, command, status, role, commands }) => ({
      route,
      command,
      status,
      role,
      commands,
    })),
    [
      { route: "command", command: "set", status: 200, role: "readwrite", commands: 1 },
      { route: "command", command: "del", status: 400, role: "readonly", commands: 1 },
      { route: "command", command: undefined, status: 401, role: undefined, commands: 0 },
    ],
  );
  const text = JSON.stringify(log);
  assert.ok(!/secret|wrong/.test(text), text);
  assert.ok(log.every((entry) => entry.seconds >= 0 && !isNaN(Date.parse(entry.time))));
});

Deno.test("the bridge serves HTTPS with a given certificate", async () => {
  const dir = await Deno.makeTempDir();
  const server = await startRedisServer();
  const client = await (async () => {
    const { success } = await new Deno.Command("openssl", {
      args: [
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=localhost",
        "-addext",
        "subjectAltName=IP:127.0.0.1",
        "-addext",
        "basicConstraints=critical,CA:FALSE",
        "-keyout",
        `${dir}/key.pem`,
        "-out",
        `${dir}/cert.pem`,
      ],
      stdout: "null",
      stderr: "null",
    }).output();
    assert.ok(success, "openssl made a certificate");
    return Deno.createHttpClient({ caCerts: [await Deno.readTextFile(`${dir}/cert.pem`)] });
  })();
  const token = crypto.randomUUID();
  const options = await bridgeOptionsFromEnv((name) =>
    ({
      UPSTASH_REDIS_REST_TOKEN: token,
      REDIS_URL: server.url,
      BRIDGE_PORT: "0",
      BRIDGE_TLS_CERT: `${dir}/cert.pem`,
      BRIDGE_TLS_KEY: `${dir}/key.pem`,
      BRIDGE_LOG: "off",
    })[name]
  );
  const bridge = await startBridge(options);
  try {
    assert.match(bridge.url, /^https:\/\/127\.0\.0\.1:\d+$/);
    const res = await fetch(`${bridge.url}/set/k/v`, {
      client,
      headers: { authorization: `Bearer ${token}` },
    });
    assert.deepEqual(await res.json(), { result: "OK" });
    // A client that does not trust the certificate cannot talk to it.
    await assert.rejects(fetch(`${bridge.url}/healthz`), (error: Error) => {
      assert.match(String(error.cause), /certificate|UnknownIssuer/i);
      return true;
    });
  } finally {
    client.close();
    await bridge.close();
    await server.stop();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("a bad environment gets an error naming the variable", async () => {
  const from = (env: Record<string, string>) =>
    bridgeOptionsFromEnv((name) => ({ UPSTASH_REDIS_REST_TOKEN: "t", ...env })[name]);
  await assert.rejects(
    bridgeOptionsFromEnv(() => undefined),
    /set UPSTASH_REDIS_REST_TOKEN to the token clients must present/,
  );
  await assert.rejects(
    from({ BRIDGE_PORT: "80a" }),
    /BRIDGE_PORT must be a whole number from 0 to 65535, not "80a"/,
  );
  await assert.rejects(from({ BRIDGE_POOL_SIZE: "0" }), /BRIDGE_POOL_SIZE must be .* from 1/);
  await assert.rejects(from({ BRIDGE_TLS_CERT: "/c.pem" }), /set both BRIDGE_TLS_CERT and/);
  await assert.rejects(
    from({ BRIDGE_TLS_CERT: "/nonexistent/c.pem", BRIDGE_TLS_KEY: "/nonexistent/k.pem" }),
    /BRIDGE_TLS_CERT: cannot read \/nonexistent\/c\.pem/,
  );
  await assert.rejects(from({ BRIDGE_LOG: "yes" }), /BRIDGE_LOG must be json or off/);
  await assert.rejects(
    from({ BRIDGE_KEY_LOCKING: "on" }),
    /BRIDGE_KEY_LOCKING must be accept or strict, not "on"/,
  );
  assert.equal((await from({ BRIDGE_KEY_LOCKING: "strict" })).strictKeyLocking, true);
  await assert.rejects(from({ REDIS_URL: "localhost:6379" }), /must look like redis:\/\//);
  await assert.rejects(
    startBridge({ redisUrl: "redis://127.0.0.1:1", token: "t", readonlyToken: "t" }),
    /The read-only token must differ/,
  );
  const defaults = await from({});
  assert.equal(defaults.port, 8079);
  assert.equal(defaults.hostname, "127.0.0.1");
  assert.equal(defaults.redisUrl, "redis://127.0.0.1:6379");
});

Deno.test("deno task bridge runs from its environment alone and logs JSON lines", async () => {
  const server = await startRedisServer();
  const token = crypto.randomUUID();
  const bridge = await spawnDeno(
    ["task", "--quiet", "bridge"],
    {
      UPSTASH_REDIS_REST_TOKEN: token,
      UPSTASH_REDIS_REST_READONLY_TOKEN: `${token}-ro`,
      REDIS_URL: server.url,
      BRIDGE_PORT: "0",
      BRIDGE_POOL_SIZE: "2",
    },
    /Upstash REST bridge on (http:\/\/127\.0\.0\.1:\d+) in front of .*\n/,
  );
  try {
    const url = bridge.ready[1]!;
    const redis = new Redis({ url, token: `${token}-ro`, enableTelemetry: false, retry: false });
    assert.equal(await redis.get("nothing"), null);
    await assert.rejects(redis.set("k", "v"), /NOPERM/);
    const metrics = await (await fetch(`${url}/metrics`)).text();
    assert.match(metrics, /edgelock_bridge_pool_size\{pool="shared"\} 2/);
    const lines = () => bridge.output().split("\n").filter((line) => line.startsWith("{"));
    for (let i = 0; i < 50 && lines().length < 2; i++) {
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    const entries = lines().map((line) => JSON.parse(line) as RequestLog);
    assert.deepEqual(entries.map(({ route, status, role }) => [route, status, role]), [
      ["pipeline", 200, "readonly"],
      ["pipeline", 200, "readonly"],
    ]);
  } finally {
    await bridge.stop("SIGTERM");
    await server.stop();
  }
});
