import { EdgelockError } from "../core/errors.ts";

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

/** 503 with `Retry-After` when `error` says Redis is unreachable; otherwise undefined. */
export function unavailable(error: unknown, store: string): Response | undefined {
  if (!(error instanceof EdgelockError && error.code === "backend_unavailable")) return undefined;
  return problem(503, "backend_unavailable", `The ${store} store is unreachable`, {
    headers: { "retry-after": "1" },
  });
}
