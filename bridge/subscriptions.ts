// Pub/sub as Upstash streams it (server-sent events): `data: subscribe,<channel>,<count>`, then
// `data: message,<channel>,<payload>` (`pmessage,<pattern>,<channel>,<payload>`), raw text. A
// payload with a newline arrives as several messages: the protocol has no escaping. Each stream
// holds a Redis connection of its own, at most `max` at once.
import type { Redis as IORedis } from "ioredis";
import { BadRequest } from "./protocol.ts";

export type Kind = "subscribe" | "psubscribe";

/** The bytes a stream may queue for a client that does not read; past them it is closed. */
export const MAX_QUEUED_BYTES = 256 * 1024;

/** The open streams, each with its own connection. */
export class Subscriptions {
  readonly #streams = new Set<() => void>();

  constructor(
    readonly max: number,
    readonly heartbeatMs: number,
    readonly connect: () => IORedis,
  ) {}

  get open(): number {
    return this.#streams.size;
  }

  /** Ends every stream (on close: a stream never finishes by itself). */
  endAll(): void {
    [...this.#streams].forEach((end) => end());
  }

  /** A stream of `name`'s messages until the client goes (`done`) or the bridge closes. */
  async stream(
    kind: Kind,
    name: string,
    done: Promise<void>,
    headers: Record<string, string>,
  ): Promise<Response> {
    const streams = this.#streams;
    if (streams.size >= this.max) {
      throw new BadRequest(`ERR too many subscriptions open (at most ${this.max})`, 503);
    }
    const conn = this.connect();
    let end = () => conn.disconnect();
    streams.add(end);
    const heartbeatMs = this.heartbeatMs;
    try {
      await conn.connect();
      const count = await conn[kind](name);
      const encoder = new TextEncoder();
      const body = new ReadableStream<Uint8Array>({
        start(controller) {
          // A reader that falls this far behind is cut off, as Redis cuts off a slow subscriber.
          // Messages may still arrive after the stream ended (the connection closes later): they
          // are dropped, never enqueued on a closed stream (which would throw, uncaught).
          let open = true;
          const send = (text: string) => {
            if (!open) return;
            try {
              controller.enqueue(encoder.encode(text));
            } catch {
              return end(); // the client went away
            }
            if ((controller.desiredSize ?? 0) < -MAX_QUEUED_BYTES) end();
          };
          const heartbeat = setInterval(() => send(": ping\n\n"), heartbeatMs);
          streams.delete(end);
          end = () => {
            open = false;
            if (!streams.delete(end)) return;
            clearInterval(heartbeat);
            conn.disconnect();
            try {
              controller.close();
            } catch { /* the client went first */ }
          };
          streams.add(end);
          send(`data: ${kind},${name},${count}\n\n`);
          conn.on("message", (channel: string, message: string) => {
            send(`data: message,${channel},${message}\n\n`);
          });
          conn.on("pmessage", (pattern: string, channel: string, message: string) => {
            send(`data: pmessage,${pattern},${channel},${message}\n\n`);
          });
          conn.on("end", () => end());
          done.finally(() => end()).catch(() => {}); // the client went away
        },
        cancel: () => end(),
      }, { highWaterMark: 0, size: (chunk) => chunk.byteLength });
      return new Response(body, {
        headers: { "content-type": "text/event-stream", "cache-control": "no-cache", ...headers },
      });
    } catch (error) {
      end();
      streams.delete(end);
      throw error;
    }
  }
}
