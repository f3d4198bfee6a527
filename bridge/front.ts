// The bridge's front door: it owns the listening socket and every client connection, so what a
// client sends can never exhaust the bridge. Deno.serve has no header or idle timeouts and no cap
// on connections, so the front accepts (and terminates TLS), applies them, and passes each
// connection's bytes to the HTTP server on a Unix socket.
//
// - At most `maxConnections` at once; at the cap, a new connection evicts the oldest one that has
//   not yet sent a whole request head (a slow or idle stranger), else it is closed at once.
// - A request head must arrive whole within `headerTimeoutMs` of its first byte (of the
//   connection's opening, for the first), and be at most 16 KiB.
// - A connection with nothing in flight and no byte either way for `idleTimeoutMs` is closed.
// - Accept errors (too many open files, say) pause accepting briefly; they never end the bridge.

/** Options for {@linkcode startFront}. */
export interface FrontOptions {
  hostname: string;
  port: number;
  cert?: string;
  key?: string;
  /** The Unix socket of the HTTP server behind the front. */
  target: string;
  maxConnections: number;
  headerTimeoutMs: number;
  idleTimeoutMs: number;
  /** A request declaring a larger body is answered 413 here, its body never read. */
  maxBodyBytes: number;
}

/** A running front. */
export interface Front {
  port: number;
  /** Connections open now. */
  open(): number;
  /** Connections closed by a limit since the start, by reason. */
  closed(): Record<"evicted" | "refused" | "header_timeout" | "idle", number>;
  /** Stops accepting; open connections go on. */
  stop(): Promise<void>;
  /**
   * Stops accepting, lets connections whose server side has ended pass on their last bytes for up
   * to `graceMs`, then closes every connection.
   */
  close(graceMs?: number): Promise<void>;
}

const MAX_HEAD_BYTES = 16 * 1024;
const CRLF2 = [13, 10, 13, 10];

interface Client {
  conn: Deno.Conn;
  upstream?: Deno.Conn;
  openedAt: number;
  lastByteAt: number;
  /** A whole request head arrived at least once. */
  proven: boolean;
  /** When the current head's first byte came (or the connection opened), while in a head. */
  headSince?: number;
  /** A request is in flight: its head came and no response byte yet. */
  pending: boolean;
  close(): void;
}

