// Prints a script as Redis runs it, with line numbers: Redis reports a script's errors by them
// (`user_script:57: attempt to compare nil with number`). `deno task lua <name>`; no name lists
// the scripts.
import * as core from "../src/core/lua/mod.ts";
import * as uses from "../src/uses/scripts.ts";
import * as quorum from "../src/quorum/scripts.ts";
import type { Script } from "../src/core/lua/_define.ts";

const scripts = [core, uses, quorum].flatMap((module) => Object.values(module))
  .filter((value): value is Script => typeof value === "object" && "source" in value);
const [name, around] = Deno.args;
const script = scripts.find((script) => script.name === name);
if (!script) {
  const usage = `Usage: deno task lua <script> [line]; the scripts:\n` +
    scripts.map((script) => `  ${script.name}`).join("\n");
  if (name !== undefined) {
    console.error(`No script is named ${name}. ${usage}`);
    Deno.exit(1);
  }
  console.log(usage);
  Deno.exit(0);
}
const lines = script.source.split("\n");
const width = String(lines.length).length;
// With a line, only the lines around it (an error's context).
const at = around === undefined ? undefined : Number(around);
lines.forEach((line, i) => {
  if (at !== undefined && Math.abs(i + 1 - at) > 5) return;
  const mark = i + 1 === at ? ">" : " ";
  console.log(`${mark}${String(i + 1).padStart(width)}  ${line}`);
});
