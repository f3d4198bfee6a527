/**
 * The Upstash-REST-compatible bridge: an HTTP server speaking the Upstash Redis REST protocol in
 * front of a real redis-server, Valkey or Redis Cluster, so the unmodified `@upstash/redis` client
 * works against Redis you host: in tests, locally, and in production (`deno task bridge`,
 * configured by env: `docs/bridge.md`). It serves data commands only (`./policy.ts`), with
 * bounded bodies, batches, replies, scripts and connections.
 *
 * @module
 */
export type { Bridge, BridgeOptions, BridgeStats, RequestLog } from "./types.ts";
export type { Role } from "./policy.ts";
export { startBridge } from "./server.ts";
export { bridgeOptionsFromEnv } from "./config.ts";
