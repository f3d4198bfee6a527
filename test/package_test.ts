// The npm package as a user gets it: `deno task pack`, then `npm install <tarball>` into a scratch
// project outside the repository, imported by package name only, in Node and in workerd.
import assert from "node:assert/strict";
import { Miniflare } from "miniflare";
import { pack, REPOSITORY } from "../dev/pack.ts";
import { keygen, shared, startBackend } from "./_backend.ts";

const config = JSON.parse(await Deno.readTextFile(new URL("../deno.json", import.meta.url)));
const UPSTASH = config.imports["@upstash/redis"].replace("npm:", "");
const HONO = config.imports["hono"].replace("npm:", "");
const ZOD = config.imports["zod"].replace("npm:", "");

async function run(cmd: string, args: string[], cwd: string, env: Record<string, string> = {}) {
  const { code, stdout, stderr } = await new Deno.Command(cmd, {
    args,
    cwd,
    env: { NO_COLOR: "1", npm_config_update_notifier: "false", ...env },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const out = new TextDecoder().decode(stdout);
  assert.equal(code, 0, `${cmd} ${args.join(" ")}:\n${out}${new TextDecoder().decode(stderr)}`);
  return out;
}

// What each scratch program does: a full lock cycle, with the fence, by package name.
const CYCLE = `
  const name = NAME;
  const first = await locks.acquire(name, { ttlMs: 2000 });
  const busy = await locks.acquire(name);
  const renewed = await locks.renew(first.lease, { ttlMs: 4000 });
  const released = await locks.release(first.lease);
  const after = await locks.inspect(name);
  const out = {
    acquired: first.acquired,
    busy: busy.acquired === false && busy.reason,
    sameFence: renewed.renewed && renewed.lease.fence === first.lease.fence,
    released,
    heldAfter: after.held,
  };
`;
const EXPECTED = {
  acquired: true,
  busy: "busy",
  sameFence: true,
  released: true,
  heldAfter: false,
};

// The packed npm package, installed by name in a scratch project, and a backend to run it against.
const fixture = shared(async () => {
  const backend = await startBackend();
  const dir = await Deno.makeTempDir({ prefix: "edgelock-scratch-" });
  try {
    const tarball = await pack();
    await Deno.writeTextFile(
      `${dir}/package.json`,
      JSON.stringify({ name: "scratch", private: true, type: "module" }),
    );
    // The README's install for the service, with the tarball for the name.
    await run("npm", [
      "install",
      "--no-audit",
      "--no-fund",
      "--loglevel=error",
      tarball,
      UPSTASH,
      HONO,
      ZOD,
      "typescript@5.9.3",
      "esbuild@0.28.2",
    ], dir);
  } catch (error) {
    await Deno.remove(dir, { recursive: true });
    await backend.stop();
    throw error;
  }
  return { backend, dir };
}, async ({ backend, dir }) => {
  await Deno.remove(dir, { recursive: true });
  await backend.stop();
});

Deno.test("the lock core installs without hono or zod, and runs by import and by require", async () => {
  const { backend } = await fixture();
  const dir = await Deno.makeTempDir({ prefix: "edgelock-core-only-" });
  try {
    await Deno.writeTextFile(
      `${dir}/package.json`,
      JSON.stringify({ name: "core", private: true }),
    );
    // The README's `npm install @edgelock/edgelock @upstash/redis`, nothing else.
    await run("npm", [
      "install",
      "--no-audit",
      "--no-fund",
      "--loglevel=error",
      await pack(),
      UPSTASH,
    ], dir);
    const installed = [...Deno.readDirSync(`${dir}/node_modules`)].map((entry) => entry.name);
    for (const name of ["hono", "zod", "@hono"]) {
      assert.ok(!installed.includes(name), `${name} was installed: ${installed.join(", ")}`);
    }
    await Deno.writeTextFile(
      `${dir}/cycle.mjs`,
      `import { Redis } from "@upstash/redis";
import { Locks } from "@edgelock/edgelock";
const NAME = process.env.NAME;
const locks = new Locks(new Redis({ url: process.env.URL, token: process.env.TOKEN, enableTelemetry: false }));
${CYCLE}
console.log(JSON.stringify(out));
`,
    );
    await Deno.writeTextFile(
      `${dir}/require.cjs`,
      `const { Locks, withLock } = require("@edgelock/edgelock");
console.log(JSON.stringify([typeof Locks, typeof withLock]));
`,
    );
    const env = {
      URL: backend.bridge.url,
      TOKEN: backend.token,
      NAME: keygen("core"),
      PATH: Deno.env.get("PATH") ?? "",
    };
    assert.deepEqual(JSON.parse(await run("node", ["cycle.mjs"], dir, env)), EXPECTED);
    assert.deepEqual(JSON.parse(await run("node", ["require.cjs"], dir, env)), [
      "function",
      "function",
    ]);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("Node 20+: every entry imports by name; Locks runs against Redis", async () => {
  const { backend, dir } = await fixture();
  await Deno.writeTextFile(
    `${dir}/node.mjs`,
    `import { Redis } from "@upstash/redis";
import { EdgelockError, Locks, withLock } from "@edgelock/edgelock";
import { dedupe, Records } from "@edgelock/edgelock/uses";
import { idempotency } from "@edgelock/edgelock/hono";
import { createApp } from "@edgelock/edgelock/service";
import { createClient } from "@edgelock/edgelock/client";
const NAME = process.env.NAME;
const redis = new Redis({ url: process.env.URL, token: process.env.TOKEN, enableTelemetry: false });
const locks = new Locks(redis);
${CYCLE}
out.dedupe = (await dedupe(new Records(redis), { namespace: "n", id: NAME })).state;
const app = createApp({ redis, apiKeys: [{ tenant: "t", secret: "s".repeat(16) }], log: () => {} });
out.health = (await app.request("/healthz")).status;
out.exports = [typeof EdgelockError, typeof withLock, typeof idempotency, typeof createClient];
console.log(JSON.stringify(out));
`,
  );
  const out = await run("node", ["node.mjs"], dir, {
    URL: backend.bridge.url,
    TOKEN: backend.token,
    NAME: keygen("npm"),
    PATH: Deno.env.get("PATH") ?? "",
  });
  assert.deepEqual(JSON.parse(out), {
    ...EXPECTED,
    dedupe: "claimed",
    health: 200,
    exports: ["function", "function", "function", "function"],
  });
});

Deno.test("TypeScript (nodenext) resolves the declarations of every entry", async () => {
  const { dir } = await fixture();
  await Deno.writeTextFile(
    `${dir}/check.ts`,
    `import { Redis } from "@upstash/redis";
import { type AcquireResult, Locks } from "@edgelock/edgelock";
import { type ClaimResult, Records } from "@edgelock/edgelock/uses";
import type { IdempotencyOptions } from "@edgelock/edgelock/hono";
import { type AppDeps, createApp } from "@edgelock/edgelock/service";
import { createClient, type EdgelockClient } from "@edgelock/edgelock/client";
const redis = new Redis({ url: "http://127.0.0.1:1", token: "t" });
const result: Promise<AcquireResult> = new Locks(redis).acquire("x");
const claim: Promise<ClaimResult> = new Records(redis).claim("dedupe", "a/b");
const deps: AppDeps = { redis, apiKeys: [] };
const client: EdgelockClient = createClient({ baseUrl: "http://x", apiKey: "k" });
const scope: IdempotencyOptions["scope"] = () => "u";
// @ts-expect-error: a lock name is a string
new Locks(redis).acquire(42);
export { claim, client, createApp, deps, result, scope };
`,
  );
  await Deno.writeTextFile(
    `${dir}/tsconfig.json`,
    JSON.stringify({
      compilerOptions: {
        noEmit: true,
        strict: true,
        module: "nodenext",
        moduleResolution: "nodenext",
        target: "es2022",
        lib: ["es2023", "dom"],
        types: [],
      },
      files: ["check.ts"],
    }),
  );
  await run("npx", ["tsc", "-p", "tsconfig.json"], dir);
});

Deno.test(
  "workerd (Miniflare): a Worker bundled from the package runs a cycle",
  async () => {
    const { backend, dir } = await fixture();
    await Deno.writeTextFile(
      `${dir}/worker.mjs`,
      `import { Redis } from "@upstash/redis/cloudflare";
import { Locks } from "@edgelock/edgelock";
export default {
  async fetch(request, env) {
    const NAME = new URL(request.url).searchParams.get("name");
    const locks = new Locks(new Redis({ url: env.URL, token: env.TOKEN, enableTelemetry: false }));
    ${CYCLE}
    return Response.json(out);
  },
};
`,
    );
    // As wrangler bundles: esbuild with the workerd export conditions.
    await run("npx", [
      "esbuild",
      "worker.mjs",
      "--bundle",
      "--format=esm",
      "--platform=neutral",
      "--conditions=workerd,worker,browser",
      "--main-fields=module,main",
      "--outfile=dist/worker.js",
      "--log-level=warning",
    ], dir);
    const mf = new Miniflare({
      modules: true,
      script: await Deno.readTextFile(`${dir}/dist/worker.js`),
      compatibilityDate: "2026-08-01",
      bindings: { URL: backend.bridge.url, TOKEN: backend.token },
    });
    try {
      const res = await mf.dispatchFetch(`http://scratch.test/?name=${keygen("wrk")}`);
      assert.deepEqual(await res.json(), EXPECTED);
    } finally {
      await mf.dispose();
    }
  },
);

Deno.test("the package names its repository, homepage and bugs, and its README links resolve on npm", async () => {
  const { dir } = await fixture();
  const installed = `${dir}/node_modules/@edgelock/edgelock`;
  const manifest = JSON.parse(await Deno.readTextFile(`${installed}/package.json`));
  assert.equal(manifest.repository.url, `git+${REPOSITORY}.git`);
  assert.equal(manifest.homepage, `${REPOSITORY}#readme`);
  assert.equal(manifest.bugs.url, `${REPOSITORY}/issues`);
  assert.equal(manifest.engines.node, "^20.19.0 || >=22.12.0");
  const readme = await Deno.readTextFile(`${installed}/README.md`);
  const links = [...readme.matchAll(/\]\(([^)\s]+)\)/g)].map((m) => m[1]!);
  assert.ok(links.length > 10, `${links.length} links`);
  for (const link of links) assert.match(link, /^(https:\/\/|#)/, link);
  assert.ok(links.includes(`${REPOSITORY}/blob/main/docs/guarantees.md`));
});

Deno.test("examples/cron-node: three machines firing one tick run the job once", async () => {
  const { backend, dir } = await fixture();
  await Deno.copyFile(
    new URL("../examples/cron-node/cron.mjs", import.meta.url),
    `${dir}/cron.mjs`,
  );
  const env = {
    UPSTASH_REDIS_REST_URL: backend.bridge.url,
    UPSTASH_REDIS_REST_TOKEN: backend.token,
    TICK: String(Date.now() - Math.floor(Math.random() * 1e9)), // a tick of this run's own
    PATH: Deno.env.get("PATH") ?? "",
  };
  const outcomes = (await Promise.all([0, 1, 2].map(() => run("node", ["cron.mjs"], dir, env))))
    .map((out) => JSON.parse(out));
  const ran = outcomes.filter((outcome) => outcome.ran);
  assert.equal(ran.length, 1, JSON.stringify(outcomes));
  assert.match(ran[0].value, /^report written under fence \d+$/);
  for (const skipped of outcomes.filter((outcome) => !outcome.ran)) {
    assert.ok(["running", "tick_done"].includes(skipped.reason), JSON.stringify(skipped));
  }
  // The same tick later, on any machine: done already.
  assert.equal(JSON.parse(await run("node", ["cron.mjs"], dir, env)).reason, "tick_done");
});
