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
