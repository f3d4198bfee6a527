import type { Lease } from "./types.ts";

/**
 * What a lease tells beyond its name, token, fence and times: mode, limit, permits, hold count,
 * hold id, and who waited at its grant (which a renewed lease keeps).
 */
export function leaseKind(
  { mode, limit, permits, holdCount, hold, next }: Partial<Lease>,
): Pick<Partial<Lease>, "mode" | "limit" | "permits" | "holdCount" | "hold" | "next"> {
  return {
    ...(next !== undefined && { next }),
    ...(mode && { mode }),
    ...(limit !== undefined && { limit, permits }),
    ...(holdCount !== undefined && { holdCount }),
    ...(hold !== undefined && { hold }),
  };
}
