// Each example in examples/ run as its README says, against a private redis-server behind the
// bridge: the Worker in workerd, the form in Chromium, the fenced write against Postgres (PGlite).
// The Node cron example runs from the packed tarball in test/package_test.ts.
import assert from "node:assert/strict";
import { chromium, type Page } from "playwright-core";
import { shared, startBackend } from "./_backend.ts";
import { LISTENING, spawnDeno } from "./_process.ts";

const fixture = shared(startBackend, (backend) => backend.stop());
const CHROMIUM = Deno.env.get("CHROMIUM_PATH") ?? "/usr/bin/chromium";
const SECRET = "whsec_" + btoa("example-webhook-secret-32-bytes!");

async function redisEnv() {
  const backend = await fixture();
  return {
    UPSTASH_REDIS_REST_URL: backend.bridge.url,
    UPSTASH_REDIS_REST_TOKEN: backend.token,
  };
}

// Runs a Deno script to its end: its exit code and everything it printed.
async function runDeno(args: string[], env: Record<string, string>) {
  const { code, stdout, stderr } = await new Deno.Command(Deno.execPath(), {
    args,
    env: { ...env, NO_COLOR: "1" },
    stdout: "piped",
    stderr: "piped",
  }).output();
  return { code, text: new TextDecoder().decode(stdout) + new TextDecoder().decode(stderr) };
}

Deno.test("webhook-worker: in workerd, 30 shuffled deliveries of 10 events process each once", async () => {
  const env = { ...await redisEnv(), WEBHOOK_SECRET: SECRET };
  const worker = await spawnDeno(
    ["run", "-A", "examples/webhook-worker/serve.ts", "--port", "0"],
    env,
    /The Worker listens on (http:\/\/127\.0\.0\.1:\d+\/webhooks)\n/,
    120_000,
  );
  try {
    const url = worker.ready[1]!;
    const sent = await runDeno(
      [
        "run",
        "-A",
        "examples/webhook-worker/send.ts",
        "--url",
        url,
        "--ids",
        "10",
        "--copies",
        "3",
      ],
      { WEBHOOK_SECRET: SECRET },
    );
    assert.equal(sent.code, 0, sent.text);
    assert.match(
      sent.text,
      /^sent 30 deliveries of 10 events: 10 processed, 20 duplicates, 0 failed$/m,
    );
    // Signed with another secret: every delivery is refused, none processed.
    const forged = await runDeno(
      ["run", "-A", "examples/webhook-worker/send.ts", "--url", url, "--ids", "2", "--copies", "1"],
      { WEBHOOK_SECRET: "whsec_" + btoa("not-the-endpoint-secret-32bytes!") },
    );
    assert.equal(forged.code, 1);
    assert.match(forged.text, /0 processed, 0 duplicates, 2 failed/);
  } finally {
    await worker.stop();
  }
});

Deno.test("idempotent-form: a double click in Chromium places one order, and both see it", async () => {
  const env = await redisEnv();
  const server = await spawnDeno(
    ["run", "-A", "examples/idempotent-form/main.ts"],
    { ...env, PORT: "0" },
    LISTENING,
  );
  const browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ["--no-sandbox", "--disable-dev-shm-usage"],
  });
  try {
    const base = `http://127.0.0.1:${server.ready[1]}`;
    const page = await browser.newPage();
    const replies: { status: number; replayed: string | null }[] = [];
    page.on("response", (res) => {
      if (res.url().endsWith("/orders")) {
        replies.push({
          status: res.status(),
          replayed: res.headers()["idempotent-replayed"] ?? null,
        });
      }
    });
    await page.goto(base);
    await page.dblclick("button");
    await ordered(page);
    const count = await (await fetch(`${base}/orders/count`)).json();
    assert.deepEqual(count, { created: 1 }, "one order for two clicks");
    await until(() => replies.length === 2);
    assert.deepEqual(
      replies.map((r) => r.status),
      [201, 201],
      "both submissions got the order",
    );
    assert.equal(replies.filter((r) => r.replayed === "true").length, 1, "one was a replay");
    // A new form (a reload) is a new order.
    await page.reload();
    await page.click("button");
    await ordered(page);
    assert.deepEqual(await (await fetch(`${base}/orders/count`)).json(), { created: 2 });
  } finally {
    await browser.close();
    await server.stop();
  }
});

Deno.test("fenced-sql: Postgres refuses the write of a holder that stalled past its lease", async () => {
  const run = await runDeno(["run", "-A", "examples/fenced-sql/main.ts"], await redisEnv());
  assert.equal(run.code, 0, run.text);
  assert.match(run.text, /^B holds it with fence \d+ and writes balance 150: written$/m);
  assert.match(run.text, /^A wakes and writes balance 50 with fence \d+: refused$/m);
  assert.match(run.text, /^The account holds 150$/m);
});

// Waits until the page shows the order it was told of.
function ordered(page: Page) {
  return page.waitForFunction(() => {
    const doc = (globalThis as unknown as {
      document: { querySelector(s: string): { textContent: string | null } | null };
    }).document;
    return (doc.querySelector("#result")?.textContent ?? "").startsWith("Order");
  });
}

async function until(check: () => boolean, timeoutMs = 10_000) {
  const deadline = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > deadline) throw new Error("timed out");
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}
