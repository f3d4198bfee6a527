import { defineScript } from "./_define.ts";

/** Health check: proves Redis runs scripts. Returns 1. */
export const PING = defineScript("ping", { keys: [], args: {} }, [], "return 1", {
  readOnly: true,
});
