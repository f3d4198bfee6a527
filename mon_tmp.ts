import { Redis as IORedis } from "ioredis";
import { startRedisServer } from "./dev/redis_server.ts";
const s = await startRedisServer();
const m = await new IORedis(s.url).monitor();
const lines: string[] = [];
m.on(
  "monitor",
  (_t: string, args: string[], source: string) => lines.push(`${source} ${JSON.stringify(args)}`),
);
const c = new IORedis(s.url);
await c.eval("redis.call('SET', KEYS[1], 'x'); return redis.call('GET', KEYS[1])", 1, "k1");
await c.eval("return redis.call('GET', 'k2')", 1, "k1");
await new Promise((r) => setTimeout(r, 100));
console.log(lines.join("\n"));
console.log(
  await c.call("COMMAND", "GETKEYS", "ZRANGEBYSCORE", "z", "-inf", "5", "LIMIT", "0", "3"),
);
c.disconnect();
m.disconnect();
await s.stop();
