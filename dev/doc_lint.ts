/**
 * `deno doc --lint` over every entry of the package, as JSR documents it. One kind of error is
 * let through: a public signature that names Hono's own `Context`, `MiddlewareHandler` or
 * `Hono`, or OpenTelemetry's `Tracer` or `Meter`. deno doc counts types of another package
 * as private when they resolve to files
 * (denoland/deno#27364); re-exporting them would publish Hono's docs as ours. Anything else
 * fails.
 *
 * @module
 */
import { cli } from "../bridge/_cli.ts";

cli("edgelock doc-lint", "deno run -A dev/doc_lint.ts   (part of deno task check)", {});
const config = JSON.parse(await Deno.readTextFile(new URL("../deno.json", import.meta.url)));
const entries = Object.values(config.exports as Record<string, string>);
const EXTERNAL = new Set(["Context", "MiddlewareHandler", "Hono", "Tracer", "Meter"]);

const { stdout, stderr } = await new Deno.Command(Deno.execPath(), {
  args: ["doc", "--lint", ...entries],
  env: { NO_COLOR: "1" },
  stdout: "piped",
  stderr: "piped",
}).output();
const text = new TextDecoder().decode(stderr) + new TextDecoder().decode(stdout);
const errors = [...text.matchAll(/^error\[([a-z-]+)\]: (.*)$/gm)];
const letThrough = errors.filter(([, kind, message]) =>
  kind === "private-type-ref" &&
  EXTERNAL.has(/references private type '([^']+)'/.exec(message!)?.[1] ?? "")
);
const rest = errors.filter((error) => !letThrough.includes(error));
if (rest.length > 0) {
  console.error(text);
  console.error(`deno doc --lint: ${rest.length} errors in ${entries.join(", ")}`);
  Deno.exit(1);
}
console.log(
  `deno doc --lint: ${entries.length} entries clean (${letThrough.length} references to Hono's ` +
    "own types let through, see dev/doc_lint.ts)",
);
