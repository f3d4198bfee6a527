/**
 * `deno task size`: what each entry of the package costs an edge bundle. Each entry is bundled
 * alone with everything it imports (as wrangler or `deno bundle` would for a Worker that imports
 * only it), minified, then gzipped at level 9. Fails when an entry is over its gzip budget.
 * `--update` writes bench/sizes.json and bench/sizes.md (tracked); without it nothing is written.
 *
 * @module
 */
import { gzipSize, minifiedBundle } from "./_bundle.ts";
import { cli } from "../bridge/_cli.ts";

/** Gzip budgets in bytes: the root entry stays within a few KB of the lock core alone (with its
 * stats, held index, break and audit since issue 13: 10.2 KB, was 6.5; with the read-write lock,
 * semaphore, reentrant and multi-name scripts since issue 14: 14.9 KB; with the cluster key layout
 * since issue 15: 15.1 KB; with Upstash's per-key locking flag since issue 18: 15.8 KB). The uses and the Hono
 * middleware no longer carry the lock scripts (6.1 and 6.5 KB, were 9.5 and 10.0); the client
 * gained acquireAll, withLocks and the mode checks (4.6 KB, was 3.8). The quorum entry gained the
 * per-key locking choice (5.0 KB, was 4.5). Issue 26's exactly-once retries (hold ids, release
 * marks for every mode, break ids, the permits and reentrant checks) took the core to 17.2 KB and
 * the client to 5.0 KB. Issue 28's scripts with named contracts (the header and call builder, the
 * reply decoders) took the core to 17.8 KB; Records and Jobs share Locks' context (the options
 * checked once, in one place), and the uses went to 7.5 KB; the uses' and quorum's scripts declaring their KEYS and ARGV by name
 * too (the header and call builder in those bundles) took the uses to 8.1 KB and the quorum to
 * 5.7 KB. Issue 29's hand-off at release (the hand_over script, waiters' offers and wake keys,
 * the blocking wait and the leave that finds a grant) took the core to 20.4 KB, the uses (whose
 * Records and Jobs share the waiting loop) to 8.4 KB and the service to 150.3 KB; the uncontended
 * fast paths (a few lines of Lua before the shared pieces in acquire and release) and the
 * semaphore's hand-off took the core to 21.6 KB and the service to 151.5 KB. The service's routes
 * as a table checked by zod/mini, with the OpenAPI document built ahead of time instead of by
 * @hono/zod-openapi in the isolate, took the service to 62.6 KB. The readers' bell (a stream a
 * release rings for the shared waiters at the head, and the XREAD they block on) took the core to
 * 22.4 KB, and a hand-over that names the next semaphore waiter whose permits fit 22.6 KB.
 * Refusing unknown option names (issue 30: a TypeError naming the option and the likeliest
 * meant) took the core to 22.9 KB and the uses, whose stores check theirs, to 8.8 KB; naming
 * the cause of a misconfigured client (a probe of its URL when a call fails) to 23.7, 9.5, the
 * quorum to 6.5 and the service to 63.9 KB (one probe shared by the calls failing together). A
 * waiter that gives up handing the names over (its readers and next head woken at once) and its
 * ticket making room for its round trips: the core 23.8 KB, the service 64.1 KB. The Hono
 * middleware's per-request records and secrets (Workers' c.env): the hono entry 7.5 KB. The
 * client naming a wrong baseUrl (Redis's URL, a /v1 suffix, no API there) and a Date tick: the
 * client 5.7 KB, the uses 9.7 KB, the service 64.3 KB. The Web Locks API's LockManager (issue
 * 30) in the root entry: the core 24.7 KB. The dashboard's axes, empty states, break reasons and
 * icon: the service 65.4 KB. Causes redacted of the command Upstash appends, a failed connection
 * named (shared by the library's probe and the typed client) and option names checked in the
 * client, withLock, cronGuard and over HTTP with a did-you-mean: the core 25.2 KB, the uses
 * 10.2 KB, the client 6.7 KB, the quorum 7.2 KB and the service 66.0 KB. Readers granted in the
 * ring of the bell (the release writes their leases; a reader not granted listens on): the core
 * 26.5 KB, the uses 10.4 KB, the service 67.3 KB (the Worker, its Lua comments dropped, 81.4 KB).
 * Option names checked in the Hono middleware, dedupe, claims and the ops calls, and a key of
 * another type or a REST URL with a path told as config_error: the core 26.8 KB, the uses
 * 10.7 KB, the hono entry 8.1 KB, the quorum 7.5 KB, the service 67.7 KB (the Worker 81.8 KB).
 * The typed client's timeoutMs per attempt: the client 6.8 KB. Grants naming the next 8 waiters
 * (a semaphore holder's release hands its permits over; a writer's release wakes the readers
 * behind it on their own wake keys, the bell only as a fallback) and a reentrant release without
 * its hold refused: the core 28.1 KB, the uses 10.8 KB, the service 69.0 KB (the Worker, its
 * dashboard script minified at build, 81.7 KB). A held lock's record counting its times from its
 * fence (`X`, 136 B in Redis for a name's first lease, was 168 B; a live `H` lease still read, and
 * kept `H` until it ends): the core 28.5 KB, the service 69.4 KB (the Worker 81.8 KB). The
 * OpenAPI document a static asset of the Worker, which serves it through its binding (the service
 * entry still builds it in, for Deno; wrapped, it lands elsewhere in the bundle): the service
 * 69.8 KB, the Worker 76.5 KB. A hand-over reading the head, the waiters after it and their
 * offers once (one ZRANGE and one HMGET, where it read them one by one) and a look finding its
 * place with one ZRANK: 41.6 commands per contended acquisition, was 43.5; the core 28.9 KB, the
 * service 70.2 KB. A count adding one to its minute's slot only (the slot's counts join the
 * totals when it turns over; an earlier build's hash keeps its totals): 39.6 commands per
 * contended acquisition, 16 per uncontended cycle (were 41.6 and 18); the core 29.1 KB, the uses
 * 11.0 KB, the hono entry 8.3 KB, the service 70.4 KB. The fold made exact for damaged values and
 * unpacked in chunks, and an earlier build's hash read as it is: the uses 11.1 KB, the service
 * 70.6 KB; a total near 2^63 kept through a fold: the core 29.2 KB. A multi-name look reading
 * each place once (ZRANK, where it read ZSCORE, then ZRANK again): the service 70.7 KB. The held
 * index pruned at each minute's first grant (a field `p` in the stats hash, read with the slot's):
 * the core 29.3 KB, the hono entry 8.4 KB. Multi-name waiters handed their names (the
 * hand_over_all script, their offers in every queue, grant hints naming a multi-name head, which
 * a release hands its names in the same request, the pipeline of two scripts): the core 30.6 KB,
 * the uses 11.2 KB, the service 72.1 KB (the Worker 78.3 KB); a name the waiter holds already
 * kept in its hand-off, and the release named to it so it knows when it ran first: the core
 * 30.8 KB, the service 72.3 KB; the waiter found by its offer (it need not head the queue of a
 * name it holds) and a reentrant lease of its token its mismatch: the core 30.9 KB, the service
 * 72.5 KB. A new exclusive lease's record that keeps the last release only when its marks may not
 * (`ownRelease`: 32 B less per lock taken again): the core 31.1 KB; a histogram's sum not added
 * to when 0 ms: the service 72.6 KB; a grant that keeps its token's release mark under
 * `<token>@<fence>` where it removed it (`supersede`, so a retry by fence still finds it): the
 * core 31.2 KB, the service 72.7 KB; its fence written and read as `%.0f` formats it: the service
 * 72.8 KB. Breaks by id in a hash of their own, the oldest out first (a retry then ends nothing,
 * however many releases or breaks came since), and the client's fence checked as the library's:
 * the core 31.5 KB, the service 73.1 KB; that hash's seq read, not incremented, and taken again
 * from the ids when a hand edit damaged it: the core 31.6 KB, the service 73.2 KB. A look that
 * joins a queue of under 32 from what it read of it, and queue keys given a fixed TTL (four
 * commands fewer per look): the core 31.8 KB, the service 73.4 KB. The first waiter behind a
 * lease granted with none waiting blocking on that lease's successor key (`f<fence>`), which
 * every release of it declares, so it is handed over in place (two waiters taking turns paid a
 * second request per hand-off): the core 32.1 KB, the service 73.7 KB. A queue place shared by the
 * calls of one token, kept for them when one leaves (a retry takes it back): the core 32.5 KB,
 * the service 74.1 KB. A lease carrying who waited at its grant (`next`, in the lease JSON and
 * the release's body too, checked), so any instance's release hands over in place: the core
 * 32.6 KB, the client 7.1 KB, the service 74.4 KB. Places left ended by a grant that leaves no one
 * waiting, and none taken back by a multi-name waiter (helper-42): the core 32.7 KB, the service
 * 74.5 KB. A renewed lease keeping its next, and a lease's own next preferred to an instance's
 * (helper-43): the core 32.8 KB, the service 74.6 KB. A place left that no leave ends, a copy of
 * the same leave included (helper-45): the core 32.9 KB, the service 74.7 KB. Tickets to the
 * server's µs, each look's own, told in its reply for its leave: the core 33.0 KB, the service
 * 74.8 KB; the HTTP renewals taking a lease's next and keeping it: the service 74.9 KB. The release
 * marks trimmed at about one release in 16, and a token made for the call skipping the marks at
 * its grant: the core 33.1 KB, the service 75.0 KB. Quorum release and renew acting only on the
 * lease of their fence (a late retry freed the same token's next lease), the fence checked: the
 * quorum 7.65 KB; each attempt's commit and clean-up naming its own hold (a late one freed or
 * fenced out the lease of the next attempt, helper-47): the quorum 7.75 KB; a token's hold never
 * ending sooner, a renew by token told its fence, and a lease's own ttlMs kept within the limits
 * (helper-48): the quorum 7.9 KB, the client 7.15 KB. Validation errors that state each rule in
 * words where they showed the pattern (helper-50): the service 75.1 KB. A read-only token's NOPERM
 * told as a config_error, a renew's length read from the lease only when none is given, and
 * QuorumLocks checking its options and every lease of a renewMany first (helper-51): the core 33.2
 * KB, the uses 11.3 KB, the client 7.2 KB, the quorum 8.05 KB, the service 75.25 KB. Quorum
 * commits and clean-ups naming the floor their acquire saw too, so two holds of a token that end
 * in the same millisecond are told apart (helper-49): the quorum 8.15 KB; an acquire telling
 * when it extended a live hold of its token, which a failed attempt then leaves alone
 * (helper-52): the quorum 8.2 KB. Replies that say "none" with nil rather than '', which
 * @upstash/redis parses with a thrown JSON.parse (about 5 µs of client CPU each): the core 33.3
 * KB, the service 75.35 KB. A quorum attempt that frees the holds of the databases that answer
 * its acquire after the deadline (helper-48's orphan hold): the quorum 8.4 KB, the service 75.4
 * KB; and the holds a retry only extended that the same call had made (helper-56): the quorum
 * 8.6 KB. Tokens encoded by hand (1 µs less each, two per acquire), a reset connection told as
 * an outage, and helper-61's findings in the uses (a webhook claim renewed while its handler
 * runs, a cron start retried by its own token run again, stored replies that keep the headers
 * that fit, signatures over raw bytes): the core 33.45 KB, the uses 11.55 KB, the hono entry
 * 8.55 KB, the client 7.3 KB, the quorum 8.75 KB, the service 75.65 KB. Then helper-62's and
 * helper-63's: a lease renewed on after its signal aborted, a break id per call and a break by
 * fence, a port that closes every connection told apart from a reset, header names checked at
 * build: the core 33.65 KB, the uses 11.7 KB, the hono entry 8.7 KB, the client 7.35 KB, the
 * quorum 8.9 KB, the service 75.95 KB. The idempotency reply read under the claim, and renewals
 * after the abort only for the middlewares (helper-64): the hono entry 8.75 KB. A reply read for
 * the store 48 KiB and leaseMs at most, a blocked port told as config_error (helper-65): the core
 * 33.7 KB, the hono entry 8.95 KB, the client 7.45 KB, the service 76.0 KB. A stored body's
 * encoding and any byte view (helper-66): the hono entry 9.0 KB. A renewal sent with its lease's
 * fence, so it never extends a later lease of the same token: the service 76.1 KB. A reader's leave
 * that keeps only a lease granted since its look by fence (not by the clock) and counting its own
 * hold (helper-68): the core 33.95 KB, the service 76.3 KB. A renewal's reply telling the
 * lease's kind, and meta, renewMany's holes and the client's renewals checked as the library does
 * (helper-67): the core 34.1 KB, the client 7.5 KB, the service 76.45 KB. An acquire with a token
 * made for the call refusing a copy of itself that lands after the release (helper-67): the core
 * 34.4 KB, the service 76.9 KB; a renewal naming its reentrant hold over HTTP (helper-69): the
 * service 76.95 KB; and a released plain hold's reference, and hold counts without ids, told
 * apart (helper-70): the core 34.5 KB, the service 77.05 KB. Argument checks marked as edgelock's
 * own (only they are a 400), list and audit texts that read as JSON sent so no client parses
 * them, and helper-71's messages in edgelock's words (a cycle in meta or a response, a records
 * kind, the client's list page, fetch and tenant): the core 34.75 KB, the uses 11.8 KB, the
 * client 7.6 KB, the service 77.35 KB; a kind that is no string named by its type (helper-73):
 * the uses 11.85 KB, the service 77.4 KB. The client's acquire checked by the library's own
 * lease checks (its signal too, which it passed on unchecked): the client 7.65 KB. */
