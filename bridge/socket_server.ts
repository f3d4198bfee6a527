// The HTTP server behind the front: Deno.serve on a Unix socket in a directory of its own. Should it
// still fail (Deno's accept loop gives up on an error such as running out of file descriptors), it
// starts again on the same socket: the bridge never exits for it.

type Handler = (request: Request, info: Deno.ServeHandlerInfo<Deno.Addr>) => Promise<Response>;

/** A running HTTP server on a Unix socket; {@linkcode SocketServer.start} starts one. */
export class SocketServer {
  /** The socket's path, for the front to connect to. */
  readonly path: string;
  readonly #dir: string;
  readonly #handler: Handler;
  #server!: Deno.HttpServer<Deno.UnixAddr>;
  #closing = false;

  /** Listens; throws when it cannot (the first time: later failures only start it again). */
  static async start(handler: Handler): Promise<SocketServer> {
    const server = new SocketServer(
      await Deno.makeTempDir({ prefix: "edgelock-bridge-" }),
      handler,
    );
    server.#listen(true);
    return server;
  }

  private constructor(dir: string, handler: Handler) {
    this.#dir = dir;
    this.path = `${dir}/http.sock`;
    this.#handler = handler;
  }

  /** Stops for good: no new requests; resolves once those in flight are answered. */
  shutdown(): Promise<void> {
    this.#closing = true;
    return this.#server.shutdown();
  }

  /** Removes the socket and its directory. */
  async remove(): Promise<void> {
    await Deno.remove(this.#dir, { recursive: true }).catch(() => {});
  }

  #listen(first = false): void {
    try {
      Deno.removeSync(this.path);
    } catch { /* not there */ }
    try {
      this.#server = Deno.serve({ path: this.path, onListen() {} }, this.#handler);
    } catch (error) {
      if (first) throw error;
      setTimeout(() => this.#listen(), 250); // out of descriptors still: try again shortly
      return;
    }
    this.#server.finished.catch(() => {
      if (!this.#closing) setTimeout(() => this.#listen(), 100);
    });
  }
}
