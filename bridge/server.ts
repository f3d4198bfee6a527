// The bridge: `startBridge` puts its parts together and takes them apart on close. A front
// (`./front.ts`) owns the client connections; behind it, the HTTP server (`./socket_server.ts`)
// answers the routes (`./routes.ts`), which run commands on the Redis pools (`./pools.ts`).
import { ByteBudget, type Prepare } from "./commands.ts";
import { type Front, startFront } from "./front.ts";
import { KeyLocking, keySpecs } from "./key_locking.ts";
import { refusal, type Role } from "./policy.ts";
import { Pools } from "./pools.ts";
import { toArgs } from "./protocol.ts";
import { connectionCap, restrictScripts } from "./redis_user.ts";
import { Routes } from "./routes.ts";
import { ScriptBudget } from "./scripts.ts";
import { SocketServer } from "./socket_server.ts";
import { Subscriptions } from "./subscriptions.ts";
import { Tokens } from "./auth.ts";
import type { Bridge, BridgeOptions } from "./types.ts";

/** Starts a bridge; resolves once it is connected to Redis and listening. */
export async function startBridge(options: BridgeOptions): Promise<Bridge> {
  const { redisUrl, port = 8079, hostname = "127.0.0.1" } = options;
  const tokens = new Tokens(options.token, options.readonlyToken);
  if (!options.cert !== !options.key) {
    throw new TypeError(
      "TLS needs both a certificate and its key (BRIDGE_TLS_CERT, BRIDGE_TLS_KEY)",
    );
  }
  // Scripts run as the bridge's Redis user: one that may administer would let any EVAL do it.
  const scriptUser = fronts(options)
    ? undefined
    : await restrictScripts(redisUrl, options.scriptUser);
  const pools = await Pools.open(options, scriptUser);
  const subscriptions = new Subscriptions(
    options.maxSubscriptions ?? 1024,
    options.heartbeatMs ?? 15_000,
    () => pools.connect(undefined),
  );
  const keyLocking = new KeyLocking(
    options.strictKeyLocking
      ? keySpecs(await pools.pick().call("COMMAND") as unknown[][])
      : undefined,
  );
  // The front owns the client connections (timeouts, a cap); the HTTP server listens behind it
  // on a Unix socket in a directory of its own.
  const maxConnections = await connectionCap(options.maxConnections ?? 256, [
    pools.maxBlocking,
    pools.shared.length,
    pools.exclusive.connections.length,
  ]);
  let front: Front | undefined;
  const routes = new Routes({
    options,
    tokens,
    pools,
    subscriptions,
    budget: new ByteBudget(options.maxReplyBytes ?? 4 << 20, options.maxBytesInFlight ?? 32 << 20),
    prepareFor: preparer(options, keyLocking),
    connections: () => ({ in_use: front?.open() ?? 0, size: maxConnections }),
  });
  const server = await SocketServer.start((request, info) => routes.handle(request, info));
  try {
    front = startFront({
      hostname,
      port,
      ...(options.cert && options.key && { cert: options.cert, key: options.key }),
      target: server.path,
      maxConnections,
      maxBodyBytes: options.maxBodyBytes ?? 1 << 20,
      headerTimeoutMs: options.headerTimeoutMs ?? 10_000,
      idleTimeoutMs: options.idleTimeoutMs ?? 60_000,
    });
  } catch (error) {
    await server.shutdown();
    pools.cut();
    await server.remove();
    throw error;
  }
  const started = front;
  let closing: Promise<void> | undefined;
  return {
    url: `${options.cert ? "https" : "http"}://${hostname}:${started.port}`,
    port: started.port,
    stats: () => ({ ...routes.stats }),
    close() {
      closing ??= close(started, server, subscriptions, pools, options.shutdownGraceMs ?? 5000);
      return closing;
    },
  };
}

// Stop accepting; let in-flight requests finish for the grace, then cut their connections (they
// answer 500) so a stuck command never holds the shutdown.
async function close(
  front: Front,
  server: SocketServer,
  subscriptions: Subscriptions,
  pools: Pools,
  graceMs: number,
): Promise<void> {
  await front.stop(); // no new connections; those open finish their requests
  subscriptions.endAll(); // a stream never finishes by itself
  const done = server.shutdown();
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<void>((resolve) => timer = setTimeout(resolve, graceMs));
  await Promise.race([done, late]);
  clearTimeout(timer);
  pools.close();
  await done;
  await front.close();
  await server.remove();
}

// A command as Redis will get it, for a token's role: refused by the policy (the read-write
// token may also run `extraCommands`), a new script counted against the cache's budget, key
// locking's flag taken off.
function preparer(options: BridgeOptions, keyLocking: KeyLocking): (role: Role) => Prepare {
  const extra = new Set(options.extraCommands ?? []);
  const scriptCache = new ScriptBudget(
    options.maxScripts ?? 1000,
    options.maxScriptBytes ?? 16 << 20,
  );
  return (role) => (command) => {
    const [name, args] = toArgs(command);
    const refused = refusal(role, name, args, role === "readwrite" ? extra : undefined);
    if (refused) return { error: refused };
    return scriptCache.admit(role, name, args, keyLocking.prepare(name, args));
  };
}

// A Redis Cluster: the bridge does not make its restricted user there (docs/bridge.md).
function fronts(options: BridgeOptions): boolean {
  return (options.clusterUrls?.length ?? 0) > 0;
}
