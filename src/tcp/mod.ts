/**
 * edgelock over TCP: the library on Node, Bun and Deno servers with `ioredis` (standalone or
 * Cluster) or `node-redis`, through the same script runner as over REST (EVALSHA, EVAL on
 * NOSCRIPT). The adapters take the client you made; this entry imports neither package.
 *
 * @example
 * ```ts
 * import { Redis } from "ioredis";
 * import { Locks } from "@edgelock/edgelock";
 * import { fromIORedis } from "@edgelock/edgelock/tcp";
 *
 * const locks = new Locks(fromIORedis(new Redis(process.env.REDIS_URL!)));
 * await locks.withLock("report:daily", { ttlMs: 10_000 }, async (lease) => {
 *   // … write, passing lease.fence along
 * });
 * ```
 *
 * @module
 */
import type { PipelineLike, RedisLike } from "../core/_runner.ts";
import { InvalidType } from "../core/_invalid.ts";

/** Sends one raw command, e.g. `["EVALSHA", sha, "1", key, arg]`, and resolves with its reply. */
export type SendCommand = (args: string[]) => Promise<unknown>;

/** The part of an `ioredis` `Redis` or `Cluster` that edgelock uses. */
export interface IORedisLike {
  /** Sends a raw command. */
  call(command: string, ...args: string[]): Promise<unknown>;
}

/** The part of a `node-redis` client (`createClient`) that edgelock uses. */
export interface NodeRedisLike {
  /** Sends a raw command. */
  sendCommand(args: string[]): Promise<unknown>;
}

/** The part of a `node-redis` cluster (`createCluster`) that edgelock uses. */
export interface NodeRedisClusterLike {
  /** Sends a raw command to the node serving `firstKey`. */
  sendCommand(firstKey: string | undefined, isReadonly: boolean, args: string[]): Promise<unknown>;
}

/** An `ioredis` client, standalone or `Cluster` (each script goes to its keys' slot). */
export function fromIORedis(client: IORedisLike): RedisLike {
  if (typeof client?.call !== "function") {
    throw new InvalidType("fromIORedis needs an ioredis Redis or Cluster");
  }
  return fromSend(([command, ...args]) => client.call(command!, ...args));
}

/** A `node-redis` client from `createClient()`, connected. */
export function fromNodeRedis(client: NodeRedisLike): RedisLike {
  if (typeof client?.sendCommand !== "function") {
    throw new InvalidType("fromNodeRedis needs a node-redis client");
  }
  return fromSend((args) => client.sendCommand(args));
}

/** A `node-redis` cluster from `createCluster()`, connected: each script goes to its first key's node. */
export function fromNodeRedisCluster(cluster: NodeRedisClusterLike): RedisLike {
  if (typeof cluster?.sendCommand !== "function") {
    throw new InvalidType("fromNodeRedisCluster needs a node-redis cluster");
  }
  // EVAL/EVALSHA <script> <numkeys> <key…>: the first key picks the node.
  return fromSend((args) => cluster.sendCommand(args[3], false, args));
}

/**
 * Any client that sends raw commands. A batch is sent as concurrent commands, which clients
 * pipeline on their connection and which may span cluster slots; each answers on its own.
 */
export function fromSend(send: SendCommand): RedisLike {
  const script = (command: string) => (body: string, keys: string[], args: unknown[]) =>
    send([command, body, String(keys.length), ...keys, ...args.map(String)]);
  const evalsha = script("EVALSHA");
  const evalScript = script("EVAL");
  return {
    evalsha,
    eval: evalScript,
    pipeline(): PipelineLike {
      const calls: (() => Promise<unknown>)[] = [];
      return {
        evalsha(sha1, keys, args) {
          calls.push(() => evalsha(sha1, keys, args));
        },
        eval(source, keys, args) {
          calls.push(() => evalScript(source, keys, args));
        },
        async exec() {
          const settled = await Promise.allSettled(calls.map((call) => call()));
          // A reply error answers its own command; a transport failure fails the batch.
          return settled.map((outcome) => {
            if (outcome.status === "fulfilled") return { result: outcome.value };
            if (isReplyError(outcome.reason)) {
              return { result: null, error: outcome.reason.message };
            }
            throw outcome.reason;
          });
        },
      };
    },
  };
}

// Redis's own error replies start with an upper-case code: ERR, NOSCRIPT, WRONGTYPE, CROSSSLOT…
function isReplyError(error: unknown): error is Error {
  return error instanceof Error && /^[A-Z]{3,}\b/.test(error.message);
}
