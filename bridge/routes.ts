// The bridge's routes: `/` (one command), `/pipeline`, `/multi-exec`, the path-style form,
// `/subscribe` and `/psubscribe`, `/healthz`, `/metrics`. Each request is authorized by token, its
// commands checked against the policy, run with bounded replies, and logged without keys or
// arguments.
import type { Tokens } from "./auth.ts";
import type { ByteBudget, Prepare } from "./commands.ts";
import { BridgeMetrics } from "./metrics.ts";
import type { Role } from "./policy.ts";
import type { Pools } from "./pools.ts";
import {
  BadRequest,
  type Command,
  cors,
  decodeSegment,
  fromPath,
  parseBatch,
  parseCommand,
  preflight,
  readJson,
  type Slot,
  toJson,
} from "./protocol.ts";
import type { Kind, Subscriptions } from "./subscriptions.ts";
import type { BridgeOptions, BridgeStats } from "./types.ts";

/** What the routes serve with, made once by `startBridge`. */
export interface RouteContext {
  options: BridgeOptions;
  tokens: Tokens;
  pools: Pools;
  subscriptions: Subscriptions;
  budget: ByteBudget;
  /** A command as Redis will get it, or its refusal, for a token's role. */
  prepareFor(role: Role): Prepare;
  /** The client connections open now, and the most there may be. */
  connections(): { in_use: number; size: number };
}

/** What the metrics and the log will say of a request: never a key or an argument. */
type Seen = { route: string; commands: number; errors: number; command?: string; role?: Role };

/** One request on its way through the routes. */
interface Exchange {
  request: Request;
  info: Deno.ServeHandlerInfo<Deno.Addr>;
  url: URL;
  /** The path without a trailing slash. */
  path: string;
  cors: Record<string, string>;
  /** The request's share of the bytes in flight. */
  share: ReturnType<ByteBudget["open"]>;
  seen: Seen;
}

/** The HTTP server's handler, and what it has served. */
export class Routes {
  readonly stats: BridgeStats = { requests: 0, commands: 0 };
  readonly #context: RouteContext;
  readonly #metrics = new BridgeMetrics();
  readonly #origins: string[];
  readonly #maxBodyBytes: number;
  readonly #maxCommands: number;
  #syncToken = 0;

  constructor(context: RouteContext) {
    this.#context = context;
    this.#origins = context.options.corsOrigins ?? ["*"];
    this.#maxBodyBytes = context.options.maxBodyBytes ?? 1 << 20;
    this.#maxCommands = context.options.maxCommands ?? 1000;
  }

