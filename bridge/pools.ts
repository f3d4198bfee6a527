// The bridge's connections to Redis, and which of them a request's commands run on: single
// commands and pipelines share a pool, a transaction holds a connection of its own for its MULTI …
// EXEC, a blocking command gets a connection of its own for as long as it blocks, and a running
// script that is late is killed from one more. Fronting a Redis Cluster, the cluster client serves
// them all (blocking commands are refused there).
import { Cluster, Redis as IORedis } from "ioredis";
import { BadRequest, type Command, type Slot } from "./protocol.ts";
import {
  type Connection,
  ExclusivePool,
  isBlocking,
  type Prepare,
  runOne,
  runPipeline,
  runTransaction,
  type Take,
  untilReady,
} from "./commands.ts";
import type { RedisUser } from "./redis_user.ts";
import type { BridgeOptions } from "./types.ts";

// How many blocking commands' connections stay open, idle, for the next blocking command.
const IDLE_BLOCKING = 32;

/** The pools, connected; {@linkcode Pools.open} makes them. */
export class Pools {
  readonly cluster: Cluster | undefined;
  readonly shared: IORedis[];
  readonly exclusive: ExclusivePool;
  /** Blocking commands' connections, open now; at most `maxBlocking`. */
  readonly blocking = new Set<IORedis>();
  readonly maxBlocking: number;
  /** Commands (single ones and pipelines) running on the shared pool now. */
  sharedInFlight = 0;
  readonly #user: RedisUser | undefined;
  /** Where data connections go: the bridge's own user's URL, or the first seed of a cluster. */
  readonly #url: string;
  readonly #commandTimeoutMs: number;
  readonly #scriptTimeoutMs: number;
  readonly #isolate: (command: Command) => boolean;
  #next = 0;
  // Blocking commands' connections that finished their command cleanly, kept for the next one
  // (a waiter blocks again soon): no connect and AUTH per BLPOP. At most IDLE_BLOCKING.
  readonly #idleBlocking: IORedis[] = [];
  // A connection of its own for SCRIPT KILL: the pool's may be waiting on the running script.
  #killer: IORedis | undefined;

  /**
   * Connects to Redis as `user` (the bridge's own, when it made one); when Redis cannot be
   * reached, lets go of every connection and of `user`, and throws.
   */
  static async open(options: BridgeOptions, user: RedisUser | undefined): Promise<Pools> {
    const pools = new Pools(options, user);
    try {
      if (pools.cluster) await untilReady(pools.cluster);
      else await Promise.all(pools.#all.map((conn) => conn.connect()));
    } catch (error) {
      pools.cut();
      await user?.remove();
      const what = pools.cluster
        ? `the Redis Cluster at ${options.clusterUrls}`
        : `Redis at ${options.redisUrl}`;
      throw new Error(`The bridge cannot reach ${what}`, { cause: error });
    }
    return pools;
  }

  private constructor(options: BridgeOptions, user: RedisUser | undefined) {
    this.#user = user;
    this.#url = options.clusterUrls?.[0] ?? user?.url ?? options.redisUrl;
    this.#commandTimeoutMs = options.commandTimeoutMs ?? 30_000;
    this.#scriptTimeoutMs = options.scriptTimeoutMs ?? 5000;
    this.maxBlocking = options.maxBlocking ?? 256;
    this.#isolate = options.isolateBlocking === false ? () => false : isBlocking;
    this.cluster = options.clusterUrls &&
      connectCluster(options.clusterUrls, this.#commandTimeoutMs);
    const connections = (size: number) =>
      this.cluster ? [] : Array.from({ length: size }, () => this.connect());
    this.shared = connections(options.poolSize ?? 4);
    this.exclusive = new ExclusivePool(connections(options.transactionPoolSize ?? 2));
  }

  get #all(): IORedis[] {
    return [...this.shared, ...this.exclusive.connections];
  }

  // Blocking commands' connections take no command timeout: the bridge times them and drops them.
  // On a cluster, a subscription's connection goes to the first seed: PUBLISH reaches every node.
  /** A new connection, not yet connected. */
  connect(commandTimeout: number | undefined = this.#commandTimeoutMs): IORedis {
    const conn = new IORedis(this.#url, {
      lazyConnect: true,
      enableOfflineQueue: false,
      enableReadyCheck: false, // its INFO is not for the bridge's restricted user
      maxRetriesPerRequest: 0,
      retryStrategy: () => 100,
      ...(commandTimeout !== undefined && { commandTimeout }),
    });
    // Reported per request; ioredis reconnects by itself. A Redis that restarted without its ACL
    // refuses the bridge's own user: it is made again, and the next reconnect gets in.
    conn.on("error", (error: Error) => {
      if (/WRONGPASS|NOAUTH/.test(error.message)) this.#user?.renew();
    });
    return conn;
  }

