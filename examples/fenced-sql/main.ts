/**
 * A fenced write to a real SQL database (Postgres, in-process through PGlite): a lock alone cannot
 * stop a holder that stalled past its lease, but its fence can. Worker A takes the lock and stalls
 * (a GC pause, a frozen isolate) until its lease has run out; worker B takes the lock and writes.
 * When A wakes and writes, its old fence is refused by the database itself:
 * `UPDATE … WHERE fence < $fence`. Run it against the Redis of `deno task dev`:
 *
 *   UPSTASH_REDIS_REST_URL=… UPSTASH_REDIS_REST_TOKEN=… deno run -A examples/fenced-sql/main.ts
 *
 * @module
 */
import { PGlite } from "@electric-sql/pglite";
import { Redis } from "@upstash/redis";
import { Locks } from "@edgelock/edgelock";

const db = new PGlite(); // in memory
await db.exec(`
  create table accounts (id int primary key, balance int not null, fence bigint not null default 0);
  insert into accounts (id, balance) values (1, 100);
`);

// The write every holder makes: it lands only with a fence above the last one that landed.
async function setBalance(balance: number, fence: number): Promise<boolean> {
  const result = await db.query(
    "update accounts set balance = $1, fence = $2 where id = 1 and fence < $2",
    [balance, fence],
  );
  return result.affectedRows === 1;
}

const locks = new Locks(Redis.fromEnv(), { prefix: `fenced-sql-${crypto.randomUUID()}` });
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

const a = await locks.acquire("account:1", { ttlMs: 300 });
if (!a.acquired) throw new Error("A should get the free lock");
console.log(`A holds the lock with fence ${a.lease.fence}, then stalls past its 300 ms lease`);
await sleep(600);

const b = await locks.acquire("account:1", { ttlMs: 5_000, waitMs: 2_000 });
if (!b.acquired) throw new Error("B should get the lock once A's lease ran out");
const bWrote = await setBalance(150, b.lease.fence);
console.log(
  `B holds it with fence ${b.lease.fence} and writes balance 150: ${
    bWrote ? "written" : "refused"
  }`,
);

const aWrote = await setBalance(50, a.lease.fence); // A wakes, unaware its lease is gone
console.log(
  `A wakes and writes balance 50 with fence ${a.lease.fence}: ${aWrote ? "written" : "refused"}`,
);
await locks.release(b.lease);

const { rows } = await db.query<{ balance: number }>("select balance from accounts where id = 1");
console.log(`The account holds ${rows[0]!.balance}`);
await db.close();
if (!bWrote || aWrote || rows[0]!.balance !== 150) Deno.exit(1);
