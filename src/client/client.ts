import { withLock, withLocks } from "../core/with_lock.ts";
import type { ClientOptions, EdgelockClient } from "./types.ts";
import { createHttp } from "./_http.ts";
import { createLocks } from "./_locks.ts";
import { createRecords } from "./_records.ts";
import { createJobs } from "./_jobs.ts";
import { createOps } from "./_ops.ts";
import { checkOptions } from "../core/_validate.ts";
import { InvalidType } from "../core/_invalid.ts";

const CLIENT_OPTIONS = ["baseUrl", "apiKey", "fetch", "retries", "timeoutMs", "tenant"] as const;

/**
 * A client for the edgelock HTTP service with the same surface as the library's `Locks`,
 * `Records` and `Jobs`, so moving between embedded and remote mode is one line.
 *
 * @example
 * ```ts
 * const locks = createClient({ baseUrl: "https://locks.example.com", apiKey: "…" });
 * const result = await locks.acquire("invoice:42", { ttlMs: 5000 });
 * ```
 */
export function createClient(options: ClientOptions): EdgelockClient {
  if (options === undefined) throw new InvalidType("createClient() needs { baseUrl, apiKey }");
  checkOptions(options, CLIENT_OPTIONS, "createClient()");
  if (options.tenant !== undefined && typeof options.tenant !== "string") {
    throw new InvalidType("tenant must be a string");
  }
  const http = createHttp(options);
  const client: EdgelockClient = {
    records: createRecords(http),
    jobs: createJobs(http),
    ...createLocks(http),
    // On the client itself, so they use its calls as the caller sees them.
    withLocks: (names, opts, fn) => withLocks(client, names, opts, fn),
    withLock: (name, opts, fn) => withLock(client, name, opts, fn),
    ...createOps(http, options.tenant),
  };
  return client;
}