  /** The shared pool's next connection, in turn (or the cluster client). */
  pick(): Connection {
    return this.cluster ?? this.shared[this.#next++ % this.shared.length]!;
  }

  /** The pools' gauges for the metrics: in use, and size. */
  gauges(): Record<"shared" | "transaction" | "blocking", { in_use: number; size: number }> {
    return {
      shared: { in_use: this.sharedInFlight, size: this.shared.length },
      transaction: { in_use: this.exclusive.busy, size: this.exclusive.connections.length },
      blocking: { in_use: this.blocking.size, size: this.maxBlocking },
    };
  }

  /** One command: on a connection of its own if it blocks, else on the shared pool. */
  one(command: Command, prepare: Prepare, take: Take): Promise<Slot> {
    return this.#watched(
      [command],
      () =>
        this.#isolate(command)
          ? this.#block((conn) => runOne(conn, command, prepare, take))
          : this.#share((conn) => runOne(conn, command, prepare, take)),
    );
  }

  /** A pipeline: on a cluster, command by command (they may span slots). */
  pipeline(commands: Command[], prepare: Prepare, take: Take): Promise<Slot[]> {
    const cluster = this.cluster;
    return this.#watched(
      commands,
      () =>
        cluster
          ? Promise.all(commands.map((command) => runOne(cluster, command, prepare, take)))
          : commands.some(this.#isolate)
          ? this.#block((conn) => runPipeline(conn, commands, prepare, take))
          : this.#share((conn) => runPipeline(conn as IORedis, commands, prepare, take)),
    );
  }

  /** A transaction, on a connection held for it (on a cluster, its keys' node). */
  transaction(commands: Command[], prepare: Prepare, take: Take): Promise<Slot[] | Slot> {
    const cluster = this.cluster;
    return this.#watched(
      commands,
      () =>
        cluster
          ? runTransaction(cluster, commands, prepare, take)
          : this.exclusive.use((conn) => runTransaction(conn, commands, prepare, take)),
    );
  }

  /** Cuts the pools' connections (not the blocking ones'), and the cluster client's. */
  cut(): void {
    this.#all.forEach((conn) => conn.disconnect());
    this.cluster?.disconnect();
  }

  /** Cuts every connection, and removes the bridge's own Redis user. */
  close(): void {
    this.blocking.forEach((conn) => conn.disconnect());
    this.#idleBlocking.splice(0).forEach((conn) => conn.disconnect());
    this.#killer?.disconnect();
    this.#user?.remove();
    this.cut();
  }

  // A request whose commands run a script has the running script killed (`SCRIPT KILL`) should it
  // still be unanswered after scriptTimeoutMs.
  async #watched<T>(commands: Command[], run: () => Promise<T>): Promise<T> {
    let watchdog: ReturnType<typeof setTimeout> | undefined;
    if (!this.cluster && commands.some(([name]) => /^(eval|evalsha)(_ro)?$/i.test(name))) {
      // Redis takes SCRIPT KILL once a script has run past its busy threshold (5 s by default).
      watchdog = setTimeout(() => {
        const killer = this.#killer ??= this.connect(undefined);
        killer.connect().catch(() => {}).then(() => killer.call("SCRIPT", "KILL")).catch(() => {});
      }, this.#scriptTimeoutMs);
    }
    try {
      return await run();
    } finally {
      clearTimeout(watchdog);
    }
  }

  async #share<T>(fn: (conn: Connection) => Promise<T>): Promise<T> {
    this.sharedInFlight++;
    try {
      return await fn(this.pick());
    } finally {
      this.sharedInFlight--;
    }
  }

  // Blocking commands, on connections of their own (none on a cluster: refused there).
  async #block<T>(fn: (conn: IORedis) => Promise<T>): Promise<T> {
    if (this.cluster) {
      throw new BadRequest("ERR blocking commands are not supported on a cluster bridge");
    }
    if (this.blocking.size >= this.maxBlocking) {
      throw new BadRequest(
        `ERR too many blocking commands in flight (at most ${this.maxBlocking})`,
      );
    }
    let conn = this.#idleBlocking.pop();
    while (conn && conn.status !== "ready") {
      conn.disconnect();
      conn = this.#idleBlocking.pop();
    }
    const fresh = conn === undefined;
    conn ??= this.connect(undefined);
    this.blocking.add(conn);
    const timeoutMs = this.#commandTimeoutMs;
    let timer: ReturnType<typeof setTimeout> | undefined;
    let clean = false; // the command answered: the connection waits on nothing
    try {
      if (fresh) await conn.connect();
      const late = new Promise<never>((_, reject) => {
        timer = setTimeout(
          () => reject(new BadRequest(`ERR the command ran past ${timeoutMs} ms`, 504)),
          timeoutMs,
        );
      });
      const reply = await Promise.race([fn(conn), late]);
      clean = true;
      return reply;
    } finally {
      clearTimeout(timer);
      this.blocking.delete(conn);
      if (clean && this.#idleBlocking.length < IDLE_BLOCKING) this.#idleBlocking.push(conn);
      else conn.disconnect();
    }
  }
}

function connectCluster(urls: string[], commandTimeout: number): Cluster {
  const cluster = new Cluster(
    urls.map((url) => {
      const { hostname: host, port } = new URL(url);
      return { host, port: Number(port) };
    }),
    {
      enableOfflineQueue: false,
      redisOptions: { maxRetriesPerRequest: 0, commandTimeout },
    },
  );
  cluster.on("error", () => {}); // reported per request
  return cluster;
}
