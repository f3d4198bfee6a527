// Running commands on Redis: one command, a pipeline, a transaction on a connection held for it,
// and a budget that bounds the reply bytes one request (and all requests together) may hold.
import type { Cluster, Redis as IORedis } from "ioredis";
import type { Prepared } from "./key_locking.ts";
import { BLOCKING } from "./policy.ts";
import { BadRequest, type Command, replyBytes, type Slot } from "./protocol.ts";

/** A connection of the pool, or the cluster client (which routes each command by its keys' slot). */
export type Connection = IORedis | Cluster;

/** A command as Redis will get it, or the reason it is refused. */
export type Prepare = (command: Command) => Prepared | { error: string };

// Commands that may block their connection (the policy's list): each runs on a connection of its
// own.
const BLOCKING_NAMES = new Set(BLOCKING);

export function isBlocking([name, ...args]: Command): boolean {
  const lower = name.toLowerCase();
  if (BLOCKING_NAMES.has(lower)) return true;
  return (lower === "xread" || lower === "xreadgroup") &&
    args.some((arg) => String(arg).toLowerCase() === "block");
}

/**
 * Request and reply bytes in flight: a request's replies at most `perRequest`, and everything
 * all requests hold at once (bodies, counted four times for their parsed form, and replies) at
 * most `total`. A request past either fails as a whole (413, or 503 while others hold the total),
 * and what it held is given back.
 */
export class ByteBudget {
  #used = 0;
  constructor(readonly perRequest: number, readonly total: number) {}

  get used(): number {
    return this.#used;
  }

  /**
   * A request's share: `body` counts body bytes in, `take` a reply's bytes, `done` gives them
   * all back.
   */
  open(): {
    body(bytes: number): void;
    take(reply: unknown): number;
    hold(bytes: number): void;
    done(): void;
  } {
    let mine = 0;
    let replies = 0;
    const add = (bytes: number) => {
      mine += bytes;
      this.#used += bytes;
      if (this.#used > this.total) {
        throw new BadRequest(
          "ERR the bridge holds too much for other requests: retry shortly",
          503,
        );
      }
    };
    return {
      body: (bytes) => add(bytes * 4),
      hold: (bytes) => add(bytes),
      take: (reply) => {
        const bytes = replyBytes(reply);
        replies += bytes;
        if (replies > this.perRequest) {
          throw new BadRequest(
            `ERR the reply is over ${this.perRequest} bytes: ask for less in one request`,
            413,
          );
        }
        add(bytes);
        return bytes;
      },
      done: () => {
        this.#used -= mine;
        mine = 0;
      },
    };
  }
}

/** Counts a reply against the request's budget (throws past it); returns its bytes. */
export type Take = (reply: unknown) => number;

export async function runOne(
  conn: Connection,
  command: Command,
  prepare: Prepare,
  take: Take,
): Promise<Slot> {
  const prepared = prepare(command);
  if ("error" in prepared) return prepared;
  let reply: unknown;
  try {
    reply = await conn.callBuffer(prepared.name, ...prepared.args);
  } catch (error) {
    return fixed(prepared, { error: redisError(error) });
  }
  take(reply);
  return fixed(prepared, { result: reply });
}

// A pipeline runs in chunks, so a request whose replies grow past its budget stops early. The
// first chunk is FIRST_CHUNK commands; while replies stay small, each chunk is four times the last
// (up to MAX_CHUNK), so a pipeline of 100 takes three round trips to Redis; after large replies,
// one command at a time.
const FIRST_CHUNK = 8;
const MAX_CHUNK = 128;
const SMALL_REPLY = 16 * 1024;

export async function runPipeline(
  conn: IORedis,
  commands: Command[],
  prepare: Prepare,
  take: Take,
): Promise<Slot[]> {
  const slots: Slot[] = [];
  let chunk = FIRST_CHUNK;
  for (
    let start = 0;
    start < commands.length;
    start += chunk, chunk = Math.min(chunk * 4, MAX_CHUNK)
  ) {
    const all = commands.slice(start, start + chunk).map(prepare);
    const pipeline = conn.pipeline();
    for (const prepared of all) {
      if (!("error" in prepared)) pipeline.callBuffer(prepared.name, ...prepared.args);
    }
    const replies = pipeline.length > 0 ? (await pipeline.exec()) ?? [] : [];
    let bytes = 0;
    for (const reply of replies) bytes += take(reply?.[1]);
    if (bytes > SMALL_REPLY * replies.length) chunk = 1; // large replies: one at a time
    let i = 0;
    for (const prepared of all) {
      slots.push("error" in prepared ? prepared : fixed(prepared, fromReply(replies[i++])));
    }
  }
  return slots;
}

export async function runTransaction(
  conn: Connection,
  commands: Command[],
  prepare: Prepare,
  take: Take,
): Promise<Slot[] | Slot> {
  const all = commands.map(prepare);
  const refused = all.find((prepared) => "error" in prepared);
  if (refused) return refused as { error: string };
  const multi = conn.multi();
  for (const prepared of all as Prepared[]) multi.callBuffer(prepared.name, ...prepared.args);
  let replies: [Error | null, unknown][] | null;
  try {
    replies = await multi.exec();
  } catch (error) {
    return { error: redisError(error) };
  }
  if (replies === null) return { error: "EXECABORT Transaction discarded" };
  for (const reply of replies) take(reply[1]);
  return replies.map((reply, i) => fixed(all[i] as Prepared, fromReply(reply)));
}

function fixed({ fix, settle }: Prepared, slot: Slot): Slot {
  settle?.(slot);
  return fix && "result" in slot ? { result: fix(slot.result) } : slot;
}

function fromReply(reply: [Error | null, unknown] | undefined): Slot {
  if (!reply) return { error: "ERR no reply" };
  return reply[0] ? { error: redisError(reply[0]) } : { result: reply[1] };
}

function redisError(error: unknown): string {
  if (error instanceof Error && error.name === "ReplyError") return error.message;
  throw error; // not Redis answering: a transport failure, reported as the whole request failing
}

/** Connections lent to one transaction at a time, so MULTI … EXEC never interleaves. */
export class ExclusivePool {
  #idle: IORedis[];
  #waiting: ((conn: IORedis) => void)[] = [];

  constructor(readonly connections: IORedis[]) {
    this.#idle = [...connections];
  }

  get busy(): number {
    return this.connections.length - this.#idle.length;
  }

  async use<T>(fn: (conn: IORedis) => Promise<T>): Promise<T> {
    const conn = this.#idle.pop() ??
      await new Promise<IORedis>((resolve) => this.#waiting.push(resolve));
    try {
      return await fn(conn);
    } finally {
      const waiter = this.#waiting.shift();
      if (waiter) waiter(conn);
      else this.#idle.push(conn);
    }
  }
}

/** Whether `cluster` became ready within 10 s. */
export function untilReady(cluster: Cluster): Promise<void> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("not ready within 10 s")), 10_000);
    cluster.once("ready", () => (clearTimeout(timer), resolve()));
  });
}
