/**
 * `deno run bench/fifo_model.ts`: what an ideal FIFO queue of `permits` reaches with the arrivals
 * of `bench:edge`'s contention cases, as a check of where a case's throughput goes. Waiters of the
 * first round reach Redis a round trip apart (each starts once the one before it was answered);
 * each grant holds its permit for a hold and a round trip (the grant's way out, the release's way
 * in), and its waiter's next look arrives a round trip after its release. Nothing else costs
 * time: no timer lateness, no processing, no lost wake-ups. Prints the fraction of the bound
 * `permits / (hold + RTT)` and the permits' idle time, per case.
 *
 * @module
 */

/** The run's length and the permits' idle time, ms, for `waiters` × `rounds` grants. */
export function fifo(
  { permits, waiters = 20, rounds = 3, holdMs = 10, rttMs }: {
    permits: number;
    waiters?: number;
    rounds?: number;
    holdMs?: number;
    rttMs: number;
  },
): { spanMs: number; idleMs: number; ofBound: number } {
  const service = holdMs + rttMs;
  const looks = Array.from({ length: waiters }, (_, i) => ({ at: i * rttMs, round: 0 }));
  const freeAt = new Array<number>(permits).fill(0);
  let span = 0;
  while (looks.length > 0) {
    looks.sort((a, b) => a.at - b.at);
    const look = looks.shift()!;
    const k = freeAt.indexOf(Math.min(...freeAt));
    const grant = Math.max(look.at, freeAt[k]!);
    freeAt[k] = grant + service;
    span = Math.max(span, freeAt[k]!);
    if (look.round + 1 < rounds) looks.push({ at: freeAt[k]! + rttMs, round: look.round + 1 });
  }
  const grants = waiters * rounds;
  return {
    spanMs: span,
    idleMs: permits * span - grants * service,
    ofBound: grants * service / permits / span,
  };
}

if (import.meta.main) {
  // The round trips bench:edge measured at 0, 5 and 20 ms each way (proxy and bridge included).
  for (const rttMs of [1, 14, 44]) {
    for (const permits of [1, 2]) {
      const { spanMs, idleMs, ofBound } = fifo({ permits, rttMs });
      console.log(
        `RTT ${rttMs} ms, ${permits} permit(s): ${ofBound.toFixed(3)} of the bound, ` +
          `${Math.round(spanMs)} ms, ${Math.round(idleMs)} permit-ms idle`,
      );
    }
  }
}
