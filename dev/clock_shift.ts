/**
 * A redis-server whose wall clock the test steps: builds `clock_shift.c` (an LD_PRELOAD shim;
 * see there why not libfaketime) with the system C compiler and starts redis-server under it.
 *
 * @module
 */
import { type RedisServer, type RedisServerOptions, startRedisServer } from "./redis_server.ts";

/** A redis-server with a steppable clock. */
export interface ShiftedRedisServer extends RedisServer {
  /** Sets the server clock to real time plus `offsetMs` (negative: behind), at once. */
  shift(offsetMs: number): Promise<void>;
}

const SOURCE = new URL("./clock_shift.c", import.meta.url);

/** Starts redis-server under the clock shim (needs `cc`: `apt-get install -y gcc`). */
export async function startShiftedRedisServer(
  options: RedisServerOptions = {},
): Promise<ShiftedRedisServer> {
  const dir = await Deno.makeTempDir({ prefix: "edgelock-clock-" });
  const library = `${dir}/clock_shift.so`;
  const offsetFile = `${dir}/offset`;
  try {
    const built = await new Deno.Command("cc", {
      args: ["-shared", "-fPIC", "-O2", "-o", library, SOURCE.pathname],
      stdout: "piped",
      stderr: "piped",
    }).output();
    if (!built.success) throw new Error(new TextDecoder().decode(built.stderr));
    await Deno.writeTextFile(offsetFile, "0");
    const server = await startRedisServer({
      ...options,
      env: { ...options.env, LD_PRELOAD: library, CLOCK_SHIFT_FILE: offsetFile },
    });
    return {
      ...server,
      async shift(offsetMs) {
        // Replaced whole by a rename: the shim never reads a half-written (empty) file, which
        // would be an offset of 0, a jump to real time.
        await Deno.writeTextFile(`${offsetFile}.next`, String(Math.round(offsetMs * 1000)));
        await Deno.rename(`${offsetFile}.next`, offsetFile);
      },
      async stop(stopOptions) {
        await server.stop(stopOptions);
        await Deno.remove(dir, { recursive: true }).catch(() => {});
      },
    };
  } catch (error) {
    await Deno.remove(dir, { recursive: true }).catch(() => {});
    if (error instanceof Deno.errors.NotFound) {
      throw new Error(
        "A C compiler is needed to step redis-server's clock: apt-get install -y gcc",
      );
    }
    throw error;
  }
}
