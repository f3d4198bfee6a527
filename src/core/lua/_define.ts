// How a script is defined: its contract (KEYS and ARGV by name, declared once), from which both
// the Lua header that reads them and the TypeScript builder of a call are derived, so a script's
// body and its callers agree on every position by construction.

/** The kind of one ARGV entry: text, a number (`tonumber`), or a flag (`'1'` read as true). */
export type ArgKind = "string" | "number" | "flag";

/**
 * A script's KEYS and ARGV by name, in order. A key name ending in `?` is optional: the optional
 * keys come last and are passed all or none (the stats keys, off with `stats: false`). `each`
 * declares a group of keys repeated once per item, before `keys`; the item count is the
 * `n` argument, which such a contract must declare. `rest` names the ARGV after `args`.
 */
export interface Contract {
  readonly keys: readonly string[];
  readonly each?: readonly string[];
  readonly args: Readonly<Record<string, ArgKind>>;
  readonly rest?: string;
}

type Required<K extends string> = K extends `${string}?` ? never : K;
type Optional<K extends string> = K extends `${infer N}?` ? N : never;
type ArgValue<A extends ArgKind> = A extends "number" ? number : A extends "flag" ? boolean
: string;

/** The named keys and arguments of one call, as a script's contract declares them. */
export type CallOf<C extends Contract> =
  & { keys: KeysOf<C["keys"]> }
  & { args: { [P in keyof C["args"]]: ArgValue<C["args"][P]> } }
  & (C["each"] extends readonly string[] ? { each: KeysOf<C["each"]>[] } : unknown)
  & (C["rest"] extends string ? { rest: readonly string[] } : unknown);

type KeysOf<K extends readonly string[]> =
  & { [P in Required<K[number]>]: string }
  & { [P in Optional<K[number]>]?: string };

/** A call as Redis takes it: KEYS and ARGV by position. */
export interface ScriptCall {
  keys: string[];
  args: (string | number)[];
}

/** A Lua script with its SHA-1, computed once with Web Crypto. */
export interface Script {
  readonly name: string;
  readonly source: string;
  sha1(): Promise<string>;
  /**
   * The same script opted into Upstash's per-key locking: a shebang with `allow-key-locking`
   * (and `no-writes` for a read-only one), so Upstash locks only its `KEYS`, not the database.
   * Plain Redis refuses the unknown flag. It is itself for a script already flagged.
   */
  readonly keyLocked: Script;
}

/** A script with its contract: `call` puts named keys and arguments in their positions. */
export interface ContractScript<C extends Contract> extends Script {
  readonly contract: C;
  call(call: CallOf<C>): ScriptCall;
}

/**
 * Defines a script from its contract, the shared pieces it uses (Lua source, in order) and its
 * body. The assembled source is the header that names KEYS and ARGV, the pieces, then the body.
 */
export function defineScript<const C extends Contract>(
  name: string,
  contract: C,
  pieces: readonly string[],
  body: string,
  { readOnly = false }: { readOnly?: boolean } = {},
): ContractScript<C> {
  const source = [luaHeader(contract), ...pieces, body.replace(/^\n/, "")].join("");
  const flags = readOnly ? "no-writes,allow-key-locking" : "allow-key-locking";
  const keyLocked = script(name, `#!lua flags=${flags}\n${source}`);
  return {
    ...script(name, source, keyLocked),
    contract,
    call: (call) => toCall(name, contract, call),
  };
}

/** A script without a contract: a test's own, or a probe. */
export function plainScript(name: string, source: string, readOnly = false): Script {
  const flags = readOnly ? "no-writes,allow-key-locking" : "allow-key-locking";
  return script(name, source, script(name, `#!lua flags=${flags}\n${source}`));
}

function script(name: string, source: string, keyLocked?: Script): Script {
  let sha1: Promise<string> | undefined;
  const self: Script = {
    name,
    source,
    sha1: () => sha1 ??= digest(source),
    get keyLocked() {
      return keyLocked ?? self;
    },
  };
  return self;
}

async function digest(source: string): Promise<string> {
  const hash = await crypto.subtle.digest("SHA-1", new TextEncoder().encode(source));
  return Array.from(new Uint8Array(hash), (b) => b.toString(16).padStart(2, "0")).join("");
}

const bare = (key: string) => key.replace(/\?$/, "");

/** The Lua that names each key and argument, e.g. `local ttlMs = tonumber(ARGV[2])`. */
export function luaHeader(contract: Contract): string {
  const lines: string[] = [];
  const each = contract.each ?? [];
  each.forEach((key, i) => {
    lines.push(
      `local function ${key}(i) return KEYS[${each.length} * i - ${each.length - 1 - i}] end`,
    );
  });
  const offset = each.length > 0 ? `${each.length} * n + ` : "";
  Object.entries(contract.args).forEach(([arg, kind], i) => {
    const read = kind === "number"
      ? `tonumber(ARGV[${i + 1}])`
      : kind === "flag"
      ? `ARGV[${i + 1}] == '1'`
      : `ARGV[${i + 1}]`;
    lines.push(`local ${arg} = ${read}`);
  });
  contract.keys.forEach((key, i) => {
    lines.push(
      `local ${bare(key)} = KEYS[${offset}${i + 1}]${key.endsWith("?") ? " -- optional" : ""}`,
    );
  });
  if (contract.rest) {
    const first = Object.keys(contract.args).length + 1;
    lines.push(`local ${contract.rest} = {}`);
    lines.push(`for i = ${first}, #ARGV do ${contract.rest}[#${contract.rest} + 1] = ARGV[i] end`);
  }
  return lines.map((line) => `${line}\n`).join("");
}

function toCall(name: string, contract: Contract, call: Record<string, unknown>): ScriptCall {
  const named = call as {
    keys: Record<string, string | undefined>;
    args: Record<string, string | number | boolean>;
    each?: Record<string, string>[];
    rest?: readonly string[];
  };
  const keys = (named.each ?? []).flatMap((item) => contract.each!.map((key) => item[key]!));
  let missing: string | undefined; // optional keys are passed all or none: none after a gap
  for (const key of contract.keys) {
    const value = named.keys[bare(key)];
    if (value === undefined && key.endsWith("?")) missing ??= key;
    else if (value === undefined || missing) {
      throw new TypeError(`The ${name} script's call lacks the key ${bare(missing ?? key)}`);
    } else keys.push(value);
  }
  const args = Object.keys(contract.args).map((arg) => {
    const value = named.args[arg]!;
    return typeof value === "boolean" ? (value ? "1" : "0") : value;
  });
  return { keys, args: [...args, ...(named.rest ?? [])] };
}
