// The service under 500 concurrent 5-s waits from one tenant (cap 100): replies, descriptors,
// memory and the bridge requests the waits cost. Run: deno run -A bench/waits.ts
import { cli } from "../bridge/_cli.ts";
import { startBackend } from "../test/_backend.ts";
import { LISTENING, spawnDeno } from "../test/_process.ts";

cli("edgelock waits", "deno run -A bench/waits.ts   (500 waits against a cap of 100)", {});
const backend = await startBackend();
const SECRET = "fd-measure-secret-0123456789";
const service = await spawnDeno(["run", "-A", "worker/deno.ts"], {
  PORT: "0",
  UPSTASH_REDIS_REST_URL: backend.bridge.url,
  UPSTASH_REDIS_REST_TOKEN: backend.token,
  LOCK_API_KEYS: `m:${SECRET}`,
}, LISTENING);
const url = `http://127.0.0.1:${service.ready[1]}`;
const pid = service.child.pid;
const fds = () => [...Deno.readDirSync(`/proc/${pid}/fd`)].length;
const rss = () =>
  Math.round(
    Number(/VmRSS:\s+(\d+)/.exec(Deno.readTextFileSync(`/proc/${pid}/status`))![1]) / 1024,
  );
let client = Deno.createHttpClient({});
const post = (path: string, body: unknown) =>
  fetch(`${url}${path}`, {
    client,
    method: "POST",
    headers: { authorization: `Bearer ${SECRET}`, "content-type": "application/json" },
    body: JSON.stringify(body),
  });
const held = await (await post("/v1/locks/busy/acquire", { ttlMs: 60000 })).json();
console.log(`before: fds ${fds()}, rss ${rss()} MB`);
const before = backend.requests();
const waits = Array.from(
  { length: 500 },
  () =>
    post("/v1/locks/busy/acquire", { waitMs: 5000 }).then(async (r) => {
      await r.body?.cancel();
      return r.status;
    }),
);
await new Promise((r) => setTimeout(r, 2000));
console.log(
  `during (2 s in): fds ${fds()}, rss ${rss()} MB, bridge requests/s ${
    ((backend.requests() - before) / 2).toFixed(0)
  }`,
);
const statuses = await Promise.all(waits);
const count = (s: number) => statuses.filter((x) => x === s).length;
console.log(
  `replies: 409 ${count(409)}, 429 ${count(429)}, other ${
    statuses.length - count(409) - count(429)
  }`,
);
client.close(); // the callers go away: their keep-alive connections close
client = Deno.createHttpClient({});
await new Promise((r) => setTimeout(r, 3000));
console.log(
  `after the callers closed their connections (3 s later): fds ${fds()}, rss ${rss()} MB`,
);
await post("/v1/locks/busy/release", { token: held.token });
await service.stop();
await backend.stop();
