// What each token may run: an allowlist of data commands, as managed Redis services serve
// (Upstash's compatibility table; Memorystore's and OCI Cache's blocked lists). Every command of
// Redis's `COMMAND` list, and each subcommand where it matters, is `read` (both tokens), `write`
// (the read-write token) or refused; a command this table does not know is refused, so a newer
// Redis adds nothing until it is classified here (`test/bridge_policy_test.ts` walks the list).

/** How the bridge treats one command or `container|subcommand`. */
export type Access = "read" | "write";

const READ = [
  // strings, bitmaps, HyperLogLog
  "get",
  "getrange",
  "substr",
  "mget",
  "strlen",
  "lcs",
  "getbit",
  "bitcount",
  "bitpos",
  "bitfield_ro",
  "pfcount",
  // keys
  "exists",
  "type",
  "ttl",
  "pttl",
  "expiretime",
  "pexpiretime",
  "touch",
  "randomkey",
  "scan",
  "keys",
  "dbsize",
  "dump",
  "object|encoding",
  "object|freq",
  "object|idletime",
  "object|refcount",
  "object|help",
  "memory|usage",
  "memory|help",
  // hashes, lists, sets, sorted sets, geo, streams
  "hget",
  "hmget",
  "hgetall",
  "hkeys",
  "hvals",
  "hlen",
  "hexists",
  "hstrlen",
  "hrandfield",
  "hscan",
  "lindex",
  "llen",
  "lpos",
  "lrange",
  "scard",
  "sismember",
  "smismember",
  "smembers",
  "srandmember",
  "sscan",
  "sdiff",
  "sinter",
  "sintercard",
  "sunion",
  "sort_ro",
  "zcard",
  "zcount",
  "zlexcount",
  "zscore",
  "zmscore",
  "zrank",
  "zrevrank",
  "zrange",
  "zrangebylex",
  "zrangebyscore",
  "zrevrange",
  "zrevrangebylex",
  "zrevrangebyscore",
  "zrandmember",
  "zscan",
  "zdiff",
  "zinter",
  "zintercard",
  "zunion",
  "geodist",
  "geohash",
  "geopos",
  "georadius_ro",
  "georadiusbymember_ro",
  "geosearch",
  "xlen",
  "xrange",
  "xrevrange",
  "xread",
  "xpending",
  "xinfo|stream",
  "xinfo|groups",
  "xinfo|consumers",
  "xinfo|help",
  // scripts that cannot write, the script cache's lookups, pub/sub introspection
  "eval_ro",
  "evalsha_ro",
  "script|exists",
  "script|help",
  "pubsub|channels",
  "pubsub|numsub",
  "pubsub|numpat",
  "pubsub|shardchannels",
  "pubsub|shardnumsub",
  "pubsub|help",
  // the connection and the server, without their state: what a client asks to check the link
  "ping",
  "echo",
  "time",
  "lolwut",
  "command|count",
  "command|docs",
  "command|info",
  "command|list",
  "command|getkeys",
  "command|getkeysandflags",
  "command|help",
  "cluster|keyslot",
  "client|id",
  "client|getname",
  "client|info",
  "client|help",
];

/** Commands that may block their connection (XREAD and XREADGROUP too, with BLOCK). */
export const BLOCKING: readonly string[] = [
  "blpop",
  "brpop",
  "brpoplpush",
  "blmove",
  "blmpop",
  "bzpopmin",
  "bzpopmax",
  "bzmpop",
  "wait",
  "waitaof",
];

