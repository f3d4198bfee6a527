// The dashboard in a real browser: Debian's chromium driven by playwright-core. What the page
// shows is checked against the API, an operator breaks a lock from it, and the key never leaves
// sessionStorage. Set SCREENSHOT=1 to refresh bench/dashboard.png for the README.
import assert from "node:assert/strict";
import { chromium, type Page } from "playwright-core";
import { createApp } from "../src/service/mod.ts";
import { parseApiKeys, parseOperatorKeys } from "../src/service/auth.ts";
import { createClient } from "../src/client/client.ts";
import { keygen, shared, startBackend } from "./_backend.ts";
import type { Lease } from "../src/core/types.ts";
import { JS } from "../src/service/dashboard.ts";
import { minifyDashboard } from "../dev/build_worker.ts";

const A = "tenant-a-secret-0123456789";
const OPS = "operator-secret-0123456789";
const apiKeys = parseApiKeys(`a:${A}`);
const operatorKeys = parseOperatorKeys(`ops:${OPS}`, apiKeys);
// The page's globals, typed here without the DOM library (it clashes with Deno's types). Functions,
// not strings: the page's CSP refuses eval, which string expressions need.
type Win = {
  document: {
    querySelectorAll(selector: string): { length: number };
    querySelector(selector: string): { textContent: string | null } | null;
  };
  localStorage: { length: number };
  sessionStorage: { getItem(key: string): string | null };
};
const rowsAre = (page: Page, selector: string, count: number) =>
  page.waitForFunction(
    ([s, n]) => (globalThis as unknown as Win).document.querySelectorAll(s).length === n,
    [selector, count] as const,
  );
const CHROMIUM = Deno.env.get("CHROMIUM_PATH") ?? "/usr/bin/chromium";

const backend = shared(() => startBackend(), (backend) => backend.stop());

// A service of its own (its own key prefix) on the shared Redis, and a client of it.
async function serve() {
  const app = createApp({
    redis: (await backend()).redis,
    apiKeys,
    operatorKeys,
    keyPrefix: keygen("dash"),
    log: () => {},
  });
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, app.fetch);
  const base = `http://127.0.0.1:${server.addr.port}`;
  const client = createClient({ baseUrl: base, apiKey: A });
  return { server, base, client };
}

