/**
 * A typed client for the edgelock HTTP service, with the same surface as the library's `Locks`.
 *
 * @example
 * ```ts
 * import { createClient } from "@edgelock/edgelock/client";
 *
 * const locks = createClient({ baseUrl: "https://locks.example.com", apiKey: "…" });
 * const result = await locks.acquire("invoice:42", { ttlMs: 5000 });
 * if (result.acquired) await locks.release(result.lease);
 * ```
 *
 * @module
 */
export { createClient } from "./client.ts";
export type { ClientOptions, EdgelockClient } from "./types.ts";