const WRITE = [
  "set",
  "setnx",
  "setex",
  "psetex",
  "getset",
  "getdel",
  "getex",
  "mset",
  "msetnx",
  "append",
  "setrange",
  "incr",
  "incrby",
  "incrbyfloat",
  "decr",
  "decrby",
  "setbit",
  "bitfield",
  "bitop",
  "pfadd",
  "pfmerge",
  "del",
  "unlink",
  "expire",
  "pexpire",
  "expireat",
  "pexpireat",
  "persist",
  "rename",
  "renamenx",
  "copy",
  "flushdb",
  "flushall",
  "hset",
  "hsetnx",
  "hmset",
  "hdel",
  "hincrby",
  "hincrbyfloat",
  "lpush",
  "lpushx",
  "rpush",
  "rpushx",
  "lpop",
  "rpop",
  "linsert",
  "lset",
  "lrem",
  "ltrim",
  "lmove",
  "lmpop",
  "rpoplpush",
  "sadd",
  "srem",
  "spop",
  "smove",
  "sdiffstore",
  "sinterstore",
  "sunionstore",
  "sort",
  "zadd",
  "zincrby",
  "zrem",
  "zremrangebylex",
  "zremrangebyrank",
  "zremrangebyscore",
  "zpopmin",
  "zpopmax",
  "zmpop",
  "zrangestore",
  "zdiffstore",
  "zinterstore",
  "zunionstore",
  "geoadd",
  "georadius",
  "georadiusbymember",
  "geosearchstore",
  "xadd",
  "xdel",
  "xtrim",
  "xsetid",
  "xack",
  "xclaim",
  "xautoclaim",
  "xreadgroup",
  "xgroup|create",
  "xgroup|createconsumer",
  "xgroup|delconsumer",
  "xgroup|destroy",
  "xgroup|setid",
  "xgroup|help",
  // blocking ones run each on a connection of its own (commands.ts)
  ...BLOCKING,
  // scripts that may write, and loading one; publishing
  "eval",
  "evalsha",
  "script|load",
  "publish",
  "spublish",
];

/**
 * Refused, each with why (a few named here; anything not in READ or WRITE is refused too):
 * administration, replication, persistence, other databases and connection state.
 */
export const REFUSED_EXAMPLES: Record<string, string> = {
  "acl": "administers users",
  "config": "administers the server",
  "migrate": "makes Redis connect elsewhere",
  "restore": "loads a serialized value that Redis does not fully check",
  "swapdb": "reaches other databases",
  "move": "reaches other databases",
  "select": "changes the connection's database",
  "script|debug": "takes the connection into the Lua debugger",
  "script|kill": "ends another client's script",
  "script|flush": "empties every client's script cache",
  "function": "loads server-side code",
  "client|list": "shows other clients",
  "multi": "is /multi-exec over REST",
  "subscribe": "is /subscribe over REST",
};

const TABLE: ReadonlyMap<string, Access> = new Map([
  ...READ.map((name) => [name, "read"] as const),
  ...WRITE.map((name) => [name, "write"] as const),
]);

/** Commands whose subcommand decides (`script load` is written `script|load` in the table). */
const CONTAINERS = new Set(
  [...TABLE.keys(), ...Object.keys(REFUSED_EXAMPLES)].filter((key) => key.includes("|"))
    .map((key) => key.split("|")[0]!),
);
CONTAINERS.add("function").add("acl").add("config").add("cluster").add("latency").add("slowlog")
  .add("module").add("memory").add("client");

/** The table's key for a command: `name`, or `name|subcommand` for a container. */
export function commandKey(name: string, args: readonly string[]): string {
  const lower = name.toLowerCase();
  return CONTAINERS.has(lower) ? `${lower}|${String(args[0] ?? "").toLowerCase()}` : lower;
}

/** What the table says of a command: `read`, `write`, or undefined (refused). */
export function accessOf(name: string, args: readonly string[]): Access | undefined {
  return TABLE.get(commandKey(name, args));
}

/** Every command the table allows, for the tests and the README. */
export function allowed(): ReadonlyMap<string, Access> {
  return TABLE;
}

/** A token's role: what the read-write and the read-only token may run. */
export type Role = "readwrite" | "readonly";

/**
 * Why `role` may not run the command, or undefined when it may. `extra` lets a test bridge run
 * refused commands it needs for fault injection (FLUSH of the script cache, say).
 */
export function refusal(
  role: Role,
  name: string,
  args: readonly string[],
  extra: ReadonlySet<string> = new Set(),
): string | undefined {
  const key = commandKey(name, args);
  const access = TABLE.get(key) ?? (extra.has(key) ? "write" : undefined);
  const shown = key.replace("|", " ").toUpperCase();
  if (access === undefined) {
    const why = REFUSED_EXAMPLES[key] ?? REFUSED_EXAMPLES[key.split("|")[0]!];
    return why
      ? `ERR command '${shown}' is not supported over REST: it ${why}`
      : `ERR unknown command '${shown}', or one not supported over REST`;
  }
  if (access === "write" && role === "readonly") {
    return `NOPERM this token is read-only: '${shown.toLowerCase()}' may write`;
  }
  return undefined;
}
