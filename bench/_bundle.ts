// What an entry costs an edge bundle: `deno bundle --minify` for the browser platform (workerd's
// conditions), and its gzip -9 size. Shared by `deno task size` and `deno task bench:edge`.
import { gzipSync } from "node:zlib";

const root = new URL("../", import.meta.url).pathname;

/** Bundles `entry` (a path from the repository root, or absolute) minified into `dir`. */
export async function minifiedBundle(entry: string, dir: string): Promise<Uint8Array> {
  const out = `${dir}/${crypto.randomUUID()}.js`;
  const { success, stderr } = await new Deno.Command(Deno.execPath(), {
    args: ["bundle", "--quiet", "--minify", "--platform", "browser", "-o", out, entry],
    cwd: root,
    stdout: "null",
    stderr: "piped",
  }).output();
  if (!success) throw new Error(new TextDecoder().decode(stderr));
  return await Deno.readFile(out);
}

/** Bytes after gzip at level 9. */
export function gzipSize(bytes: Uint8Array): number {
  return gzipSync(bytes, { level: 9 }).length;
}
