// Every script, for the runner's tests and `deno task lua`.
export { ACQUIRE } from "./acquire.ts";
export { ACQUIRE_SHARED, MAX_SHARED } from "./acquire_shared.ts";
export { ACQUIRE_ALL } from "./acquire_all.ts";
export { LEAVE_QUEUE } from "./leave_queue.ts";
export { HAND_OVER } from "./hand_over.ts";
export { HAND_OVER_ALL } from "./hand_over_all.ts";
export { RENEW } from "./renew.ts";
export { RELEASE } from "./release.ts";
export { INSPECT } from "./inspect.ts";
export { LIST } from "./list.ts";
export { READ_STATS } from "./read_stats.ts";
export { AUDIT_LENGTH, BREAK, READ_AUDIT } from "./break.ts";
export { PING } from "./ping.ts";
