// Who a request is: the token it presents, as `Authorization: Bearer …` or `?_token=…`, and the
// role that token grants (`./policy.ts`).
import { createHash, timingSafeEqual } from "node:crypto";
import type { Role } from "./policy.ts";

/** The bridge's tokens: the read-write one, and an optional read-only one. */
export class Tokens {
  readonly #tokens: [Uint8Array, Role][];

  constructor(token: string, readonlyToken?: string) {
    if (!token) throw new TypeError("The bridge needs a token (UPSTASH_REDIS_REST_TOKEN)");
    if (readonlyToken === token) {
      throw new TypeError("The read-only token must differ from the read-write token");
    }
    this.#tokens = [[digest(token), "readwrite"]];
    if (readonlyToken) this.#tokens.push([digest(readonlyToken), "readonly"]);
  }

  // Tokens are compared as SHA-256 digests, in constant time, every one whichever matches: the
  // comparison reveals neither a token's length nor which token came close.
  /** The role the request's token grants; none for a missing, wrong or malformed one. */
  roleOf(request: Request, url: URL): Role | undefined {
    const header = request.headers.get("authorization");
    if (header !== null && !header.startsWith("Bearer ")) return undefined;
    const given = digest(
      header !== null ? header.slice("Bearer ".length) : url.searchParams.get("_token") ?? "",
    );
    let role: Role | undefined;
    for (const [expected, which] of this.#tokens) {
      if (timingSafeEqual(given, expected)) role = which;
    }
    return role;
  }
}

function digest(text: string): Uint8Array {
  return createHash("sha256").update(text).digest();
}
