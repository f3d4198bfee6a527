// The bridge's front door: it owns the listening socket and every client connection, so what a
// client sends can never exhaust the bridge. Deno.serve has no header or idle timeouts and no cap
// on connections, so the front accepts (and terminates TLS), applies them, and passes each
// connection's bytes to the HTTP server on a Unix socket.
//
// - At most `maxConnections` at once. At the cap a new connection evicts, oldest first, a
//   stranger (no whole request head yet), else a connection no token vouches for (its requests
//   carried none, or were answered 401), else it is closed at once.
// - A request (head, then its Content-Length of body) must arrive whole within `headerTimeoutMs`
//   of its first byte; a head is at most 16 KiB; a chunked or upgrading request is refused (411).
// - A connection with no request in flight and no byte either way for `idleTimeoutMs` is closed.
// - The server side of a connection is made only once its first request head is whole.
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

/** Starts the front; resolves once it listens. */
export function startFront(options: FrontOptions): Front {
  return new FrontDoor(options);
}

// The listener, the clients and the sweep of late and idle ones; a client's bytes go both ways
// in `inbound` and `outbound` below.
class FrontDoor implements Front {
  readonly port: number;
  readonly #options: FrontOptions;
  readonly #listener: Deno.Listener;
  readonly #clients = new Set<Client>();
  readonly #sweep: ReturnType<typeof setInterval>;
  readonly #accepting: Promise<void>;
  #stopping = false;

  constructor(options: FrontOptions) {
    this.#options = options;
    this.#listener = options.cert && options.key
      ? Deno.listenTls({
        hostname: options.hostname,
        port: options.port,
        cert: options.cert,
        key: options.key,
      })
      : Deno.listen({ hostname: options.hostname, port: options.port });
    this.port = (this.#listener.addr as Deno.NetAddr).port;
    this.#sweep = setInterval(
      () => this.#closeLate(),
      Math.max(50, Math.min(1000, options.headerTimeoutMs / 4, options.idleTimeoutMs / 4)),
    );
    this.#accepting = this.#accept();
  }

  open(): number {
    return this.#clients.size;
  }

  async stop(): Promise<void> {
    this.#stopping = true;
    try {
      this.#listener.close();
    } catch { /* closed */ }
    await this.#accepting;
  }

