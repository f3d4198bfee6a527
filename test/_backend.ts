// Test backend: a private redis-server and the Upstash REST bridge in front of it.
import { Redis, type RedisConfigNodejs } from "@upstash/redis";
import { type Bridge, startBridge } from "../bridge/mod.ts";
import { type RedisServer, startRedisServer } from "../dev/redis_server.ts";
import { type RedisLike, runScript } from "../src/core/_runner.ts";
import { ACQUIRE } from "../src/core/lua/acquire.ts";
import { ACQUIRE_SHARED } from "../src/core/lua/acquire_shared.ts";
import { FENCE_GRACE_MS } from "../src/core/_validate.ts";
import type { AcquireResult, Lease } from "../src/core/types.ts";

export interface Backend {
  /** The redis-server; a test that restarts it puts the new one here, for `stop()`. */
  server: RedisServer;
  bridge: Bridge;
  token: string;
  /** A real @upstash/redis client talking to the bridge. */
  redis: Redis;
  /** A new client; `options` as for `new Redis`. */
  client(options?: Partial<RedisConfigNodejs>): Redis;
  /** REST requests the bridge served so far. */
  requests(): number;
  stop(): Promise<void>;
}

/** Starts redis-server with `redisArgs` (or takes `server`, stopped with the backend) and a bridge. */
export async function startBackend(
  redisArgs: string[] = [],
  server?: RedisServer,
): Promise<Backend> {
  server ??= await startRedisServer({ args: redisArgs });
  const token = `test-${crypto.randomUUID()}`;
  let bridge: Bridge;
  try {
    // SCRIPT FLUSH is refused over REST; the tests inject it as a fault through the bridge.
    bridge = await startBridge({
      redisUrl: server.url,
      token,
      port: 0,
      extraCommands: ["script|flush"],
    });
  } catch (error) {
    await server.stop();
    throw error;
  }
  const client = (options: Partial<RedisConfigNodejs> = {}) =>
    new Redis({ url: bridge.url, token, enableTelemetry: false, retry: false, ...options });
  const backend: Backend = {
    server,
    bridge,
    token,
    redis: client(),
    client,
    requests: () => bridge.stats().requests,
    async stop() {
      await bridge.close();
      // The server in force: a test that restarted redis-server put the new one here.
      await backend.server.stop();
    },
  };
  return backend;
}

/**
 * A value the tests of one file share, such as a backend: `start` makes it when a test first asks
 * for it, so a file whose tests are all filtered out starts nothing, and `stop` ends it once,
 * after the file's last test (none is needed for a value made from another shared one). Call it
 * at the top of the file, and `await` the function it returns in each test that needs the value.
 * Tests that share it must leave it as they found it.
 */
export function shared<T>(
  start: () => Promise<T>,
  stop?: (value: T) => Promise<void>,
): () => Promise<T> {
  let started: Promise<T> | undefined;
  Deno.test.afterAll(async () => {
    if (started === undefined || stop === undefined) return;
    // A start that failed left nothing to stop, and failed the tests that asked for it.
    const value = await started.then((value) => ({ value }), () => undefined);
    if (value) await stop(value.value);
  });
  return () => started ??= start();
}

/** A backend the tests of one file share, started on first use: see {@linkcode shared}. */
export function sharedBackend(redisArgs: string[] = []): () => Promise<Backend> {
  return shared(() => startBackend(redisArgs), (backend) => backend.stop());
}

/** The lease of an acquire that must have been granted; fails the test with the reply otherwise. */
export function acquired(result: AcquireResult): Lease {
  if (!result.acquired) {
    throw new Error(`expected the lock to be acquired: ${JSON.stringify(result)}`);
  }
  return result.lease;
}

/** A fresh random name for one test, so tests never share keys. */
export function keygen(prefix = "t"): string {
  return `${prefix}:${crypto.randomUUID()}`;
}