export const BUDGETS = {
  ".": 34_750,
  "./uses": 11_850,
  "./hono": 9_000,
  "./client": 7_650,
  "./otel": 9_500,
  "./tcp": 1_000,
  "./quorum": 8_900,
  "./service": 77_400,
} as const;

const flags = cli("edgelock size", "deno task size [--update]", {
  update: { type: "boolean", help: "write bench/sizes.json and bench/sizes.md" },
});
const root = new URL("../", import.meta.url);
const exports = JSON.parse(await Deno.readTextFile(new URL("deno.json", root))).exports as Record<
  keyof typeof BUDGETS,
  string
>;
const dir = await Deno.makeTempDir({ prefix: "edgelock-size-" });
const rows: { entry: string; minified: number; gzip: number; budget: number }[] = [];
try {
  for (const [entry, budget] of Object.entries(BUDGETS) as [keyof typeof BUDGETS, number][]) {
    const bytes = await minifiedBundle(exports[entry], dir);
    rows.push({ entry, minified: bytes.length, gzip: gzipSize(bytes), budget });
  }
} finally {
  await Deno.remove(dir, { recursive: true });
}

const name = (entry: string) =>
  entry === "." ? "@edgelock/edgelock" : `@edgelock/edgelock${entry.slice(1)}`;
const lines = [
  "| entry | minified | gzip | gzip budget |",
  "| --- | ---: | ---: | ---: |",
  ...rows.map((r) =>
    `| \`${name(r.entry)}\` | ${r.minified.toLocaleString("en")} B | ` +
    `${r.gzip.toLocaleString("en")} B | ${r.budget.toLocaleString("en")} B |`
  ),
];
console.log(lines.join("\n"));
if (flags.update) {
  const measured = { date: new Date().toISOString(), deno: Deno.version.deno, rows };
  await Deno.writeTextFile(
    new URL("bench/sizes.json", root),
    JSON.stringify(measured, null, 2) + "\n",
  );
  await Deno.writeTextFile(
    new URL("bench/sizes.md", root),
    `Each entry bundled alone with its dependencies, minified, gzip -9 (\`deno task size\`).\n\n` +
      lines.join("\n") + "\n",
  );
  console.log("wrote bench/sizes.json and bench/sizes.md");
}
const over = rows.filter((r) => r.gzip > r.budget);
if (over.length > 0) {
  console.error(
    `over budget: ${over.map((r) => `${name(r.entry)} ${r.gzip} B > ${r.budget} B`).join(", ")}`,
  );
  Deno.exit(1);
}
