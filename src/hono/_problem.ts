import type { Context } from "hono";
import { EdgelockError } from "../core/errors.ts";
import type { RecordStore } from "../uses/records.ts";
import { InvalidType } from "../core/_invalid.ts";

/** An RFC 9457 problem+json response: `{ type, title, status, detail, code, …extra }`. */
export function problem(
  status: number,
  code: string,
  detail: string,
  { title = detail, headers = {}, extra = {} }: {
    title?: string;
    headers?: Record<string, string>;
    extra?: Record<string, unknown>;
  } = {},
): Response {
  return new Response(
    JSON.stringify({ type: `urn:edgelock:problem:${code}`, title, status, detail, code, ...extra }),
    { status, headers: { "content-type": "application/problem+json", ...headers } },
  );
}

/**
 * The reply to a store's failure, its cause logged for the application's developer (the reply
 * names no host or setting): 503 with `Retry-After` when Redis is unreachable, 500 `config_error`
 * when the store is misconfigured (a refused token, a wrong URL); otherwise undefined.
 */
export function unavailable(error: unknown, store: string): Response | undefined {
  if (!(error instanceof EdgelockError)) return undefined;
  if (error.code !== "backend_unavailable" && error.code !== "config_error") return undefined;
  console.error(`edgelock: the ${store} store failed: ${error.message}`);
  if (error.code === "config_error") {
    return problem(
      500,
      "config_error",
      `The ${store} store is misconfigured: see the server's log`,
    );
  }
  return problem(503, "backend_unavailable", `The ${store} store is unreachable`, {
    headers: { "retry-after": "1" },
  });
}

/** A setting given as is, or made per request from the context (on Workers, from `c.env`). */
export type PerRequest<T> = T | ((c: Context) => T);

/**
 * A per-request setting's value for `c`, checked by `check` (which throws naming what is wrong);
 * a 500 `config_error` naming `what` and the cause when the factory throws or its value is
 * refused, never Hono's bare 500. The factory is the application's own code (it reads `c.env`),
 * so its message is the application's, shown as the cause.
 */
export function perRequest<T>(
  setting: (c: Context) => unknown,
  c: Context,
  what: string,
  check: (value: unknown) => T,
): T | Response {
  try {
    return check(setting(c));
  } catch (error) {
    const cause = error instanceof Error ? error.message.slice(0, 300) : String(error);
    return problem(500, "config_error", `${what} is wrong: ${cause}`);
  }
}

/** A checker of the middleware `who`'s record store (a TypeError that says what it got). */
export function checkStore(who: string): (records: unknown) => RecordStore {
  return (records) => {
    if (typeof (records as RecordStore | undefined)?.claim !== "function") {
      const got = records === null ? "null" : typeof records;
      throw new InvalidType(`${who} needs records: new Records(redis) (got ${got})`);
    }
    return records as RecordStore;
  };
}

/** The store per request: the factory given, or the store given (checked now, at start-up). */
export function storeFactory(
  records: PerRequest<RecordStore>,
  who: string,
): (c: Context) => unknown {
  if (typeof records === "function") return records;
  checkStore(who)(records);
  return () => records;
}