  // Each request is timed, counted in the metrics, and logged (its route, first command's name and
  // status: never a key or an argument).
  /** Answers a request. */
  async handle(request: Request, info: Deno.ServeHandlerInfo<Deno.Addr>): Promise<Response> {
    const started = performance.now();
    const seen: Seen = { route: "", commands: 0, errors: 0 };
    const response = await this.#dispatch(request, info, seen);
    if (!seen.route) return response;
    const record = {
      route: seen.route,
      status: response.status,
      seconds: (performance.now() - started) / 1000,
      commands: seen.commands,
      errors: seen.errors,
    };
    this.#metrics.record(record);
    this.#context.options.log?.({
      time: new Date().toISOString(),
      method: request.method,
      ...record,
      ...(seen.command && { command: seen.command }),
      ...(seen.role && { role: seen.role }),
    });
    return response;
  }

  // The routes no token guards, then the token, then the routes that run commands.
  async #dispatch(
    request: Request,
    info: Deno.ServeHandlerInfo<Deno.Addr>,
    seen: Seen,
  ): Promise<Response> {
    const url = new URL(request.url);
    const path = url.pathname.replace(/\/+$/, "") || "/";
    const corsHeaders = cors(this.#origins, request.headers.get("origin"));
    // A reply's bytes count against the bytes in flight until it has been sent (a client that
    // does not read holds them), JSON's escaping included.
    const share = this.#context.budget.open();
    info.completed.finally(share.done).catch(() => {}); // what it held, once the reply is sent
    const ex: Exchange = { request, info, url, path, cors: corsHeaders, share, seen };
    if (request.method === "OPTIONS") return preflight(request, this.#origins);
    if (path === "/healthz" && request.method === "GET") {
      const ok = await this.#context.pools.pick().ping().then(() => true, () => false);
      return this.#json(ex, ok ? 200 : 503, { ok });
    }
    if (path === "/metrics" && request.method === "GET") return this.#metricsText();
    const sub = /^\/(p?subscribe)\/(.+)$/.exec(url.pathname);
    const batch = path === "/pipeline" || path === "/multi-exec";
    seen.route = sub ? sub[1]! : batch ? path.slice(1) : path === "/" ? "command" : "path";
    const role = this.#context.tokens.roleOf(request, url);
    if (!role) return this.#json(ex, 401, { error: "Unauthorized" });
    seen.role = role;
    if (path === "/__stats" && request.method === "GET") {
      return this.#json(ex, 200, { ...this.stats });
    }
    try {
      if (sub && (request.method === "POST" || request.method === "GET")) {
        return await this.#subscribe(ex, sub[1] as Kind, sub[2]!);
      }
      if (batch || path === "/") {
        if (request.method !== "POST") return this.#json(ex, 405, { error: "Use POST" });
      } else if (request.method !== "POST" && request.method !== "GET") {
        return this.#json(ex, 405, { error: "Use GET or POST" });
      }
      this.stats.requests++;
      const prepare = this.#context.prepareFor(role);
      return batch ? await this.#batch(ex, prepare) : await this.#command(ex, prepare);
    } catch (error) {
      seen.errors = Math.max(seen.errors, 1);
      if (error instanceof BadRequest) {
        return this.#json(ex, error.status, { error: error.message });
      }
      return this.#json(ex, 500, { error: "ERR bridge: Redis did not answer" });
    }
  }

  async #subscribe(ex: Exchange, kind: Kind, segment: string): Promise<Response> {
    this.stats.requests++;
    await ex.request.body?.cancel();
    // Subscribing only reads: either token may. A line break would forge events.
    const name = decodeSegment(segment);
    if (/[\r\n]/.test(name)) throw new BadRequest("ERR a channel name has no line breaks");
    return await this.#context.subscriptions.stream(kind, name, ex.info.completed, ex.cors);
  }

  // `/` (a JSON command) or the path-style form.
  async #command(ex: Exchange, prepare: Prepare): Promise<Response> {
    const { request, url, path, share } = ex;
    const command: Command = path === "/"
      ? parseCommand(await readJson(request, this.#maxBodyBytes, share.body))
      : await fromPath(request, url, this.#maxBodyBytes, share.body);
    this.#count(ex, [command]);
    const slot = encoder(ex)(await this.#context.pools.one(command, prepare, share.take));
    return this.#json(ex, "error" in slot ? 400 : 200, slot);
  }

  // `/pipeline` or `/multi-exec`.
  async #batch(ex: Exchange, prepare: Prepare): Promise<Response> {
    const { request, path, share } = ex;
    const commands = parseBatch(
      await readJson(request, this.#maxBodyBytes, share.body),
      this.#maxCommands,
    );
    this.#count(ex, commands);
    const encode = encoder(ex);
    const pools = this.#context.pools;
    if (path === "/pipeline") {
      const slots = await pools.pipeline(commands, prepare, share.take);
      return this.#json(ex, 200, slots.map(encode));
    }
    const slots = await pools.transaction(commands, prepare, share.take);
    return Array.isArray(slots)
      ? this.#json(ex, 200, slots.map(encode))
      : this.#json(ex, 400, encode(slots));
  }

  #count({ seen }: Exchange, commands: Command[]): void {
    this.stats.commands += commands.length;
    seen.commands = commands.length;
    seen.command = commands[0]![0].toLowerCase();
  }

  // A JSON reply; its bytes count against the request's share (past it: the share's refusal).
  #json({ share, cors }: Exchange, status: number, body: unknown): Response {
    let text = JSON.stringify(body);
    try {
      share.hold(text.length);
    } catch (error) {
      status = (error as BadRequest).status;
      text = JSON.stringify({ error: (error as Error).message });
    }
    return new Response(text, {
      status,
      headers: {
        "content-type": "application/json",
        "upstash-sync-token": String(++this.#syncToken),
        ...cors,
      },
    });
  }

  #metricsText(): Response {
    const { pools, subscriptions, budget } = this.#context;
    return new Response(
      this.#metrics.text({
        ...pools.gauges(),
        subscription: { in_use: subscriptions.open, size: subscriptions.max },
        connection: this.#context.connections(),
        bytes_in_flight: { in_use: budget.used, size: budget.total },
      }),
      { headers: { "content-type": "text/plain; version=0.0.4" } },
    );
  }
}

// A slot as the client gets it: a result as JSON (base64 where the request asked), an error
// counted.
function encoder({ request, seen }: Exchange): (slot: Slot) => Slot {
  const base64 = request.headers.get("upstash-encoding") === "base64";
  return (slot) => {
    if ("error" in slot) seen.errors++;
    return "result" in slot ? { result: toJson(slot.result, base64) } : slot;
  };
}
