// The pieces every script module shares: how a script is defined and its SHA-1 computed, and the
// preamble that reads the server clock.

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

/** Defines a script; its SHA-1 is computed on first use and then cached. */
export function defineScript(
  name: string,
  source: string,
  { readOnly = false }: { readOnly?: boolean } = {},
): Script {
  const flags = readOnly ? "no-writes,allow-key-locking" : "allow-key-locking";
  const keyLocked = script(name, `#!lua flags=${flags}\n${source}`);
  return script(name, source, keyLocked);
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

// Shared preamble: the server clock in microseconds and milliseconds. Microseconds since the
// epoch are about 1.8e15, well inside the 2^53 that Lua doubles and JSON numbers hold exactly.
// ttlOrSet: a key's TTL; one without a TTL (a PERSIST, a restore, a hand repair) would hold its
// name forever, so it gets `ms` now. Only for keys that exist.
export const NOW = `
local time  = redis.call('TIME')
local nowUs = tonumber(time[1]) * 1000000 + tonumber(time[2])
local nowMs = math.floor(nowUs / 1000)
local function ttlOrSet(key, ms)
  local pttl = redis.call('PTTL', key)
  if pttl >= 0 then return pttl end
  redis.call('PEXPIRE', key, ms)
  return ms
end
`;
