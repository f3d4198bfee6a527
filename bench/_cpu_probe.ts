// Run by bench/edge.ts in a fresh process: the CPU time of importing a Worker bundle, of its first
// request and of warm ones. workerd shows a Worker no clock that moves while it computes, so this
// runs the bundle in Deno (the same V8); process CPU also counts Deno's own HTTP client, which the
// floor Worker (one Redis command per request) measures alone.
import process from "node:process";

const [bundle, url, token, secret, kind] = Deno.args;
const cpu = () => {
  const { user, system } = process.cpuUsage();
  return (user + system) / 1000;
};
const env = {
  UPSTASH_REDIS_REST_URL: url,
  UPSTASH_REDIS_REST_TOKEN: token,
  LOCK_API_KEYS: `b:${secret}`,
};
const request = (path: string, body?: unknown) =>
  new Request(`http://cpu.test${path}`, {
    method: body ? "POST" : "GET",
    headers: { authorization: `Bearer ${secret}`, "content-type": "application/json" },
    body: body ? JSON.stringify(body) : undefined,
  });
console.log = () => {}; // the service's request log is not what is measured

const started = cpu();
const worker = (await import(bundle!)).default;
const imported = cpu();
// One lock request: an acquire of a new name, or for the floor Worker one Redis command.
const call = async (i: number) => {
  if (kind === "floor") return await (await worker.fetch(request("/"), env, {})).text();
  const lease = await (await worker.fetch(request(`/v1/locks/cpu-${i}/acquire`, {}), env, {}))
    .json();
  await worker.fetch(request(`/v1/locks/cpu-${i}/release`, { token: lease.token }), env, {});
};
await call(0);
const first = cpu();
const N = 200;
for (let i = 1; i <= N; i++) await call(i);
const warm = cpu();
const requests = kind === "floor" ? N : 2 * N;
console.error(JSON.stringify({
  importMs: imported - started,
  firstRequestMs: kind === "floor" ? first - imported : (first - imported) / 2,
  warmRequestMs: (warm - first) / requests,
}));
