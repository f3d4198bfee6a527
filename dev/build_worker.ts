/**
 * `deno task build:worker`: the Worker as wrangler deploys it (`main = dist/worker.js`), bundled
 * for workerd's conditions and minified, with the full-line comments and indentation of the code
 * it carries as text dropped: the Lua scripts' and the dashboard's script's explain them in the
 * source and cost a Worker ~3.4 KB gzip. Only whole lines that start with `-- ` or `// ` go,
 * which in minified output occur only inside those template literals (the minifier keeps
 * JavaScript on long lines and drops its comments, and no other multi-line text here starts a
 * line so); a line that also holds an unescaped backtick or `${` would touch the literal itself
 * and fails the build. The route table's `summary` and `description` texts go too: they are
 * read only to write the OpenAPI document, which the Worker serves prebuilt from its assets
 * (~0.7 KB gzip).
 *
 * @module
 */
import { minifiedBundle } from "../bench/_bundle.ts";
import { JS } from "../src/service/dashboard.ts";

const COMMENT_LINE = /^[ \t]*(?:--|\/\/) .*$\n/gm;
const INDENT = /^[ \t]+/gm;

/**
 * Drops the full-line comments of the Lua scripts and the dashboard's script from minified
 * JavaScript (refusing a line that is not plain text), then every line's indentation: in minified
 * output only those texts' lines are indented, and Lua and the browser read them the same without
 * it (neither has multi-line strings there).
 */
export function stripComments(js: string): string {
  return js.replace(COMMENT_LINE, (line) => {
    const plain = line.replace(/\\./g, "");
    if (plain.includes("`") || plain.includes("${")) {
      throw new Error(`build:worker: a comment line touches its template literal: ${line}`);
    }
    return "";
  }).replace(INDENT, "");
}

// A property `description` or `summary` set to a string literal, in minified output.
const DOC_TEXT = /\b(description|summary):("(?:[^"\\]|\\.)*"|`(?:[^`\\]|\\.)*`)/g;

/**
 * Empties the route table's `description` and `summary` texts in minified JavaScript. Only texts
 * the service's sources (`sources`) hold are emptied: its first 12 characters or more, up to a
 * backslash or a `$`, must occur there (a dependency's own `description` is left alone).
 */
export function stripDocs(js: string, sources: string): string {
  return js.replace(DOC_TEXT, (whole, property: string, literal: string) => {
    const opening = /^[^\\$]*/.exec(literal.slice(1, -1))![0];
    return opening.length >= 12 && sources.includes(opening) ? `${property}:""` : whole;
  });
}

/** The text of the service's sources (`src/service/`), which `stripDocs` reads. */
export async function serviceSources(): Promise<string> {
  const texts: string[] = [];
  const walk = async (dir: URL) => {
    for await (const entry of Deno.readDir(dir)) {
      if (entry.isDirectory) await walk(new URL(`${entry.name}/`, dir));
      else if (entry.name.endsWith(".ts")) {
        texts.push(await Deno.readTextFile(new URL(entry.name, dir)));
      }
    }
  };
  await walk(new URL("../src/service/", import.meta.url));
  return texts.join("\n");
}

/**
 * Puts the dashboard's script (`/dashboard/app.js`, text in the bundle) in the bundle minified:
 * it is written to be read, and minified it costs a Worker ~700 B gzip less. The script's text is
 * found by its opening, `"use strict";` and its first line, and ends at the first unescaped
 * backtick; a bundle without exactly one such text fails the build.
 */
export async function minifyDashboard(js: string, dir: string): Promise<string> {
  const opening = JS.slice(0, JS.indexOf("\n", JS.indexOf("\n") + 1));
  const starts = js.split("`" + opening).length - 1;
  if (starts !== 1) {
    throw new Error(`build:worker: the dashboard script is in the bundle ${starts} times`);
  }
  const start = js.indexOf("`" + opening) + 1;
  let end = start;
  while (js[end] !== "`") end += js[end] === "\\" ? 2 : 1;
  const source = `${dir}/dashboard.js`;
  await Deno.writeTextFile(source, JS);
  const minified = new TextDecoder().decode(await minifiedBundle(source, dir)).trim();
  // A module is strict without saying so; the page loads the script as a classic one.
  const literal = `"use strict";${minified}`.replace(/[\\`]|\$\{/g, (c) => "\\" + c);
  return js.slice(0, start) + literal + js.slice(end);
}

/**
 * Builds the Worker into `out` and returns its bytes; with `assets`, writes its static assets
 * there (the prebuilt OpenAPI document, which the Worker serves from them).
 */
export async function buildWorker(out: string, assets?: string): Promise<Uint8Array> {
  if (assets !== undefined) {
    await Deno.mkdir(assets, { recursive: true });
    await Deno.copyFile(
      new URL("../src/service/openapi.json", import.meta.url),
      `${assets}/openapi.json`,
    );
  }
  const dir = await Deno.makeTempDir({ prefix: "edgelock-build-" });
  try {
    const bundled = new TextDecoder().decode(await minifiedBundle("worker/cloudflare.ts", dir));
    // Minified last: its text is left as the minifier wrote it (a string's line stays as it is).
    const js = await minifyDashboard(
      stripDocs(stripComments(bundled), await serviceSources()),
      dir,
    );
    const bytes = new TextEncoder().encode(js);
    await Deno.writeFile(out, bytes);
    return bytes;
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

if (import.meta.main) {
  await Deno.mkdir(new URL("../dist", import.meta.url), { recursive: true });
  const dist = new URL("../dist", import.meta.url).pathname;
  await buildWorker(`${dist}/worker.js`, `${dist}/assets`);
}
