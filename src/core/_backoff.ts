// Waiting without tight polling: Upstash bills every command.

/** Options for {@linkcode backoffDelay}. */
export interface BackoffOptions {
  /** First ceiling, doubled each attempt. @default 20 */
  baseMs?: number;
  /** Largest ceiling. @default 1000 */
  capMs?: number;
  /** Random source in [0, 1), injectable for tests. @default Math.random */
  random?: () => number;
}

/**
 * Full-jitter exponential backoff (uniform in [1, min(cap, base·2^attempt)]), never longer than
 * `boundMs`: the server's hint of when the lock frees at the latest, or the time left to wait.
 */
export function backoffDelay(
  attempt: number,
  boundMs: number,
  { baseMs = 20, capMs = 1000, random = Math.random }: BackoffOptions = {},
): number {
  const ceiling = Math.min(capMs, baseMs * 2 ** Math.min(attempt, 30));
  return Math.max(1, Math.min(Math.floor(boundMs), Math.ceil(random() * ceiling)));
}

/** Resolves after `ms`, or rejects with the signal's reason as soon as it aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal!.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
