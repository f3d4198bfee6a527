import type { Lease } from "./types.ts";

/**
 * What a lease tells beyond its name, token, fence and times: mode, limit, permits, hold count
 * and hold id.
 */
export function leaseKind(
  { mode, limit, permits, holdCount, hold }: Partial<Lease>,
): Pick<Partial<Lease>, "mode" | "limit" | "permits" | "holdCount" | "hold"> {
  return {
    ...(mode && { mode }),
    ...(limit !== undefined && { limit, permits }),
    ...(holdCount !== undefined && { holdCount }),
    ...(hold !== undefined && { hold }),
  };
}
