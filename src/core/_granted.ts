// When the request that granted a lease was sent, by `performance.now()`: the lease is surely
// valid until that moment plus its TTL. Kept beside the lease value (which stays a plain object)
// by whoever acquired it, and read by `withLock` to time the lease from the grant, not from
// before a wait.

const sentAt = new WeakMap<object, number>();

/** Records when the request that granted `lease` was sent; returns the lease. */
export function noteSentAt<T extends object>(lease: T, at: number): T {
  sentAt.set(lease, at);
  return lease;
}

/** When the request that granted `lease` was sent, if its maker recorded it. */
export function sentAtOf(lease: object): number | undefined {
  return sentAt.get(lease);
}
