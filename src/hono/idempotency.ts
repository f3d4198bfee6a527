import type { Context, MiddlewareHandler } from "hono";
import { backoffDelay, sleep } from "../core/_backoff.ts";
import {
  checkDuration,
  checkOptions as checkNames,
  DEFAULT_LEASE_MS,
  DEFAULT_RETENTION_MS,
} from "../core/_validate.ts";
import { sha256Hex } from "../core/_crypto.ts";
import {
  checkStore,
  type PerRequest,
  perRequest,
  problem,
  storeFactory,
  unavailable,
} from "./_problem.ts";
import { MAX_RESPONSE_BYTES, recordId, type RecordStore, safeName } from "../uses/records.ts";
import { runClaimed } from "./_claim.ts";
import { InvalidType } from "../core/_invalid.ts";

/** Options for {@linkcode idempotency}. */
export interface IdempotencyOptions {
  /**
   * Where claims and stored responses live: a store, or a function that makes it per request
   * (on Workers, from `c.env`: `(c) => new Records(Redis.fromEnv(c.env))`).
   */
  records: PerRequest<RecordStore>;
  /** Whose key space a request uses, typically the signed-in user's id. */
  scope: (c: Context) => string | Promise<string>;
  /** Reject requests without an `Idempotency-Key` (400). Else they pass through. @default true */
  required?: boolean;
  /** Request headers that are part of the payload fingerprint, besides method, path and body. */
  fingerprintHeaders?: readonly string[];
  /** How long a claim lasts if the handler's instance dies, ms (renewed while it runs). @default 30000 */
  leaseMs?: number;
  /** How long a stored response is replayed, ms. @default 86400000 (a day) */
  retentionMs?: number;
  /** Wait this long for an in-flight first request, then replay it; 0 answers 409 at once. @default 0 */
  waitMs?: number;
  /** Response headers stored and replayed. `Set-Cookie` never is. */
  replayHeaders?: readonly string[];
}

/** A stored response (a type, not an interface, so it is a record the store takes). */
type StoredResponse = {
  status: number;
  headers: Record<string, string>;
  /** The body, base64; absent when it was larger than the store takes (then `omitted`). */
  body?: string;
  /** The body was too large to keep: a replay has status and headers only, and says so. */
  omitted?: true;
};

const DEFAULT_REPLAY_HEADERS = ["content-type", "content-language", "location", "etag"];
// Statuses a retry could change: not stored, the claim is released instead.
const TRANSIENT = new Set([408, 409, 425, 429]);
const SAFE_METHODS = new Set(["GET", "HEAD", "OPTIONS"]);

/**
 * Hono middleware that makes an unsafe route idempotent, after the IETF Idempotency-Key draft.
 * The first request with a key runs the handler; a retry with the same key and payload gets the
 * stored status, body and allow-listed headers with `Idempotent-Replayed: true`. 400 when a
 * required key is missing or malformed; 409 with `Retry-After` while the first request is in
 * flight; 422 when the key is reused with another payload; 503 when Redis is unreachable (never
 * a silent pass-through). 2xx and deterministic 4xx replies are stored; a 5xx or a thrown error
 * releases the claim, so a retry may redo the work.
 *
 * @example
 * ```ts
 * import { Hono } from "hono";
 * import { Redis } from "@upstash/redis";
 * import { Records } from "@edgelock/edgelock/uses";
 * import { idempotency } from "@edgelock/edgelock/hono";
 *
 * const records = new Records(Redis.fromEnv());
 * const app = new Hono();
 * app.post(
 *   "/orders",
 *   idempotency({ records, scope: (c) => c.req.header("x-user-id") ?? "anonymous" }),
 *   (c) => c.json({ orderId: crypto.randomUUID() }, 201),
 * );
 * ```
 */
export function idempotency(options: IdempotencyOptions): MiddlewareHandler {
  checkNames(options, IDEMPOTENCY_OPTIONS, "idempotency()");
  const settings = checkOptions(options);
  return async function idempotencyMiddleware(c, next) {
    if (SAFE_METHODS.has(c.req.method)) return next();
    const key = keyOf(c.req.header("idempotency-key"), settings.required);
    if (key === undefined) return next();
    if (key instanceof Response) return key;
    const records = perRequest(
      settings.records,
      c,
      "idempotency's records setting",
      checkStore("idempotency"),
    );
    if (records instanceof Response) return records;
    const request = await identify(c, settings, key);
    if (request instanceof Response) return request;
    try {
      return await claimAndRun(c, next, { ...settings, records }, request);
    } catch (error) {
      const reply = unavailable(error, "idempotency");
      if (reply) return reply;
      throw error;
    }
  };
}

