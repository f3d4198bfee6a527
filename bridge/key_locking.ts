// Upstash's per-key locking, as the bridge gives it: a script whose shebang carries
// `allow-key-locking` (`#!lua flags=allow-key-locking` or `flags=no-writes,allow-key-locking`)
// is accepted, the flag taken off before Redis, which refuses flags it does not know, sees it.
// Redis then knows the script by the SHA-1 of the body it was sent; the client by the SHA-1 of the
// flagged body, so the bridge maps one to the other (EVALSHA, SCRIPT LOAD, SCRIPT EXISTS). Until
// it has seen a flagged body, an EVALSHA of it answers NOSCRIPT and the client falls back to EVAL.
//
// Strict, it also does what Upstash does to a flagged script that touches a key it did not
// declare: refuses it. Each `redis.call`/`redis.pcall` of the body goes through a check of the
// command's key arguments (their positions from Redis's own `COMMAND` table) against `KEYS`.
import { createHash } from "node:crypto";

/** A command ready for Redis, with what to do to its reply (a SHA-1 to give back, say). */
export type Prepared = {
  name: string;
  args: string[];
  fix?: (reply: unknown) => unknown;
  /** Told of the command's outcome, a result or Redis's error. */
  settle?: (slot: { result: unknown } | { error: string }) => void;
};

const FLAG = "allow-key-locking";

/** Key positions of every command (`COMMAND`'s first key, last key, step): for strict mode. */
export function keySpecs(command: unknown[][]): string {
  const entries: string[] = [];
  for (const entry of command) {
    const [name, first, last, step] = [entry[0], entry[3], entry[4], entry[5]];
    if (typeof first === "number" && first > 0 && /^[a-z_-]+$/i.test(String(name))) {
      entries.push(`['${String(name).toLowerCase()}']={${first},${last},${step}}`);
    }
  }
  return `{${entries.join(",")}}`;
}

/** The bridge's side of key-locked scripts; `specs` (from {@linkcode keySpecs}) makes it strict. */
export class KeyLocking {
  // SHA-1 of a flagged body (the client's) → SHA-1 of the body Redis was sent.
  readonly #redisSha = new Map<string, string>();
  readonly #prelude: string | undefined;

  constructor(specs?: string) {
    this.#prelude = specs === undefined ? undefined : guard(specs);
  }

  prepare(name: string, args: string[]): Prepared {
    const lower = name.toLowerCase();
    if ((lower === "eval" || lower === "eval_ro") && args[0] !== undefined) {
      const body = this.#learn(args[0]);
      return { name, args: body === undefined ? args : [body, ...args.slice(1)] };
    }
    if ((lower === "evalsha" || lower === "evalsha_ro") && args[0] !== undefined) {
      return { name, args: [this.#toRedis(args[0]), ...args.slice(1)] };
    }
    if (lower === "script" && args[0]?.toLowerCase() === "load" && args[1] !== undefined) {
      const body = this.#learn(args[1]);
      if (body === undefined) return { name, args };
      const sha = sha1(args[1]);
      return { name, args: ["LOAD", body], fix: () => sha };
    }
    if (lower === "script" && args[0]?.toLowerCase() === "exists") {
      return { name, args: [args[0], ...args.slice(1).map((sha) => this.#toRedis(sha))] };
    }
    return { name, args };
  }

  #toRedis(sha: string): string {
    return this.#redisSha.get(sha.toLowerCase()) ?? sha;
  }

  // The body Redis is sent for a flagged script (and the SHA mapping), or undefined if unflagged.
  #learn(source: string): string | undefined {
    const shebang = /^#!lua([^\n]*)\n/.exec(source);
    const flags = shebang && /(?:^|\s)flags=(\S*)/.exec(shebang[1]!)?.[1]?.split(",");
    if (!shebang || !flags?.includes(FLAG)) return undefined;
    const rest = flags.filter((flag) => flag !== FLAG);
    let body = source.slice(shebang[0].length);
    if (this.#prelude) {
      body = this.#prelude + body.replace(/\bredis\.(p?call)\s*\(/g, "__el_$1(");
    }
    const sent = (rest.length > 0 ? `#!lua flags=${rest.join(",")}\n` : "") + body;
    this.#redisSha.set(sha1(source), sha1(sent));
    return sent;
  }
}

/** The SHA-1 of a script body, in hex: Redis's name for it. */
export function sha1(text: string): string {
  return createHash("sha1").update(text).digest("hex");
}

// One line, so the script's own line numbers move by one only.
function guard(specs: string): string {
  return [
    "local __el_keys = {} for _, k in ipairs(KEYS) do __el_keys[k] = true end",
    `local __el_spec = ${specs}`,
    "local function __el_check(name, ...)",
    "  local spec = __el_spec[string.lower(name)]",
    "  if not spec then return end",
    "  local n = select('#', ...)",
    "  local last = spec[2] < 0 and n + spec[2] + 1 or math.min(spec[2], n)",
    "  for i = spec[1], last, spec[3] do",
    "    local key = tostring((select(i, ...)))",
    "    if not __el_keys[key] then",
    "      error({err = 'ERR allow-key-locking: the script touched the key ' .. key .. ' that it did not declare in KEYS'})",
    "    end",
    "  end",
    "end",
    "local function __el_call(name, ...) __el_check(name, ...) return redis.call(name, ...) end",
    "local function __el_pcall(name, ...) __el_check(name, ...) return redis.pcall(name, ...) end",
  ].join(" ") + "\n";
}
