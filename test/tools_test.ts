import assert from "node:assert/strict";
import { releaseProblems } from "../dev/release_check.ts";

async function run(script: string, args: string[]) {
  const { code, stdout, stderr } = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", script, ...args],
    env: { NO_COLOR: "1" },
    stdout: "piped",
    stderr: "piped",
  }).output();
  return { code, text: new TextDecoder().decode(stdout) + new TextDecoder().decode(stderr) };
}

const TOOLS = [
  "dev/server.ts",
  "bridge/main.ts",
  "dev/torture.ts",
  "dev/pack.ts",
  "dev/doc_lint.ts",
  "bench/bench.ts",
  "bench/size.ts",
  "bench/waits.ts",
  "bench/anatomy.ts",
  "dev/release_check.ts",
];

for (const tool of TOOLS) {
  Deno.test(
    `every tool answers --help and refuses unknown flags without doing any work: ${tool}`,
    async () => {
      const help = await run(tool, ["--help"]);
      assert.equal(help.code, 0, help.text);
      assert.match(help.text, /^deno (task|run)/m);
      assert.match(help.text, /--help +show this help/);
      const unknown = await run(tool, ["--frobnicate"]);
      assert.equal(unknown.code, 2, unknown.text);
      assert.match(unknown.text, /unknown argument --frobnicate \(see --help\)/);
    },
  );
}

Deno.test("a bad flag value is an error, not a silent default or a zero-work pass", async () => {
  const cases: [string, string[], RegExp][] = [
    [
      "dev/torture.ts",
      ["--seconds", "abc"],
      /--seconds must be a number from 1 to 3600, not "abc"/,
    ],
    ["dev/torture.ts", ["--clients", "0"], /--clients must be a number from 1 to 1024/],
    ["dev/torture.ts", ["--seconds"], /--seconds needs a value/],
    ["bench/bench.ts", ["--cycles", "-5"], /--cycles must be a number/],
    ["bridge/main.ts", ["--port", "70000"], /--port must be a number from 0 to 65535/],
    ["bench/size.ts", ["--update=yes"], /--update takes no value/],
  ];
  for (const [tool, args, message] of cases) {
    const { code, text } = await run(tool, args);
    assert.equal(code, 2, `${tool} ${args.join(" ")}: ${text}`);
    assert.match(text, message);
  }
});

Deno.test("a release is refused unless its tag is deno.json's version and the changelog dates it", async () => {
  const dated = "# Changelog\n\n## 0.2.0 (2027-01-15)\n\n- things\n";
  assert.deepEqual(releaseProblems("v0.2.0", "0.2.0", dated), []);
  assert.deepEqual(releaseProblems("v0.2.1", "0.2.0", dated), [
    "the tag v0.2.1 is not v0.2.0, deno.json's version",
  ]);
  assert.deepEqual(releaseProblems("v0.3.0", "0.3.0", dated), [
    'CHANGELOG.md has no "## 0.3.0" section',
  ]);
  assert.deepEqual(releaseProblems("v0.2.0", "0.2.0", "## 0.2.0 (unreleased)\n"), [
    "CHANGELOG.md still marks 0.2.0 unreleased: give it the release date",
  ]);
  // This repository today: 0.1.0 is not released yet, so the workflow would stop here.
  const today = await run("dev/release_check.ts", ["--tag", "v0.1.0"]);
  assert.equal(today.code, 1);
  assert.match(today.text, /still marks 0\.1\.0 unreleased/);
});
