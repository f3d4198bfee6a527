// What the tokens may add to Redis's script cache, which Redis 7.0 never evicts: each script counts
// once Redis has it (not when it did not compile), against its token's share (the read-only token a
// tenth of the read-write token's) and the bytes of all.
import { type Prepared, sha1 } from "./key_locking.ts";
import type { Role } from "./policy.ts";

/** The scripts the tokens have added to the cache, by the SHA-1 of the body they sent. */
export class ScriptBudget {
  readonly #cached = new Set<string>();
  readonly #added = { readwrite: 0, readonly: 0 };
  readonly #pending = { readwrite: 0, readonly: 0 };
  #bytes = 0;

  constructor(readonly maxScripts: number, readonly maxBytes: number) {}

  /** A role's share of scripts. */
  share(role: Role): number {
    return role === "readwrite" ? this.maxScripts : Math.floor(this.maxScripts / 10);
  }

  /**
   * `prepared` as it is for a command that loads no script or a script cached already; for a new
   * one, within the role's share, it with a `settle` that counts the script once Redis has it;
   * past the share, the refusal.
   */
  admit(
    role: Role,
    name: string,
    args: string[],
    prepared: Prepared,
  ): Prepared | { error: string } {
    const body = scriptBody(name, args);
    if (body === undefined) return prepared;
    const sha = sha1(body);
    if (this.#cached.has(sha)) return prepared;
    const share = this.share(role);
    if (
      this.#added[role] + this.#pending[role] >= share || this.#bytes + body.length > this.maxBytes
    ) {
      return {
        error: `ERR this token may add no more scripts to the cache (${share} scripts, ` +
          `${this.maxBytes} bytes in all): reuse the scripts it has`,
      };
    }
    this.#pending[role]++;
    return {
      ...prepared,
      settle: (slot) => {
        this.#pending[role]--;
        const compiled = "result" in slot || !/Error compiling script/.test(slot.error);
        if (compiled && !this.#cached.has(sha)) {
          this.#cached.add(sha);
          this.#added[role]++;
          this.#bytes += body.length;
        }
      },
    };
  }
}

// The script a command sends Redis to compile, if any.
function scriptBody(name: string, args: string[]): string | undefined {
  const lower = name.toLowerCase();
  if (lower === "eval" || lower === "eval_ro") return args[0];
  if (lower === "script" && args[0]?.toLowerCase() === "load") return args[1];
  return undefined;
}
