import assert from "node:assert/strict";
import { startRedisServer } from "../dev/redis_server.ts";

Deno.test("startRedisServer() refuses a port that another redis-server already serves", async () => {
  const first = await startRedisServer();
  try {
    // A PING on the port would be answered by the first server: the start must see it is not its own.
    await assert.rejects(
      startRedisServer({ port: first.port }),
      /redis-server did not start on port \d+: .*Address already in use/s,
    );
  } finally {
    await first.stop();
  }
});

Deno.test("startRedisServer() picks another free port when the first pick is taken", async () => {
  // Each start picks its own port; many at once on two cores make collisions with the
  // pick-then-bind window likely enough to matter, and none may fail.
  const servers = await Promise.all(Array.from({ length: 8 }, () => startRedisServer()));
  try {
    assert.equal(new Set(servers.map((server) => server.port)).size, 8);
  } finally {
    await Promise.all(servers.map((server) => server.stop()));
  }
});
