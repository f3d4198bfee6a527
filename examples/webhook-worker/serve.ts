/**
 * Runs the Worker locally in workerd (through Miniflare), as `wrangler dev` would: bundled for
 * workerd with `deno bundle`, its env from yours. With `deno task dev` running, give it the Redis
 * REST URL and token that `deno task dev` printed:
 *
 *   UPSTASH_REDIS_REST_URL=… UPSTASH_REDIS_REST_TOKEN=… WEBHOOK_SECRET=whsec_… \
 *     deno run -A examples/webhook-worker/serve.ts --port 8788
 *
 * @module
 */
import { Miniflare } from "miniflare";
import { cli } from "../../bridge/_cli.ts";

const { port } = cli("serve", "deno run -A examples/webhook-worker/serve.ts [--port 8788]", {
  port: { type: "number", default: 8788, min: 0, max: 65535, help: "0 picks a free port" },
});
const names = ["UPSTASH_REDIS_REST_URL", "UPSTASH_REDIS_REST_TOKEN", "WEBHOOK_SECRET"];
const missing = names.filter((name) => !Deno.env.get(name));
if (missing.length > 0) {
  console.error(`serve: set ${missing.join(", ")} (deno task dev prints the first two)`);
  Deno.exit(2);
}
const dir = await Deno.makeTempDir({ prefix: "webhook-worker-" });
const { success, stderr } = await new Deno.Command(Deno.execPath(), {
  args: ["bundle", "--quiet", "--platform", "browser", "-o", `${dir}/worker.js`, "worker.ts"],
  cwd: new URL(".", import.meta.url).pathname,
  stderr: "piped",
}).output();
const script = success ? await Deno.readTextFile(`${dir}/worker.js`) : "";
await Deno.remove(dir, { recursive: true });
if (!success) throw new Error(new TextDecoder().decode(stderr));
const mf = new Miniflare({
  modules: true,
  script,
  compatibilityDate: "2026-08-01",
  bindings: Object.fromEntries(names.map((name) => [name, Deno.env.get(name)!])),
  host: "127.0.0.1",
  port,
});
const url = await mf.ready;
console.log(`The Worker listens on ${new URL("/webhooks", url)}`);
const stop = async () => {
  await mf.dispose();
  Deno.exit(0);
};
Deno.addSignalListener("SIGINT", stop);
Deno.addSignalListener("SIGTERM", stop);
