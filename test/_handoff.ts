// Helpers the hand-off tests share: a held lease recorded in a history, and a hook run before a
// client's pipelined requests.
import type { Redis } from "@upstash/redis";
import type { Lease, Locks } from "@edgelock/edgelock";
import type { Operation } from "../dev/history.ts";

/**
 * Leases granted at `invokedAt` together (`kind`, their mode fields) in `history`, held `holdMs`,
 * then released one by one through `releaser` (the acquire's Locks or another), each release in
 * `history` too.
 */
export async function holdAndRelease(
  history: Operation[],
  client: string,
  leases: readonly Lease[],
  invokedAt: number,
  kind: Pick<Operation & { op: "acquire" }, "mode" | "limit" | "permits" | "multi">,
  holdMs: number,
  releaser: Locks,
): Promise<void> {
  for (const lease of leases) {
    history.push({
      op: "acquire",
      client,
      name: lease.name,
      token: lease.token,
      invokedAt,
      completedAt: Date.now(),
      outcome: "acquired",
      fence: lease.fence,
      serverTime: lease.serverTime,
      expiresAt: lease.expiresAt,
      ...kind,
    });
  }
  await new Promise((resolve) => setTimeout(resolve, holdMs));
  for (const lease of leases) {
    const releasedAt = Date.now();
    const released = await releaser.release(lease);
    history.push({
      op: "release",
      client,
      name: lease.name,
      token: lease.token,
      invokedAt: releasedAt,
      completedAt: Date.now(),
      outcome: released ? "released" : "not_held",
    });
  }
}

/** `redis` with `before` awaited before each pipeline it sends (one request each). */
export function beforePipelines(redis: Redis, before: () => Promise<void>): Redis {
  return new Proxy(redis, {
    get(target, property, receiver) {
      if (property !== "pipeline") return Reflect.get(target, property, receiver);
      return () => {
        const pipeline = target.pipeline();
        const exec = pipeline.exec.bind(pipeline);
        return Object.assign(pipeline, {
          exec: async (...options: Parameters<typeof exec>) => {
            await before();
            return await exec(...options);
          },
        });
      };
    },
  });
}
