// `deno task bridge`: the bridge as a program, configured by env (docs/bridge.md); flags first,
// so --help and a bad flag need no env, and a flag given overrides its variable.
import { cli } from "./_cli.ts";
import { bridgeOptionsFromEnv } from "./config.ts";
import { startBridge } from "./server.ts";
import type { BridgeOptions } from "./types.ts";

if (import.meta.main) {
  // Flags first (so --help and a bad flag need no env); a flag given overrides its variable.
  const flags = cli(
    "edgelock bridge",
    'deno task bridge [flags]   (configured by env: see the README\'s "Running the bridge")',
    {
      port: { type: "number", min: 0, max: 65535, help: "port, 0 for a free one (BRIDGE_PORT)" },
      hostname: { type: "string", help: "address (BRIDGE_HOSTNAME)" },
      redis: { type: "string", help: "the redis-server (REDIS_URL)" },
      "grace-ms": {
        type: "number",
        min: 0,
        max: 600_000,
        help: "on SIGTERM, how long in-flight requests may finish (BRIDGE_GRACE_MS)",
      },
    },
  );
  const overrides: Record<string, number | string | undefined> = {
    BRIDGE_PORT: flags.port,
    BRIDGE_HOSTNAME: flags.hostname,
    REDIS_URL: flags.redis,
    BRIDGE_GRACE_MS: flags["grace-ms"],
  };
  let fromEnv: BridgeOptions;
  try {
    fromEnv = await bridgeOptionsFromEnv((name) =>
      overrides[name]?.toString() ?? Deno.env.get(name)
    );
  } catch (error) {
    console.error(`edgelock bridge: ${(error as Error).message}`);
    Deno.exit(2);
  }
  try {
    const bridge = await startBridge(fromEnv);
    const front = fromEnv.clusterUrls
      ? `the Redis Cluster at ${fromEnv.clusterUrls}`
      : fromEnv.redisUrl;
    console.error(`Upstash REST bridge on ${bridge.url} in front of ${front}`);
    const stop = async () => {
      await bridge.close();
      Deno.exit(0);
    };
    Deno.addSignalListener("SIGINT", stop);
    Deno.addSignalListener("SIGTERM", stop);
  } catch (error) {
    const inUse = error instanceof Deno.errors.AddrInUse;
    console.error(
      `edgelock bridge: ${
        inUse
          ? `port ${fromEnv.port} is in use; choose another with --port`
          : (error as Error).message
      }`,
    );
    Deno.exit(1);
  }
}
