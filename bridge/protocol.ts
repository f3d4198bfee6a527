// The Upstash REST protocol's wire side: reading a request (JSON command, batch, path-style),
// encoding RESP2 replies as JSON (base64 where asked), CORS. Wire details: shared/UPSTASH_REST.md.
import { Buffer } from "node:buffer";

export type Arg = string | number | boolean | null;
export type Command = [string, ...Arg[]];
export type Slot = { result: unknown } | { error: string };

/** A refusal with an HTTP status and a message for the client (never Redis's internals). */
export class BadRequest extends Error {
  constructor(message: string, readonly status = 400) {
    super(message);
  }
}

/** The request headers a browser may send: the protocol's own, nothing it does not use. */
const ALLOWED_HEADERS = [
  "authorization",
  "content-type",
  "upstash-encoding",
  "upstash-sync-token",
  "upstash-telemetry-sdk",
  "upstash-telemetry-platform",
  "upstash-telemetry-runtime",
  "upstash-telemetry-retry",
].join(", ");

/** CORS headers for a reply to `origin`, given the allowed origins (`*`: any). */
export function cors(origins: readonly string[], origin: string | null): Record<string, string> {
  const any = origins.includes("*");
  if (!any && (origin === null || !origins.includes(origin))) return {};
  return {
    "access-control-allow-origin": any ? "*" : origin!,
    "access-control-expose-headers": "upstash-sync-token",
    ...(!any && { vary: "origin" }),
  };
}

/** A browser's CORS preflight: the protocol's methods and headers, for an allowed origin. */
export function preflight(request: Request, origins: readonly string[]): Response {
  const headers = cors(origins, request.headers.get("origin"));
  if (Object.keys(headers).length === 0) return new Response(null, { status: 403 });
  return new Response(null, {
    status: 204,
    headers: {
      ...headers,
      "access-control-allow-methods": "GET, POST, OPTIONS",
      "access-control-allow-headers": ALLOWED_HEADERS,
      "access-control-max-age": "86400",
    },
  });
}

/** Decodes a path segment; malformed percent-encoding is the client's error. */
export function decodeSegment(segment: string): string {
  try {
    return decodeURIComponent(segment);
  } catch {
    throw new BadRequest("ERR the path is not valid percent-encoding");
  }
}

// The REST docs' form: `/set/foo/bar?EX=100` is SET foo bar EX 100; a POST body is the last
// argument (`curl -X POST -d value …/set/foo`).
export async function fromPath(
  request: Request,
  url: URL,
  maxBytes: number,
  count: (bytes: number) => void = () => {},
): Promise<Command> {
  const parts = url.pathname.split("/").filter(Boolean).map(decodeSegment);
  const args: string[] = parts.slice(1);
  for (const [key, value] of url.searchParams) {
    if (key !== "_token") args.push(key, ...(value === "" ? [] : [value]));
  }
  if (request.method === "POST") {
    const body = new TextDecoder().decode(await readBody(request, maxBytes, count));
    if (body !== "") args.push(body);
  }
  return [parts[0]!, ...args];
}

/**
 * The body, refused past `maxBytes` bytes (not characters) without reading it all; `count` is
 * told of each chunk as it arrives (and may refuse it by throwing).
 */
export async function readBody(
  request: Request,
  maxBytes: number,
  count: (bytes: number) => void = () => {},
): Promise<Uint8Array> {
  const declared = Number(request.headers.get("content-length") ?? 0);
  const tooLarge = () => new BadRequest(`ERR request body over ${maxBytes} bytes`, 413);
  if (declared > maxBytes) {
    await request.body?.cancel();
    throw tooLarge();
  }
  const chunks: Uint8Array[] = [];
  let size = 0;
  for await (const chunk of request.body ?? []) {
    size += chunk.byteLength;
    if (size > maxBytes) throw tooLarge();
    count(chunk.byteLength);
    chunks.push(chunk);
  }
  const body = new Uint8Array(size);
  let at = 0;
  for (const chunk of chunks) body.set(chunk, (at += chunk.byteLength) - chunk.byteLength);
  return body;
}

export async function readJson(
  request: Request,
  maxBytes: number,
  count: (bytes: number) => void = () => {},
): Promise<unknown> {
  const text = new TextDecoder().decode(await readBody(request, maxBytes, count));
  try {
    return JSON.parse(text);
  } catch {
    throw new BadRequest("ERR request body is not valid JSON");
  }
}

export function parseCommand(value: unknown): Command {
  if (
    !Array.isArray(value) || value.length === 0 || typeof value[0] !== "string" ||
    !value.every((arg) => arg === null || ["string", "number", "boolean"].includes(typeof arg))
  ) {
    throw new BadRequest(
      "ERR a command is a non-empty JSON array of strings, numbers and booleans",
    );
  }
  return value as Command;
}

/** A `/pipeline` or `/multi-exec` body: 1 to `maxCommands` commands. */
export function parseBatch(value: unknown, maxCommands: number): Command[] {
  if (!Array.isArray(value) || value.length === 0) {
    throw new BadRequest("ERR a batch is a non-empty JSON array of commands");
  }
  if (value.length > maxCommands) {
    throw new BadRequest(`ERR a batch takes at most ${maxCommands} commands`, 413);
  }
  return value.map(parseCommand);
}

// ioredis reshapes some replies by lower-case command name (HGETALL into an object); an upper-case
// name passes every reply through raw, as RESP2 gave it.
export function toArgs([name, ...args]: Command): [string, string[]] {
  // Numbers keep their JSON text; booleans and null become the text the client expects back.
  return [name.toUpperCase(), args.map((arg) => String(arg))];
}

/** The bytes a reply holds (its strings' lengths), to bound what one request may hold. */
export function replyBytes(value: unknown): number {
  if (value === null || value === undefined || typeof value === "number") return 8;
  if (Buffer.isBuffer(value) || typeof value === "string") return value.length + 8;
  if (Array.isArray(value)) return value.reduce((sum: number, v) => sum + replyBytes(v), 8);
  return 8;
}

/** RESP2 reply (as ioredis gives it with buffers) → the JSON the Upstash client expects. */
export function toJson(value: unknown, base64: boolean): unknown {
  if (value === null || value === undefined) return null;
  if (typeof value === "number") return value;
  if (Buffer.isBuffer(value)) return base64 ? value.toString("base64") : value.toString("utf8");
  if (typeof value === "string") return base64 ? Buffer.from(value).toString("base64") : value;
  if (Array.isArray(value)) return value.map((item) => toJson(item, base64));
  if (value instanceof Error) return toJson(value.message, base64);
  return String(value);
}
