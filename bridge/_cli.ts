// Flags for the repository's tools (dev, bridge, bench, torture): --help, and an error, not a
// silent default, for an unknown flag or a bad value.

/**
 * One flag: a number within bounds, a string, or a switch. A number or string flag without a
 * default is `undefined` when not given (for a tool whose defaults live elsewhere, e.g. its env).
 */
export type Flag =
  | { type: "number"; default?: number; min: number; max: number; help: string }
  | { type: "string"; default?: string; help: string }
  | { type: "boolean"; help: string };

type Values<F extends Record<string, Flag>> = {
  [K in keyof F]: F[K] extends { type: "boolean" } ? boolean
    : F[K] extends { type: "number"; default: number } ? number
    : F[K] extends { type: "string"; default: string } ? string
    : F[K] extends { type: "number" } ? number | undefined
    : string | undefined;
};

/** A bad command line: the message says what and how to fix it. */
export class UsageError extends Error {
  override name = "UsageError";
}

/** Parses `args` against `flags`; throws a {@linkcode UsageError} naming the flag. */
export function parseFlags<F extends Record<string, Flag>>(flags: F, args: string[]): Values<F> {
  const values: Record<string, unknown> = {};
  for (const [name, flag] of Object.entries(flags)) {
    values[name] = flag.type === "boolean" ? false : flag.default;
  }
  for (let i = 0; i < args.length; i++) {
    const arg = args[i]!;
    const match = /^--([a-z][a-z-]*)(?:=(.*))?$/.exec(arg);
    const flag = match ? flags[match[1]!] : undefined;
    if (!match || !flag) throw new UsageError(`unknown argument ${arg}`);
    const name = match[1]!;
    if (flag.type === "boolean") {
      if (match[2] !== undefined) throw new UsageError(`--${name} takes no value`);
      values[name] = true;
      continue;
    }
    const text = match[2] ?? args[++i];
    if (text === undefined || (match[2] === undefined && text.startsWith("--"))) {
      throw new UsageError(`--${name} needs a value`);
    }
    if (flag.type === "string") {
      values[name] = text;
      continue;
    }
    const value = Number(text);
    if (!/^\d+(\.\d+)?$/.test(text) || value < flag.min || value > flag.max) {
      throw new UsageError(
        `--${name} must be a number from ${flag.min} to ${flag.max}, not "${text}"`,
      );
    }
    values[name] = value;
  }
  return values as Values<F>;
}

/** The help text: the usage line, then each flag with its default. */
export function helpText(usage: string, flags: Record<string, Flag>): string {
  const lines = [usage, "", "Flags:"];
  for (const [name, flag] of Object.entries(flags)) {
    const left = flag.type === "boolean" ? `--${name}` : `--${name} <${flag.type}>`;
    const fallback = flag.type === "boolean" || flag.default === undefined
      ? ""
      : ` (default ${flag.default})`;
    lines.push(`  ${left.padEnd(24)} ${flag.help}${fallback}`);
  }
  lines.push(`  ${"--help".padEnd(24)} show this help`);
  return lines.join("\n");
}

/**
 * A tool's command line: prints the help and exits 0 on `--help`; prints the problem and exits 2
 * on a bad argument.
 */
export function cli<F extends Record<string, Flag>>(
  tool: string,
  usage: string,
  flags: F,
  args: string[] = Deno.args,
): Values<F> {
  if (args.includes("--help") || args.includes("-h")) {
    console.log(helpText(usage, flags));
    Deno.exit(0);
  }
  try {
    return parseFlags(flags, args);
  } catch (error) {
    if (!(error instanceof UsageError)) throw error;
    console.error(`${tool}: ${error.message} (see --help)`);
    Deno.exit(2);
  }
}
