/**
 * `deno run -A dev/release_check.ts --tag <tag>`: what the release workflow checks before it publishes
 * anything: the tag is `v` and deno.json's version, and CHANGELOG.md has a section for that
 * version that is no longer marked unreleased. Exits non-zero naming what is wrong.
 *
 * @module
 */
import { cli } from "../bridge/_cli.ts";

/** The problems with releasing `tag` from this deno.json version and changelog; none: ready. */
export function releaseProblems(tag: string, version: string, changelog: string): string[] {
  const problems: string[] = [];
  if (tag !== `v${version}`) {
    problems.push(`the tag ${tag} is not v${version}, deno.json's version`);
  }
  const heading = changelog.split("\n").find((line) =>
    line.startsWith(`## ${version} `) ||
    line === `## ${version}`
  );
  if (!heading) problems.push(`CHANGELOG.md has no "## ${version}" section`);
  else if (/unreleased/i.test(heading)) {
    problems.push(`CHANGELOG.md still marks ${version} unreleased: give it the release date`);
  }
  return problems;
}

if (import.meta.main) {
  const { tag } = cli("edgelock release-check", "deno run -A dev/release_check.ts --tag v0.1.0", {
    tag: { type: "string", help: "the tag being released, e.g. v0.1.0" },
  });
  if (tag === undefined) {
    console.error("edgelock release-check: give the tag being released: --tag v0.1.0");
    Deno.exit(2);
  }
  const root = new URL("../", import.meta.url);
  const { version } = JSON.parse(await Deno.readTextFile(new URL("deno.json", root)));
  const changelog = await Deno.readTextFile(new URL("CHANGELOG.md", root));
  const problems = releaseProblems(tag, version, changelog);
  for (const problem of problems) console.error(problem);
  if (problems.length > 0) Deno.exit(1);
  console.log(`${tag}: ready to publish`);
}
