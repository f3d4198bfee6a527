import type { Lease } from "./types.ts";

/**
 * What a lease tells beyond its name, token, fence and times: mode, limit, permits, hold count,
 * hold id, and who waited at its grant, which a lease renewed to `fence` keeps when it is the
 * same lease (a renew without a fence goes by token, and may find a later lease of it).
 */
export function leaseKind(
  { mode, limit, permits, holdCount, hold, next, fence: was }: Partial<Lease>,
  fence?: number,
): Pick<Partial<Lease>, "mode" | "limit" | "permits" | "holdCount" | "hold" | "next"> {
  const same = fence === undefined || was === undefined || fence === was;
  return {
    ...(next !== undefined && same && { next }),
    ...(mode && { mode }),
    ...(limit !== undefined && { limit, permits }),
    ...(holdCount !== undefined && { holdCount }),
    ...(hold !== undefined && { hold }),
  };
}
