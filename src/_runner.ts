import type { Redis } from "@upstash/redis";
import { EdgelockError } from "./errors.ts";
import type { Script } from "./scripts.ts";

/** The smallest part of an `@upstash/redis` client that edgelock needs. */
export type RedisLike = Pick<Redis, "evalsha" | "eval">;

/**
 * Runs a script in one request: EVALSHA, and EVAL only when Redis answers NOSCRIPT (after a
 * restart, failover or SCRIPT FLUSH). Any other failure becomes `backend_unavailable`.
 */
export async function runScript(
  redis: RedisLike,
  script: Script,
  keys: string[],
  args: (string | number)[],
): Promise<unknown> {
  const sha1 = await script.sha1();
  try {
    return await redis.evalsha(sha1, keys, args);
  } catch (error) {
    if (!isNoScript(error)) throw unavailable(script, error);
  }
  try {
    return await redis.eval(script.source, keys, args);
  } catch (error) {
    throw unavailable(script, error);
  }
}

// @upstash/redis reports Redis errors as UpstashError with Redis's own text, e.g.
// "NOSCRIPT No matching script. Please use EVAL." (single command) or
// "Command failed: NOSCRIPT No matching script…" (auto-pipelined).
function isNoScript(error: unknown): boolean {
  return error instanceof Error && error.name === "UpstashError" &&
    /(^|: )NOSCRIPT /.test(error.message);
}

function unavailable(script: Script, cause: unknown): EdgelockError {
  const reason = cause instanceof Error ? cause.message : String(cause);
  return new EdgelockError(
    "backend_unavailable",
    `Redis did not run the ${script.name} script: ${reason}`,
    { cause, retryAfterMs: 1000 },
  );
}

/** Checks that a script reply is an array of `count` numbers, then optional strings. */
export function integers(script: Script, reply: unknown, count: number): number[] {
  if (
    Array.isArray(reply) && reply.length >= count &&
    reply.slice(0, count).every((value) => Number.isSafeInteger(value))
  ) {
    return reply.slice(0, count) as number[];
  }
  throw new EdgelockError(
    "backend_unavailable",
    `Redis answered the ${script.name} script with an unexpected reply: ${
      JSON.stringify(reply)?.slice(0, 200)
    }`,
  );
}
