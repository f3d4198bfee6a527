// Redis commands and their CPU time so far (INFO commandstats, INFO itself left out), for
// per-cycle costs: read before and after, and divide the difference.
import type { Redis as IORedis } from "ioredis";

/** The commands Redis ran and their total µs, from `INFO commandstats` over `tcp`. */
export async function commandStats(tcp: IORedis): Promise<{ commands: number; usec: number }> {
  let commands = 0;
  let usec = 0;
  const info = await tcp.info("commandstats");
  for (const [, name, calls, time] of info.matchAll(/cmdstat_(\w+):calls=(\d+),usec=(\d+)/g)) {
    if (name === "info") continue;
    commands += Number(calls);
    usec += Number(time);
  }
  return { commands, usec };
}