/** Starts the front; resolves once it listens. */
export function startFront(options: FrontOptions): Front {
  const listener = options.cert && options.key
    ? Deno.listenTls({
      hostname: options.hostname,
      port: options.port,
      cert: options.cert,
      key: options.key,
    })
    : Deno.listen({ hostname: options.hostname, port: options.port });
  const clients = new Set<Client>();
  const closed = { evicted: 0, refused: 0, header_timeout: 0, idle: 0 };
  let stopping = false;

  const sweep = setInterval(() => {
    const now = performance.now();
    for (const client of clients) {
      if (client.headSince !== undefined && now - client.headSince > options.headerTimeoutMs) {
        closed.header_timeout++;
        client.close();
      } else if (
        !client.pending && client.headSince === undefined &&
        now - client.lastByteAt > options.idleTimeoutMs
      ) {
        closed.idle++;
        client.close();
      }
    }
  }, Math.max(50, Math.min(1000, options.headerTimeoutMs / 4, options.idleTimeoutMs / 4)));

  const accepting = (async () => {
    while (!stopping) {
      let conn: Deno.Conn;
      try {
        conn = await listener.accept();
      } catch (error) {
        if (stopping || error instanceof Deno.errors.BadResource) return;
        await new Promise((resolve) => setTimeout(resolve, 100)); // e.g. out of file descriptors
        continue;
      }
      if (clients.size >= options.maxConnections) {
        const stranger = [...clients].find((client) => !client.proven);
        if (stranger) {
          closed.evicted++;
          stranger.close();
        } else {
          closed.refused++;
          try {
            conn.close();
          } catch { /* already gone */ }
          continue;
        }
      }
      serve(conn);
    }
  })();

  function serve(conn: Deno.Conn): void {
    const now = performance.now();
    let done = false;
    const client: Client = {
      conn,
      openedAt: now,
      lastByteAt: now,
      proven: false,
      headSince: now,
      pending: false,
      close() {
        if (done) return;
        done = true;
        clients.delete(client);
        for (const c of [client.conn, client.upstream]) {
          try {
            c?.close();
          } catch { /* already closed */ }
        }
      },
    };
    clients.add(client);
    (async () => {
      try {
        await inbound(client);
      } catch {
        // a reset, a TLS failure, a closed socket: this connection only
      } finally {
        client.close();
      }
    })();
  }

  // The server side of a connection, made once its first request head is whole: a stranger that
  // never sends one costs one socket, not three. Either side ending ends the connection (a client
  // gone mid-stream frees its stream).
  async function connectUpstream(client: Client, ended: () => void): Promise<Deno.Conn> {
    const upstream = await Deno.connect({ transport: "unix", path: options.target });
    client.upstream = upstream;
    outbound(client).catch(() => {}).finally(ended);
    return upstream;
  }

  // Client to server, watching request heads (and skipping bodies by Content-Length); bytes wait
  // here until the first head is whole and the server side is connected.
  async function inbound(client: Client): Promise<void> {
    const buffer = new Uint8Array(64 * 1024);
    const early: Uint8Array[] = [];
    let upstream: Deno.Conn | undefined;
    let over = false;
    const ended = () => {
      over = true;
      client.close();
    };
    let head: number[] = []; // the current head's bytes, up to MAX_HEAD_BYTES
    let matched = 0; // how much of CRLF CRLF ends the bytes seen
    let body = 0; // body bytes still to come
    let opaque = false; // chunked or an upgrade: no more head tracking
    while (!over) {
      const n = await client.conn.read(buffer);
      if (n === null) return;
      client.lastByteAt = performance.now();
      const chunk = buffer.subarray(0, n);
      for (let i = 0; i < n && !opaque; i++) {
        if (body > 0) {
          const skip = Math.min(body, n - i);
          body -= skip;
          i += skip - 1;
          continue;
        }
        client.headSince ??= client.lastByteAt;
        if (head.length < MAX_HEAD_BYTES) head.push(chunk[i]!);
        else throw new Error("request head too large");
        matched = chunk[i] === CRLF2[matched] ? matched + 1 : chunk[i] === 13 ? 1 : 0;
        if (matched === 4) {
          const text = new TextDecoder().decode(new Uint8Array(head)).toLowerCase();
          body = Number(/\r\ncontent-length:\s*(\d+)/.exec(text)?.[1] ?? 0);
          if (body > options.maxBodyBytes) return await tooLarge(client);
          opaque = /\r\ntransfer-encoding:|\r\nupgrade:/.test(text);
          client.proven = true;
          client.pending = true;
          client.headSince = undefined;
          head = [];
          matched = 0;
        }
      }
      if (upstream) {
        await writeAll(upstream, chunk);
        continue;
      }
      early.push(chunk.slice());
      if (client.proven) {
        upstream = await connectUpstream(client, ended);
        for (const bytes of early.splice(0)) await writeAll(upstream, bytes);
      }
    }
  }

  async function outbound(client: Client): Promise<void> {
    const buffer = new Uint8Array(64 * 1024);
    for (;;) {
      const n = await client.upstream!.read(buffer);
      if (n === null) return;
      client.lastByteAt = performance.now();
      client.pending = false;
      await writeAll(client.conn, buffer.subarray(0, n));
    }
  }

  const addr = listener.addr as Deno.NetAddr;
  return {
    port: addr.port,
    open: () => clients.size,
    closed: () => ({ ...closed }),
    async stop() {
      stopping = true;
      try {
        listener.close();
      } catch { /* closed */ }
      await accepting;
    },
    async close(graceMs = 1000) {
      await this.stop();
      const deadline = performance.now() + graceMs;
      while (clients.size > 0 && performance.now() < deadline) {
        await new Promise((resolve) => setTimeout(resolve, 10));
      }
      clearInterval(sweep);
      for (const client of [...clients]) client.close();
    },
  };
}

// The reply to a body over the limit, sent before any of it is read; the connection then ends.
const TOO_LARGE = new TextEncoder().encode(
  "HTTP/1.1 413 Payload Too Large\r\ncontent-type: application/json\r\nconnection: close\r\n" +
    'content-length: 39\r\n\r\n{"error":"ERR request body too large"}\n',
);

async function tooLarge(client: { conn: Deno.Conn }): Promise<void> {
  await writeAll(client.conn, TOO_LARGE).catch(() => {});
}

async function writeAll(conn: Deno.Conn, bytes: Uint8Array): Promise<void> {
  let at = 0;
  while (at < bytes.length) at += await conn.write(bytes.subarray(at));
}
