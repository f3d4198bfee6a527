// Failures made fit to show: without edgelock's internals, and a failed connection in words.

/**
 * A copy of a failure that shows nothing of edgelock's internals: `@upstash/redis` appends the
 * command to Redis's reply (the script's SHA-1, key names, lease tokens), and Redis names the
 * script's SHA-1 in a script error. The copy keeps the name, the message without those, the
 * `code` (`ECONNREFUSED`) and up to three causes; not the client's stack.
 */
export function redacted(failure: unknown, depth = 0): unknown {
  const scrub = (text: string) =>
    text.replace(/,? ?command was: [\s\S]*$/, "").replace(/(\b|f_)[0-9a-f]{40}\b/g, "<sha1>");
  if (typeof failure === "string") return scrub(failure);
  if (!(failure instanceof Error)) return failure;
  const inner = (failure as { cause?: unknown }).cause;
  const copy = new Error(
    scrub(failure.message),
    inner !== undefined && depth < 3 ? { cause: redacted(inner, depth + 1) } : undefined,
  );
  copy.name = failure.name;
  copy.stack = `${copy.name}: ${copy.message}`;
  const { code } = failure as { code?: unknown };
  if (typeof code === "string") Object.assign(copy, { code });
  return copy;
}

/** What a look at a client's URL found: the cause, and whether a retry may help. */
export interface Diagnosis {
  message: string;
  retry: boolean;
  /** The look's own failure, when it failed to connect. */
  cause?: unknown;
}

/**
 * What a failed request to `url` says about it, in words that end with `fix`: nothing listening
 * (a retry may help: a restart looks the same), a host that does not resolve, or TLS refused (a
 * plain HTTP server, a certificate not trusted). `"timeout"` when it only timed out; `undefined`
 * when the failure names none of these (a connection reset, which may pass).
 */
export function connectFailure(
  error: unknown,
  url: string,
  fix: string,
): Diagnosis | "timeout" | undefined {
  const { origin, protocol } = new URL(url);
  const text = failureText(error);
  if ((error as Error)?.name === "TimeoutError" || /abort|timed? ?out/i.test(text)) {
    return "timeout";
  }
  const found = (message: string, retry = false): Diagnosis => ({
    message,
    retry,
    cause: redacted(error),
  });
  if (/refused/i.test(text)) {
    return found(`Nothing accepts connections at ${origin} (refused): ${fix}`, true);
  }
  if (/Requests to port \d+ are blocked/i.test(text)) {
    return found(
      `${origin} is on a port fetch refuses to reach (the fetch spec's bad ports): ${fix}`,
    );
  }
  if (/ENOTFOUND|EAI_AGAIN|dns error|getaddrinfo|not known/i.test(text)) {
    return found(`The host of ${origin} does not resolve: ${fix}`);
  }
  if (
    protocol === "https:" &&
    /InvalidContentType|wrong version|corrupt message|WRONG_VERSION|packet length/i.test(text)
  ) {
    return found(`TLS failed with ${origin}: is it a plain http:// server? ${fix}`);
  }
  if (protocol === "https:" && /certificate|UnknownIssuer|self.signed/i.test(text)) {
    return found(`${origin}'s TLS certificate is not trusted: ${fix}`);
  }
  return undefined;
}

/** A failure's message and code, and its cause's, in one line. */
export function failureText(error: unknown): string {
  return [error, (error as { cause?: unknown })?.cause].map((e) =>
    e instanceof Error ? `${e.message} ${(e as { code?: string }).code ?? ""}` : ""
  ).join(" ").trim();
}