// The dashboard's script as the Worker build serves it: minified, from a bundle that holds it.
async function workerScript(): Promise<string> {
  const dir = await Deno.makeTempDir({ prefix: "edgelock-dash-" });
  try {
    const escaped = JS.replace(/[\\`]|\$\{/g, (c) => "\\" + c);
    const bundle = await minifyDashboard(`const js = \`${escaped}\`;`, dir);
    const script = new Function(`${bundle} return js;`)() as string;
    assert.ok(script.length < JS.length * 0.7, `minified: ${script.length} of ${JS.length}`);
    return script;
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test("the dashboard in headless Chromium", (t) => dashboard(t));

Deno.test("the Worker's minified dashboard script does the same in headless Chromium", async (t) => {
  await dashboard(t, await workerScript());
});

// One scenario in one page, each step going on from the page the step before left; with the
// service's script, or `script` in its place.
async function dashboard(t: Deno.TestContext, script?: string) {
  const { server, base, client } = await serve();
  const browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ["--no-sandbox", "--disable-dev-shm-usage"],
  });

  try {
    const page = await browser.newPage();
    if (script !== undefined) {
      await page.route(
        "**/dashboard/app.js",
        (route) => route.fulfill({ body: script, contentType: "text/javascript; charset=utf-8" }),
      );
    }
    const requests: string[] = [];
    page.on("request", (request) => requests.push(request.url()));
    const missing: string[] = [];
    page.on("response", (response) => {
      if (response.status() === 404) missing.push(response.url());
    });
    const errors: string[] = [];
    page.on("pageerror", (error) => errors.push(error.message));
    const text = (selector: string) => page.$eval(selector, (e) => e.textContent ?? "");

    await t.step("a wrong key is told as refused, and the form stays for another", async () => {
      await page.goto(`${base}/dashboard`);
      await page.fill("#key", "not-a-key-of-this-service");
      await page.click("#login button");
      await page.waitForFunction(() =>
        (globalThis as unknown as Win).document.querySelector("#status")?.textContent !== ""
      );
      assert.equal(await text("#status"), "This key was refused: check it and try again.");
      assert.equal(await page.isVisible("#key"), true);
      assert.equal(await page.isVisible("#main"), false);
    });

    await t.step("with nothing held or broken yet, the tables and charts say so", async () => {
      await page.fill("#key", A);
      await page.click("#login button");
      await page.waitForSelector("#locks tbody tr.empty");
      assert.equal(await text("#locks tbody tr.empty"), "No locks held now.");
      assert.equal(await text("#audit tbody tr.empty"), "No lock was broken.");
      assert.equal(await text("#rate .none"), "No acquisitions in the last hour");
      assert.equal(await text("#wait .none"), "No waits in the last hour");
      // Each chart has its axes: the top value and zero, and times along the bottom.
      const labels = await page.$$eval("#rate .label", (ts) => ts.map((t) => t.textContent ?? ""));
      assert.equal(labels.slice(0, 2).join(" "), "1 0");
      assert.ok(labels.slice(2).every((l) => /^\d{1,2}:\d{2}/.test(l)), labels.join(", "));
      assert.equal(labels.length, 5, "two values and three times");
    });

    const leases: Lease[] = [];
    for (const name of ["invoice:1", "invoice:2", "report:daily"]) {
      // report:daily is held by a reader.
      const mode = name === "report:daily" ? "shared" : "exclusive";
      const r = await client.acquire(name, { ttlMs: 60_000, mode });
      assert.ok(r.acquired);
      leases.push(r.lease);
    }
    assert.equal((await client.acquire("invoice:1")).acquired, false);
    await client.release(
      await (async () => {
        const r = await client.acquire("short", { ttlMs: 5000 });
        assert.ok(r.acquired);
        return r.lease;
      })(),
    );

    await t.step(
      "a tenant's key shows its held locks, fences and counts as the API has them",
      async () => {
        await page.reload(); // the key is kept for the session: the page shows the locks at once
        await rowsAre(page, "#locks tbody tr:not(.empty)", 3);
        const rows = await page.$$eval(
          "#locks tbody tr",
          (trs) =>
            trs.map((tr) => [...tr.querySelectorAll("td")].map((td) => td.textContent ?? "")),
        );
        const api = await (await fetch(`${base}/v1/locks`, {
          headers: { authorization: `Bearer ${A}` },
        })).json();
        assert.deepEqual(
          rows.map((r) => [r[0], r[1], r[2]]),
          api.locks.map((l: { name: string; fence: number; waiters: number }) => [
            l.name,
            String(l.fence),
            String(l.waiters),
          ]),
        );
        assert.deepEqual(rows.map((r) => r[4]), ["exclusive", "exclusive", "shared ×1"]);
        const seconds = Number(rows[0]![3]!.replace(" s", ""));
        assert.ok(seconds > 50 && seconds <= 60, `countdown ${rows[0]![3]}`);
        const card = (label: string) =>
          page.$eval(`[data-stat="${label}"] b`, (b) => b.textContent ?? "");
        assert.equal(await card("held now"), "3");
        assert.equal(await card("granted"), "4");
        assert.equal(await card("busy"), "1");
        assert.ok((await page.$$("#rate rect")).length >= 1, "the rate chart has bars");
        assert.equal(await page.$("#rate .none"), null);
        assert.equal(await page.$("#locks button"), null, "a tenant's key gets no break button");
        const later = Number(
          (await page.$eval("#locks tbody tr .countdown", (td) => td.textContent ?? "")).replace(
            " s",
            "",
          ),
        );
        await page.waitForTimeout(600);
        const after = Number(
          (await page.$eval("#locks tbody tr .countdown", (td) => td.textContent ?? "")).replace(
            " s",
            "",
          ),
        );
        assert.ok(after < later, `the countdown runs: ${later} → ${after}`);
      },
    );

    await t.step(
      "the key stays in sessionStorage: never in a URL, a cookie or localStorage",
      async () => {
        assert.ok(requests.every((url) => !url.includes(A)), "not in any URL");
        assert.deepEqual(await page.context().cookies(), []);
        assert.equal(
          await page.evaluate(() => (globalThis as unknown as Win).localStorage.length),
          0,
        );
        assert.equal(
          await page.evaluate(() =>
            (globalThis as unknown as Win).sessionStorage.getItem("edgelock.apiKey")
          ),
          A,
        );
      },
    );

    await t.step(
      "an operator breaks a stuck lock from the page, and the audit shows it",
      async () => {
        await page.click("#logout");
        await page.waitForSelector("#key:not([hidden])");
        await page.fill("#key", OPS);
        await page.click("#login button");
        await page.waitForSelector("#locks tbody tr button");
        page.once("dialog", (dialog) => dialog.accept("stuck since the 14:00 deploy"));
        await page.click('#locks tbody tr[data-name="report:daily"] button');
        await rowsAre(page, "#audit tbody tr:not(.empty)", 1);
        const audit = await page.$$eval(
          "#audit tbody td",
          (tds) => tds.map((td) => td.textContent),
        );
        assert.equal(audit[1], "ops");
        assert.equal(audit[2], "report:daily");
        assert.equal(audit[3], String(leases[2]!.fence));
        assert.equal(audit[4], "stuck since the 14:00 deploy", "the reason typed in");
        assert.equal((await client.renew(leases[2]!)).renewed, false, "its holder lost it");
        await rowsAre(page, "#locks tbody tr", 2);
        const keep = Deno.env.get("SCREENSHOT") === "1";
        const dir = keep ? undefined : await Deno.makeTempDir();
        const shot = dir
          ? `${dir}/dashboard.png`
          : new URL("../bench/dashboard.png", import.meta.url).pathname;
        await page.setViewportSize({ width: 1200, height: 900 });
        await page.screenshot({ path: shot, fullPage: true });
        assert.ok((await Deno.stat(shot)).size > 10_000);
        if (dir) await Deno.remove(dir, { recursive: true });
        assert.deepEqual(errors, [], "no script errors on the page");
        assert.deepEqual(missing, [], "nothing the page asked for is missing (the favicon)");
      },
    );

    for (const lease of leases) await client.release(lease);
  } finally {
    await browser.close();
    await server.shutdown();
  }
}

Deno.test("the page allows only its own script, style and API", async () => {
  const { server, base } = await serve();
  const res = await fetch(`${base}/dashboard`);
  const csp = res.headers.get("content-security-policy") ?? "";
  await res.body?.cancel();
  await server.shutdown();
  assert.match(csp, /default-src 'none'/);
  assert.match(csp, /script-src 'self'/);
  assert.match(csp, /frame-ancestors 'none'/);
});
