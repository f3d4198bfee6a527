// The keys and arguments the scripts share, by name: one declaration each (`./_define.ts`).

/** The stats hash and the held index of the name's bucket, passed only with stats on. */
export const STATS_KEYS = ["statsKey?", "namesKey?", "endsKey?"] as const;

/** What every acquire takes, before its own arguments. */
export const ACQUIRE_ARGS = {
  token: "string",
  ttlMs: "number",
  meta: "string", // JSON object text, or '' for none
  graceMs: "number", // how long the fence outlives the lease
  ticketMs: "number", // how long a waiter's ticket lives (at most MAX_TICKET_MS); 0: do not queue
  maxWaiters: "number", // the queue's bound
  // the token was made for this call alone: its mark (a release of it) means this is a late copy
  fresh: "flag",
} as const;

/** How an acquire's outcome is counted: the time waited so far, and whether it waits on. */
export const WAIT_ARGS = { waitedMs: "number", waiting: "flag" } as const;
