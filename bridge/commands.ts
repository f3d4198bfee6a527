// Running commands on Redis: one command, a pipeline, a transaction on a connection held for it,
// and a budget that bounds the reply bytes one request (and all requests together) may hold.
import type { Cluster, Redis as IORedis } from "ioredis";
import type { Prepared } from "./key_locking.ts";
import { BadRequest, type Command, replyBytes, type Slot } from "./protocol.ts";

/** A connection of the pool, or the cluster client (which routes each command by its keys' slot). */
export type Connection = IORedis | Cluster;

/** A command as Redis will get it, or the reason it is refused. */
export type Prepare = (command: Command) => Prepared | { error: string };

// Commands that may block their connection: each runs on a connection of its own.
const BLOCKING = new Set([
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
]);

export function isBlocking([name, ...args]: Command): boolean {
  const lower = name.toLowerCase();
  if (BLOCKING.has(lower)) return true;
  return (lower === "xread" || lower === "xreadgroup") &&
    args.some((arg) => String(arg).toLowerCase() === "block");
}

/**
 * Reply bytes in flight: at most `perRequest` for one request and `total` for all at once. A
 * request past either fails as a whole (413, or 503 while others hold the total), and what it
 * held is given back.
 */
export class ReplyBudget {
  #used = 0;
  constructor(readonly perRequest: number, readonly total: number) {}

  get used(): number {
    return this.#used;
  }

  /** A request's share: `take` counts a reply's bytes in, `done` gives them all back. */
  open(): { take(reply: unknown): void; done(): void } {
    let mine = 0;
    return {
      take: (reply) => {
        const bytes = replyBytes(reply);
        mine += bytes;
        this.#used += bytes;
        if (mine > this.perRequest) {
          throw new BadRequest(
            `ERR the reply is over ${this.perRequest} bytes: ask for less in one request`,
            413,
          );
        }
        if (this.#used > this.total) {
          throw new BadRequest("ERR the bridge holds too many large replies: retry shortly", 503);
        }
      },
      done: () => {
        this.#used -= mine;
        mine = 0;
      },
    };
  }
}

type Take = (reply: unknown) => void;

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
    return { error: redisError(error) };
  }
  take(reply);
  return fixed(prepared, { result: reply });
}

// A pipeline runs in chunks, so a request whose replies grow past its budget stops early.
const CHUNK = 64;

export async function runPipeline(
  conn: IORedis,
  commands: Command[],
  prepare: Prepare,
  take: Take,
): Promise<Slot[]> {
  const slots: Slot[] = [];
  for (let start = 0; start < commands.length; start += CHUNK) {
    const all = commands.slice(start, start + CHUNK).map(prepare);
    const pipeline = conn.pipeline();
    for (const prepared of all) {
      if (!("error" in prepared)) pipeline.callBuffer(prepared.name, ...prepared.args);
    }
    const replies = pipeline.length > 0 ? (await pipeline.exec()) ?? [] : [];
    for (const reply of replies) take(reply?.[1]);
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

function fixed({ fix }: Prepared, slot: Slot): Slot {
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