const IDEMPOTENCY_OPTIONS = [
  "records",
  "scope",
  "required",
  "fingerprintHeaders",
  "leaseMs",
  "retentionMs",
  "waitMs",
  "replayHeaders",
] as const;

/** The options, checked, with their defaults. */
interface Settings<R = (c: Context) => unknown> {
  records: R;
  scope: IdempotencyOptions["scope"];
  required: boolean;
  fingerprintHeaders: readonly string[];
  leaseMs: number;
  retentionMs: number;
  waitMs: number;
  /** The lower-case response headers a stored reply keeps. */
  kept: readonly string[];
}

/** A request's record id (its scope and a hash of method, path and key) and its fingerprint. */
interface Identity {
  id: string;
  fingerprint: string;
}

function checkOptions(options: IdempotencyOptions): Settings {
  const {
    records,
    scope,
    required = true,
    fingerprintHeaders = [],
    leaseMs = DEFAULT_LEASE_MS,
    retentionMs = DEFAULT_RETENTION_MS,
    waitMs = 0,
    replayHeaders = DEFAULT_REPLAY_HEADERS,
  } = options ?? {};
  if (typeof scope !== "function") throw new InvalidType("idempotency needs a scope function");
  checkDuration(leaseMs, "leaseMs", 0);
  checkDuration(retentionMs, "retentionMs", 0);
  checkDuration(waitMs, "waitMs", 0);
  checkHeaderNames(fingerprintHeaders, "fingerprintHeaders");
  checkHeaderNames(replayHeaders, "replayHeaders");
  const kept = replayHeaders.map((h) => h.toLowerCase()).filter((h) => h !== "set-cookie");
  return {
    records: storeFactory(records, "idempotency"),
    scope,
    required,
    fingerprintHeaders,
    leaseMs,
    retentionMs,
    waitMs,
    kept,
  };
}

// Header names, checked when the middleware is built: `Headers` throws on a bad one, and would
// after the handler ran, leaving its reply unstored.
function checkHeaderNames(names: unknown, option: string): void {
  if (!Array.isArray(names)) throw new InvalidType(`${option} must be an array of header names`);
  for (const name of names) {
    if (typeof name !== "string" || !/^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/.test(name)) {
      throw new InvalidType(`${option} holds ${JSON.stringify(name)}, which is no header name`);
    }
  }
}

// The Idempotency-Key: the key, a 400 when it is missing but required or malformed, or
// undefined when it is missing and the request may pass through.
function keyOf(header: string | undefined, required: boolean): string | Response | undefined {
  if (header === undefined) {
    if (!required) return undefined;
    return problem(400, "invalid_request", "This route needs an Idempotency-Key header");
  }
  return parseKey(header) ?? problem(
    400,
    "invalid_request",
    'Idempotency-Key must be one string of 1–255 printable ASCII characters, without ", "',
  );
}

// The request's identity, or a 400 when the app's scope() gives nothing to key by.
async function identify(
  c: Context,
  { scope, fingerprintHeaders }: Settings,
  key: string,
): Promise<Identity | Response> {
  const scoped = await scope(c);
  if (typeof scoped !== "string" || scoped === "") {
    // The app's scope() gave nothing to key by (an anonymous caller, say): a clear refusal.
    return problem(
      400,
      "invalid_request",
      "This request has no idempotency scope (the app's scope() returned no non-empty string)",
    );
  }
  const fingerprint = await fingerprintOf(c, fingerprintHeaders);
  const id = recordId(
    await safeName(scoped, "scope"),
    // JSON, so no path or key (both may hold spaces) can spell another's pair
    `#${await sha256Hex(JSON.stringify([c.req.method, c.req.path, key]))}`,
  );
  return { id, fingerprint };
}

// Claims the key and runs the handler once claimed; else a replay of the stored reply, a 422
// for another payload, or a 409 while the first request is in flight (after waiting `waitMs`).
async function claimAndRun(
  c: Context,
  next: () => Promise<void>,
  settings: Settings<RecordStore>,
  { id, fingerprint }: Identity,
): Promise<Response | undefined> {
  const { records, leaseMs, retentionMs, waitMs } = settings;
  const deadline = performance.now() + waitMs;
  for (let attempt = 0;; attempt++) {
    const claim = await records.claim("idempotency", id, { leaseMs, retentionMs, fingerprint });
    if (claim.state === "mismatch") {
      return problem(
        422,
        "fingerprint_mismatch",
        "This Idempotency-Key was used with another payload",
      );
    }
    if (claim.state === "completed") return replay(claim.response as StoredResponse | undefined);
    if (claim.state === "in_progress") {
      const left = deadline - performance.now();
      if (left <= 0) return inFlight(claim.retryAfterMs);
      await sleep(backoffDelay(attempt, Math.min(left, claim.retryAfterMs)));
      continue;
    }
    await runFirst(c, next, settings, id, claim.token);
    return undefined;
  }
}