/** Polls `check` until it holds, failing after `timeoutMs`: a wait on a condition, not a sleep. */
export async function until(what: string, check: () => Promise<boolean>, timeoutMs = 10_000) {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`Timed out waiting until ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

/** The token in lock `name`'s record (held or not: a lease may have ended), read raw. */
export async function holderOf(
  redis: { get(key: string): Promise<unknown> },
  name: string,
  prefix = "edgelock",
): Promise<string | undefined> {
  const value = await redis.get(lockKeys(name, prefix)[0]);
  return typeof value === "string"
    ? /^[XH]\d+\|-?\d+\|-?\d+\|\d+\|[01]\|([\w-]+)\|/.exec(value)?.[1]
    : undefined;
}

/**
 * The Redis keys the exclusive acquire of lock `name` takes, laid out as the library does: the
 * record, queue, tickets and released marks.
 */
export function lockKeys(name: string, prefix = "edgelock"): [string, string, string, string] {
  const base = `${prefix}:lock:{${name}}`;
  return [base, `${base}:queue`, `${base}:tickets`, `${base}:released`];
}

/** Every key of lock `name` a waiter's or a release's script touches, its wake key by id. */
export function keysOf(name: string) {
  const [lockKey, queueKey, ticketsKey, marksKey] = lockKeys(name);
  return {
    lockKey,
    queueKey,
    ticketsKey,
    marksKey,
    offersKey: `${lockKey}:offers`,
    holdersKey: `${lockKey}:holders`,
    readersKey: `${lockKey}:readers`,
    wakeKey: (id: string) => `${lockKey}:wake:${id}`,
  };
}

// The arguments a waiter's first look passes to either acquire script (no meta, no hold).
function lookArgs(
  name: string,
  token: string,
  ticketMs: number,
  { maxWaiters, wakeId, ttlMs, waiting }: {
    maxWaiters: number;
    wakeId: string;
    ttlMs: number;
    waiting: boolean;
  },
) {
  const graceMs = FENCE_GRACE_MS;
  return {
    token,
    ttlMs,
    meta: "",
    graceMs,
    ticketMs,
    maxWaiters,
    fresh: false,
    name,
    waitedMs: 0,
    waiting,
    hold: "",
    wakeId,
  };
}

/**
 * Takes a queue ticket for `token` the way a waiter does, then never looks again: a waiter that
 * vanished (with `wakeId`, one that vanished while blocked: it leaves an offer, and a release
 * hands it the lock; `ttlMs` the lease it asks for). Returns the acquire script's reply
 * (`[0, retryAfterMs, nowMs, position, …, ticketEnd]` when busy, `[1, fence, ttlMs, nowMs, …]`
 * when granted).
 */
export async function takeTicket(
  redis: RedisLike,
  name: string,
  token: string,
  ticketMs: number,
  options: TicketOptions = {},
): Promise<number[]> {
  const { keys, args } = ticketCall(name, token, ticketMs, options);
  return await runScript(redis, ACQUIRE, keys, args) as number[];
}
type TicketOptions = { prefix?: string; maxWaiters?: number; wakeId?: string; ttlMs?: number };

/** The acquire script's keys and arguments for `takeTicket`'s look. */
export function ticketCall(
  name: string,
  token: string,
  ticketMs: number,
  { prefix = "edgelock", maxWaiters = 128, wakeId = "", ttlMs = 1000 }: TicketOptions = {},
) {
  const [lockKey, queueKey, ticketsKey, marksKey] = lockKeys(name, prefix);
  return ACQUIRE.call({
    keys: {
      lockKey,
      queueKey,
      ticketsKey,
      marksKey,
      offersKey: `${lockKey}:offers`,
      wakeKey: `${lockKey}:wake:${wakeId}`,
    },
    args: lookArgs(name, token, ticketMs, { maxWaiters, wakeId, ttlMs, waiting: true }),
  });
}

/**
 * A shared (`limit` 0) or semaphore waiter's look, as `takeTicket` is an exclusive one's: the
 * acquire_shared script's reply (`[0, retryAfterMs, nowMs, position, …]` when busy, `[1, fence,
 * ttlMs, nowMs, holdCount, hint]` when granted). `ticketMs` 0: a caller that does not queue.
 */
export async function takeSharedTicket(
  redis: RedisLike,
  name: string,
  token: string,
  ticketMs: number,
  { maxWaiters = 128, wakeId = "", ttlMs = 10_000, limit = 0, permits = 1 } = {},
): Promise<unknown[]> {
  const [lockKey, queueKey, ticketsKey, marksKey] = lockKeys(name);
  const { keys, args } = ACQUIRE_SHARED.call({
    keys: {
      lockKey,
      queueKey,
      ticketsKey,
      holdersKey: `${lockKey}:holders`,
      marksKey,
      offersKey: `${lockKey}:offers`,
      wakeKey: `${lockKey}:wake:${wakeId}`,
      readersKey: `${lockKey}:readers`,
    },
    args: {
      ...lookArgs(name, token, ticketMs, { maxWaiters, wakeId, ttlMs, waiting: ticketMs > 0 }),
      limit,
      permits,
    },
  });
  return await runScript(redis, ACQUIRE_SHARED, keys, args) as unknown[];
}
