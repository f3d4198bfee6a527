// The bridge's own Redis user, and how many client connections the process can hold: the limits
// the bridge keeps from Redis's side and the operating system's.
import { Redis as IORedis } from "ioredis";

/** The user the bridge's data connections log in as; `renew` makes it again, `remove` ends it. */
export interface RedisUser {
  url: string;
  renew(): void;
  remove(): Promise<void>;
}

// A client connection costs up to four file descriptors (its socket, both ends of the Unix socket
// behind the front, and a Redis connection if it subscribes), and the server's end of a closed one
// may linger while its handler waits on Redis: the cap stays at an eighth of the process's
// open-file limit (Linux: /proc/self/limits) less the Redis pools, so the bridge never runs out.
export async function connectionCap(wanted: number, redisConnections: number[]): Promise<number> {
  const limits = await Deno.readTextFile("/proc/self/limits").catch(() => "");
  const soft = Number(/^Max open files\s+(\d+)/m.exec(limits)?.[1]);
  if (!Number.isFinite(soft) || soft <= 0) return wanted;
  const spare = soft - 32 - redisConnections.reduce((sum, n) => sum + n, 0);
  return Math.max(1, Math.min(wanted, Math.floor(spare / 8)));
}

/** What the bridge's own Redis user may run: data, and no administration, from scripts too. */
export const BRIDGE_ACL_RULES =
  "+@all -@admin -@dangerous -move -select -memory +memory|usage +flushdb +flushall +keys +sort +sort_ro";

/**
 * Makes sure a script run through the bridge cannot administer Redis. When the configured user can
 * (a script's `SLOWLOG LEN` runs), the bridge makes a user of its own with BRIDGE_ACL_RULES and a
 * random password, connects as it, and deletes it on close; when it may not make one, it refuses
 * to start, saying what to set up. `scriptUser: "as-configured"` skips this.
 */
export async function restrictScripts(
  redisUrl: string,
  scriptUser: "restricted" | "as-configured" = "restricted",
): Promise<RedisUser | undefined> {
  if (scriptUser === "as-configured") return undefined;
  // A Redis that accepts the connection and never answers stops the bridge's start with a cause.
  const admin = new IORedis(redisUrl, {
    lazyConnect: true,
    maxRetriesPerRequest: 0,
    connectTimeout: 5000,
    commandTimeout: 5000,
  });
  admin.on("error", () => {});
  try {
    await admin.connect().catch((error) => {
      const why = error instanceof Error && /^(WRONGPASS|NOAUTH)\b/.test(error.message)
        ? ": it refused the URL's user or password"
        : "";
      throw new Error(`The bridge cannot reach Redis at ${withoutPassword(redisUrl)}${why}`, {
        cause: error,
      });
    });
    const probe = await admin.call("EVAL", "return redis.call('SLOWLOG', 'LEN')", "0").then(
      () => true,
      () => false,
    );
    if (!probe) return undefined; // the configured user is restricted already
    const name = `edgelock-bridge-${crypto.randomUUID().slice(0, 8)}`;
    const password = crypto.randomUUID() + crypto.randomUUID();
    const setUser = () =>
      admin.call(
        "ACL",
        "SETUSER",
        name,
        "reset",
        "on",
        `>${password}`,
        "~*",
        "&*",
        ...BRIDGE_ACL_RULES.split(" "),
      );
    try {
      await setUser();
    } catch (error) {
      throw new Error(
        "The bridge's Redis user may run administration commands from scripts, and may not make " +
          'a restricted user: create one (docs/bridge.md, "Scripts") and set REDIS_URL to it',
        { cause: error },
      );
    }
    const url = new URL(redisUrl);
    url.username = name;
    url.password = password;
    let renewing = false;
    return {
      url: url.href,
      renew() {
        if (renewing) return;
        renewing = true;
        setUser().catch(() => {}).finally(() => setTimeout(() => renewing = false, 100));
      },
      remove: () =>
        admin.call("ACL", "DELUSER", name).then(() => {}, () => {}).finally(() =>
          admin.disconnect()
        ),
    };
  } catch (error) {
    admin.disconnect();
    throw error;
  }
}

// A Redis URL as it may be shown: its password, if any, replaced.
function withoutPassword(url: string): string {
  try {
    const parsed = new URL(url);
    if (parsed.password) parsed.password = "***";
    return parsed.href;
  } catch {
    return "the configured URL";
  }
}