  async close(graceMs = 1000): Promise<void> {
    await this.stop();
    const deadline = performance.now() + graceMs;
    while (this.#clients.size > 0 && performance.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    clearInterval(this.#sweep);
    for (const client of [...this.#clients]) client.close();
  }

  // A request not whole within headerTimeoutMs of its first byte, or a connection idle for
  // idleTimeoutMs, is closed.
  #closeLate(): void {
    const now = performance.now();
    for (const client of this.#clients) {
      if (
        client.requestSince !== undefined &&
        now - client.requestSince > this.#options.headerTimeoutMs
      ) {
        client.close();
      } else if (
        !client.pending && client.requestSince === undefined &&
        now - client.lastByteAt > this.#options.idleTimeoutMs
      ) {
        client.close();
      }
    }
  }

  async #accept(): Promise<void> {
    while (!this.#stopping) {
      let conn: Deno.Conn;
      try {
        conn = await this.#listener.accept();
      } catch (error) {
        if (this.#stopping || error instanceof Deno.errors.BadResource) return;
        await new Promise((resolve) => setTimeout(resolve, 100)); // e.g. out of file descriptors
        continue;
      }
      if (this.#clients.size >= this.#options.maxConnections && !this.#evict()) {
        try {
          conn.close();
        } catch { /* already gone */ }
        continue;
      }
      this.#serve(conn);
    }
  }

  // At the cap: closes a stranger, else a connection no token vouches for; false if none.
  #evict(): boolean {
    const clients = [...this.#clients];
    const stranger = clients.find((client) => !client.proven) ??
      clients.find((client) => !client.vouched);
    stranger?.close();
    return stranger !== undefined;
  }

  #serve(conn: Deno.Conn): void {
    const client = new Client(conn, this.#clients);
    (async () => {
      try {
        await inbound(client, this.#options);
      } catch {
        // a reset, a TLS failure, a closed socket: this connection only
      } finally {
        client.close();
      }
    })();
  }
}

// A client connection, and its server side once it has one.
class Client {
  upstream?: Deno.Conn;
  lastByteAt: number;
  /** A whole request head arrived at least once. */
  proven = false;
  /** Its last request carried a token, and its last response was not a 401. */
  vouched = false;
  /** When the current request's first byte came (or the connection opened), until it is whole. */
  requestSince?: number;
  /** A whole request is with the server and no response byte came yet. */
  pending = false;
  /** The next response's status line is still to come. */
  awaitingStatus = false;
  #done = false;

  constructor(readonly conn: Deno.Conn, readonly clients: Set<Client>) {
    this.lastByteAt = this.requestSince = performance.now();
    clients.add(this);
  }

  close(): void {
    if (this.#done) return;
    this.#done = true;
    this.clients.delete(this);
    for (const c of [this.conn, this.upstream]) {
      try {
        c?.close();
      } catch { /* already closed */ }
    }
  }
}

// The server side of a connection, made once its first request head is whole: a stranger that
// never sends one costs one socket, not three. Either side ending ends the connection (a client
// gone mid-stream frees its stream).
async function connectUpstream(
  client: Client,
  target: string,
  ended: () => void,
): Promise<Deno.Conn> {
  const upstream = await Deno.connect({ transport: "unix", path: target });
  client.upstream = upstream;
  outbound(client).catch(() => {}).finally(ended);
  return upstream;
}

// Client to server, watching requests (`frame`); bytes wait here until the first head is whole
// and the server side is connected.
async function inbound(client: Client, options: FrontOptions): Promise<void> {
  const buffer = new Uint8Array(16 * 1024);
  const early: Uint8Array[] = [];
  let over = false;
  const ended = () => {
    over = true;
    client.close();
  };
  const framing: Framing = { head: [], matched: 0, body: 0 };
  while (!over) {
    const n = await client.conn.read(buffer);
    if (n === null) return;
    client.lastByteAt = performance.now();
    const chunk = buffer.subarray(0, n);
    const refusal = frame(client, framing, chunk, options.maxBodyBytes);
    if (refusal) return await refuse(client, refusal);
    if (client.upstream) {
      await writeAll(client.upstream, chunk);
      continue;
    }
    early.push(chunk.slice());
    if (client.proven) {
      const upstream = await connectUpstream(client, options.target, ended);
      for (const bytes of early.splice(0)) await writeAll(upstream, bytes);
    }
  }
}

/** Where a connection's bytes stand in its current request. */
interface Framing {
  /** The current head's bytes, up to MAX_HEAD_BYTES. */
  head: number[];
  /** How much of CRLF CRLF ends the bytes seen. */
  matched: number;
  /** Body bytes still to come. */
  body: number;
}

// Follows each request through `chunk`: its head, then its Content-Length of body. Returns the
// reply that refuses the request (and ends the connection), if one is refused.
function frame(
  client: Client,
  framing: Framing,
  chunk: Uint8Array,
  maxBodyBytes: number,
): Uint8Array | undefined {
  for (let i = 0; i < chunk.length; i++) {
    if (framing.body > 0) {
      const skip = Math.min(framing.body, chunk.length - i);
      framing.body -= skip;
      i += skip - 1;
      if (framing.body === 0) requestWhole(client);
      continue;
    }
    client.requestSince ??= client.lastByteAt;
    if (framing.head.length >= MAX_HEAD_BYTES) throw new Error("request head too large");
    framing.head.push(chunk[i]!);
    const matched = framing.matched;
    framing.matched = chunk[i] === CRLF2[matched] ? matched + 1 : chunk[i] === 13 ? 1 : 0;
    if (framing.matched < 4) continue;
    const text = new TextDecoder().decode(new Uint8Array(framing.head)).toLowerCase();
    framing.head = [];
    framing.matched = 0;
    if (/\r\ntransfer-encoding:|\r\nupgrade:/.test(text)) return LENGTH_REQUIRED;
    framing.body = Number(/\r\ncontent-length:\s*(\d+)/.exec(text)?.[1] ?? 0);
    if (framing.body > maxBodyBytes) return TOO_LARGE;
    client.proven = true;
    client.vouched = /\r\nauthorization:|^[^\r]*[?&]_token=/.test(text);
    client.awaitingStatus = true;
    if (framing.body === 0) requestWhole(client);
  }
  return undefined;
}

function requestWhole(client: Client): void {
  client.requestSince = undefined;
  client.pending = true;
}

async function outbound(client: Client): Promise<void> {
  const buffer = new Uint8Array(16 * 1024);
  for (;;) {
    const n = await client.upstream!.read(buffer);
    if (n === null) return;
    client.lastByteAt = performance.now();
    client.pending = false;
    if (client.awaitingStatus) {
      // `HTTP/1.1 401 …`: a request no token vouched for.
      client.awaitingStatus = false;
      if (n >= 12 && buffer[9] === 52 && buffer[10] === 48 && buffer[11] === 49) {
        client.vouched = false;
      }
    }
    await writeAll(client.conn, buffer.subarray(0, n));
  }
}

// Replies the front sends itself, before reading a body; the connection then ends.
function reply(status: string, error: string): Uint8Array {
  const body = JSON.stringify({ error }) + "\n";
  return new TextEncoder().encode(
    `HTTP/1.1 ${status}\r\ncontent-type: application/json\r\nconnection: close\r\n` +
      `content-length: ${body.length}\r\n\r\n${body}`,
  );
}
const TOO_LARGE = reply("413 Payload Too Large", "ERR request body too large");
const LENGTH_REQUIRED = reply(
  "411 Length Required",
  "ERR send the body with a Content-Length (no chunked transfer, no upgrade)",
);

async function refuse(client: { conn: Deno.Conn }, bytes: Uint8Array): Promise<void> {
  await writeAll(client.conn, bytes).catch(() => {});
}

async function writeAll(conn: Deno.Conn, bytes: Uint8Array): Promise<void> {
  let at = 0;
  while (at < bytes.length) at += await conn.write(bytes.subarray(at));
}
