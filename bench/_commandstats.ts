// Redis commands and their CPU time so far (INFO commandstats, INFO itself left out), for
// per-cycle costs: read before and after, and divide the difference.
import type { Redis as IORedis } from "ioredis";

/**
 * The commands Redis ran and their total µs, from `INFO commandstats` over `tcp`; `scriptUsec` is
 * the time of the script calls alone (EVALSHA and EVAL: what runs inside them, their inner
 * commands included, which `usec` counts a second time).
 */
export async function commandStats(
  tcp: IORedis,
): Promise<{ commands: number; usec: number; scriptUsec: number }> {
  let commands = 0;
  let usec = 0;
  let scriptUsec = 0;
  const info = await tcp.info("commandstats");
  for (const [, name, calls, time] of info.matchAll(/cmdstat_(\w+):calls=(\d+),usec=(\d+)/g)) {
    if (name === "info") continue;
    commands += Number(calls);
    usec += Number(time);
    if (/^eval(sha)?(_ro)?$/.test(name!)) scriptUsec += Number(time);
  }
  return { commands, usec, scriptUsec };
}