function inFlight(retryAfterMs: number): Response {
  return problem(409, "in_progress", "The first request with this key is in flight", {
    headers: { "retry-after": String(Math.max(1, Math.ceil(retryAfterMs / 1000))) },
  });
}

// The first request: the handler runs under the claim, then its reply is stored, or the claim
// released when a retry could get another reply.
async function runFirst(
  c: Context,
  next: () => Promise<void>,
  settings: Settings<RecordStore>,
  id: string,
  token: string,
) {
  const { records, kept } = settings;
  // The reply is read for the store under the claim too: one streamed for longer than leaseMs
  // keeps it, where a lapsed claim would let a retry run the handler again.
  let stored: StoredResponse | undefined;
  await runClaimed({
    what: "idempotency claim",
    leaseMs: settings.leaseMs,
    grantedAt: performance.now(),
    renew: async () => (await records.renew("idempotency", id, token, settings.leaseMs)).renewed,
    release: () => release(records, id, token),
  }, async () => {
    await next();
    const res = c.res;
    if (c.error || res.status >= 500 || TRANSIENT.has(res.status)) return;
    stored = await toStored(res, kept, settings.leaseMs);
  });
  if (stored === undefined) await release(records, id, token);
  else await records.complete("idempotency", id, token, stored);
}

// Frees the claim so a retry may redo the work; a failure to free it only delays that retry.
async function release(records: RecordStore, id: string, token: string): Promise<void> {
  await records.release("idempotency", id, token).catch(() => false);
}

// The reply as stored: its status, the kept headers and the body. Kept whole when all of it fits
// the store; else marked omitted, without its body, and with the kept headers that fit, in the
// allow-list's order (one too long for the store, a signed `Location` say, is left out rather
// than the reply left unstored, which would run the handler again). So is a body that fails as
// it is read (a stream that errors, a body used already), or that `bodyOf` stops reading.
async function toStored(
  res: Response,
  kept: readonly string[],
  withinMs: number,
): Promise<StoredResponse> {
  const fits = (value: StoredResponse) =>
    new TextEncoder().encode(JSON.stringify(value)).length <= MAX_RESPONSE_BYTES;
  const headers: Record<string, string> = {};
  // A body stored as sent (compress() inside the middleware, a gzipped file) replays with its
  // encoding, allow-listed or not.
  for (const name of [...kept, "content-encoding"]) {
    const value = res.headers.get(name);
    if (value !== null) headers[name] = value;
  }
  const bytes = await bodyOf(res, withinMs);
  const body = bytes && toBase64(bytes);
  const whole = { status: res.status, headers, body };
  if (body !== undefined && fits(whole)) return whole;
  const stored: StoredResponse = { status: res.status, headers: {}, omitted: true };
  for (const [name, value] of Object.entries(headers)) {
    stored.headers[name] = value;
    if (!fits(stored)) delete stored.headers[name];
  }
  return stored;
}

// The body, read from a copy for the store: at most the store's size and for at most `withinMs`
// (the claim's lease), else undefined, as for a body that fails. A stream that goes on (server-
// sent events, a slow export) would otherwise hold the reply back, and the claim, for ever.
async function bodyOf(res: Response, withinMs: number): Promise<Uint8Array | undefined> {
  if (/^text\/event-stream/i.test(res.headers.get("content-type") ?? "")) return undefined;
  let reader: ReadableStreamDefaultReader<unknown>;
  try {
    const body = res.clone().body;
    if (body === null) return new Uint8Array();
    reader = body.getReader();
  } catch {
    return undefined; // a body used already
  }
  const chunks: Uint8Array[] = [];
  let size = 0;
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<"late">((resolve) =>
    timer = setTimeout(() => resolve("late"), withinMs)
  );
  try {
    for (;;) {
      const next = await Promise.race([reader.read(), late]);
      if (next === "late") return undefined;
      if (next.done) break;
      // Bytes as a runtime sends them (workerd: any ArrayBuffer or view); anything else (a
      // string a handler enqueued) is no body the caller got either: not stored.
      const { value } = next;
      const chunk = value instanceof ArrayBuffer
        ? new Uint8Array(value)
        : ArrayBuffer.isView(value)
        ? new Uint8Array(value.buffer, value.byteOffset, value.byteLength)
        : undefined;
      if (chunk === undefined) return undefined;
      size += chunk.length;
      if (size > MAX_RESPONSE_BYTES) return undefined;
      chunks.push(chunk);
    }
  } catch {
    return undefined;
  } finally {
    clearTimeout(timer);
    reader.cancel().catch(() => {}); // the copy only: the reply's own stream goes on
  }
  const all = new Uint8Array(size);
  let at = 0;
  for (const chunk of chunks) all.set(chunk, (at += chunk.length) - chunk.length);
  return all;
}

