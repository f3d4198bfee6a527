/**
 * `deno task pack`: builds the npm package from `src/` and writes its tarball under `dist/`.
 * JavaScript: `deno bundle` per entry, ESM, code-split so entries share chunks, dependencies left
 * as imports: @upstash/redis a peer the user brings; hono and zod optional peers, which only the
 * service and the Hono middleware import, so a user of the lock core installs neither.
 * Types: tsc's declarations, with the `.ts` specifiers made `.js`. Targets Node 20+ and workerd.
 * Prints the tarball's path.
 *
 * @module
 */
import { cli } from "../bridge/_cli.ts";

const ENTRIES = ["core", "uses", "hono", "service", "client", "otel", "tcp", "quorum"] as const;
const EXTERNAL = [
  "hono",
  "hono/*",
  "zod",
  "zod/*",
  "@upstash/redis",
  "@opentelemetry/api",
];
const TYPESCRIPT = "npm:typescript@5.9.3/tsc";
/** Where the project lives: the npm package's repository, homepage and bugs, and the README's links. */
export const REPOSITORY = "https://github.com/edgelock/edgelock";

const root = new URL("../", import.meta.url).pathname;
const config = JSON.parse(await Deno.readTextFile(`${root}deno.json`));
const imports = config.imports as Record<string, string>;
const range = (name: string) => imports[name]!.replace(`npm:${name}@`, "");

async function run(command: string, args: string[], cwd = root): Promise<string> {
  const { success, stdout, stderr } = await new Deno.Command(command, {
    args,
    cwd,
    stdout: "piped",
    stderr: "piped",
    env: { NO_COLOR: "1" },
  }).output();
  const out = new TextDecoder().decode(stdout);
  if (!success) {
    throw new Error(
      `${command} ${args.join(" ")} failed:\n${out}${new TextDecoder().decode(stderr)}`,
    );
  }
  return out;
}

/** Builds `dist/npm/` and packs it; returns the tarball's path. */
export async function pack(): Promise<string> {
  const out = `${root}dist/npm`;
  await Deno.remove(out, { recursive: true }).catch(() => {});
  await Deno.mkdir(out, { recursive: true });

  await run(Deno.execPath(), [
    "bundle",
    "--quiet",
    ...EXTERNAL.flatMap((name) => ["--external", name]),
    "--code-splitting",
    "--format",
    "esm",
    "--platform",
    "browser",
    "--outdir",
    `${out}/esm`,
    ...ENTRIES.map((entry) => `src/${entry}/mod.ts`),
  ]);

  const tsconfig = `${out}/tsconfig.json`;
  await Deno.writeTextFile(
    tsconfig,
    JSON.stringify({
      compilerOptions: {
        declaration: true,
        emitDeclarationOnly: true,
        allowImportingTsExtensions: true,
        module: "esnext",
        moduleResolution: "bundler",
        target: "es2023",
        lib: ["es2023", "dom", "dom.iterable"],
        types: [],
        strict: true,
        skipLibCheck: true,
        rootDir: `${root}src`,
        outDir: `${out}/types`,
      },
      files: ENTRIES.map((entry) => `${root}src/${entry}/mod.ts`),
    }),
  );
  await run(Deno.execPath(), ["run", "-A", TYPESCRIPT, "-p", tsconfig]);
  await Deno.remove(tsconfig);
  for await (const path of walk(`${out}/types`)) {
    const text = await Deno.readTextFile(path);
    await Deno.writeTextFile(
      path,
      text.replace(/((?:from |import\()\s*["'])(\.\.?\/[^"']+)\.ts(["'])/g, "$1$2.js$3"),
    );
  }

  // ESM only, under "default": Node's require() of it works where Node loads ES modules so
  // (20.19+, 22.12+), and elsewhere fails with ERR_REQUIRE_ESM, which says to use import().
  const exports: Record<string, { types: string; default: string }> = {};
  for (const entry of ENTRIES) {
    const key = entry === "core" ? "." : `./${entry}`;
    exports[key] = { types: `./types/${entry}/mod.d.ts`, default: `./esm/${entry}/mod.js` };
  }
  await Deno.writeTextFile(
    `${out}/package.json`,
    JSON.stringify(
      {
        name: config.name,
        version: config.version,
        description: "Distributed locks with fencing tokens for edge runtimes, on Redis over HTTP",
        license: config.license,
        type: "module",
        sideEffects: false,
        engines: { node: "^20.19.0 || >=22.12.0" },
        repository: { type: "git", url: `git+${REPOSITORY}.git` },
        homepage: `${REPOSITORY}#readme`,
        bugs: { url: `${REPOSITORY}/issues` },
        exports,
        files: ["esm/", "types/", "README.md", "LICENSE"],
        keywords: ["lock", "mutex", "redis", "upstash", "fencing", "idempotency", "edge"],
        peerDependencies: {
          "@upstash/redis": range("@upstash/redis"),
          hono: range("hono"),
          zod: range("zod"),
          "@opentelemetry/api": range("@opentelemetry/api"),
        },
        // The service and the Hono middleware import hono (and the service zod); only
        // `@edgelock/edgelock/otel` imports the OpenTelemetry API.
        peerDependenciesMeta: {
          hono: { optional: true },
          zod: { optional: true },
          "@opentelemetry/api": { optional: true },
        },
      },
      null,
      2,
    ) + "\n",
  );
  // The README's links to the repository's files, made absolute: on npm they would lead nowhere.
  const readme = (await Deno.readTextFile(`${root}README.md`)).replace(
    /\]\((?!https?:|#)([^)\s]+)\)/g,
    (_, path: string) => `](${REPOSITORY}/blob/main/${path})`,
  );
  await Deno.writeTextFile(`${out}/README.md`, readme);
  await Deno.copyFile(`${root}LICENSE`, `${out}/LICENSE`);

  const tarball = (await run("npm", ["pack", "--silent", "--pack-destination", `${root}dist`], out))
    .trim().split("\n").at(-1)!;
  return `${root}dist/${tarball}`;
}

async function* walk(dir: string): AsyncGenerator<string> {
  for await (const entry of Deno.readDir(dir)) {
    const path = `${dir}/${entry.name}`;
    if (entry.isDirectory) yield* walk(path);
    else if (entry.name.endsWith(".d.ts")) yield path;
  }
}

if (import.meta.main) {
  cli("edgelock pack", "deno task pack   builds dist/npm and writes its tarball under dist/", {});
  console.log(await pack());
}