function replay(stored: StoredResponse | undefined): Response {
  const headers = new Headers(stored?.headers ?? {});
  headers.set("idempotent-replayed", "true");
  if (stored?.omitted) {
    // Never an empty body that looks like the real one: say it was not kept.
    for (const name of ["content-type", "content-length", "content-encoding", "etag"]) {
      headers.delete(name);
    }
    headers.set("idempotent-body", "omitted");
  }
  const body = stored?.body ? Uint8Array.from(atob(stored.body), (ch) => ch.charCodeAt(0)) : null;
  return new Response(body, { status: stored?.status ?? 200, headers });
}

/** The key as an RFC 8941 string (`"…"`) or a bare token; undefined for lists and bad values. */
export function parseKey(header: string): string | undefined {
  const value = header.trim();
  let key: string;
  if (value.startsWith('"')) {
    const match = /^"((?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*)"$/.exec(value);
    // ", " is how a repeated header's values are joined: `"a` and `b"` would read as one key
    if (!match || match[1]!.includes(", ")) return undefined;
    key = match[1]!.replace(/\\(["\\])/g, "$1");
  } else {
    if (!/^[\x21\x23-\x2b\x2d-\x7e]+$/.test(value)) return undefined; // no spaces, commas, quotes
    key = value;
  }
  return key.length >= 1 && key.length <= 255 ? key : undefined;
}

/**
 * What makes two requests "the same payload": method, path with query string, Content-Type, the
 * chosen headers and the body. A UTF-8 JSON body sent as JSON compares by meaning (key order and
 * spacing do not matter; numbers by their exact text, so integers beyond 2^53 still differ); any
 * other body byte for byte.
 */
async function fingerprintOf(c: Context, fingerprintHeaders: readonly string[]): Promise<string> {
  const url = new URL(c.req.url);
  const head = [
    c.req.method,
    `${url.pathname}${url.search}`,
    c.req.header("content-type") ?? "",
    ...fingerprintHeaders.map((h) => `${h.toLowerCase()}:${c.req.header(h) ?? ""}`),
  ].map((part) => JSON.stringify(part)).join("\n");
  const bytes = new Uint8Array(await c.req.arrayBuffer());
  // By meaning only a body sent as JSON: `42` and ` 42` as text/plain are two payloads.
  const json = /json/i.test(c.req.header("content-type") ?? "") ? canonicalJson(bytes) : undefined;
  const body = json === undefined ? bytes : new TextEncoder().encode(json);
  const prefix = new TextEncoder().encode(`${head}\n${json === undefined ? "raw" : "json"}\n`);
  const all = new Uint8Array(prefix.length + body.length);
  all.set(prefix);
  all.set(body, prefix.length);
  return sha256Hex(all);
}

// A JSON number, kept as its source text.
class JsonNumber {
  constructor(readonly text: string) {}
}

function canonicalJson(bytes: Uint8Array): string | undefined {
  try {
    const text = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true }).decode(bytes);
    // The reviver's third argument (JSON.parse source text access) holds a number's own text.
    const reviver = (_key: string, value: unknown, context?: { source?: string }) =>
      typeof value === "number" ? new JsonNumber(context?.source ?? String(value)) : value;
    return stable(JSON.parse(text, reviver as (key: string, value: unknown) => unknown));
  } catch {
    return undefined;
  }
}

function stable(value: unknown): string {
  if (value instanceof JsonNumber) return value.text;
  if (Array.isArray(value)) return `[${value.map(stable).join(",")}]`;
  if (value && typeof value === "object") {
    const entries = Object.entries(value).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${stable(v)}`).join(",")}}`;
  }
  return JSON.stringify(value);
}

function toBase64(bytes: Uint8Array): string {
  let text = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  }
  return btoa(text);
}
