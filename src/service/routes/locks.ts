// The lock routes: acquire (optionally waiting in the fair queue), renew, batch renew, release,
// inspect. Each is one script through the tenant's Locks.
import * as z from "zod/mini";
import type { Context, Hono } from "hono";
import { busyError, EdgelockError } from "../../core/errors.ts";
import { HINT, MAX_LIMIT, MAX_NAMES } from "../../core/_validate.ts";
import { sentAtOf } from "../../core/_granted.ts";
import { leaseKind } from "../../core/_lease.ts";
import type { Lease } from "../../core/types.ts";
import type { AppEnv } from "../_env.ts";
import { route } from "../_route.ts";
import {
  common,
  doc,
  duration,
  holdId,
  holding,
  int,
  json,
  LockName,
  Meta,
  NameParams,
  post,
  problemDoc,
  Token,
  token,
} from "../_schemas.ts";

const leaseFields = {
  ttlMs: z.optional(duration("ttlMs", "Lease length in ms (default 10000)")),
  waitMs: z.optional(
    duration("waitMs", "How long the server waits for a busy lock, ms (default 0)"),
  ),
  token: z.optional(token("Choose it to make retries safe")),
  freshToken: z.optional(doc(z.boolean(), {
    description: "The token is this call's alone: a copy after its release is lock_lost",
  })),
  meta: z.optional(Meta),
};
const permits = (description: string) =>
  z.optional(doc(z.number().check(z.int(), z.minimum(1), z.maximum(MAX_LIMIT)), { description }));
const AcquireBody = doc(
  z.strictObject({
    ...leaseFields,
    mode: z.optional(doc(z.enum(["exclusive", "shared"]), {
      description: "exclusive (default): one holder; shared: many readers, no writer",
    })),
    limit: permits("A semaphore of this many permits; every caller of the name passes the same"),
    permits: permits(
      "How many of the semaphore's permits this lease takes (default 1, at most limit)",
    ),
    reentrant: z.optional(doc(z.boolean(), {
      description: "The holder's token acquiring again counts a hold (holdCount) instead of " +
        "answering the same lease; it then takes as many releases, each with its hold",
    })),
    hold: z.optional(holdId(
      "With reentrant: this acquire's hold id (default: a new one). Send the same " +
        "id when you retry, so the hold counts once",
    )),
  }),
  { id: "AcquireRequest" },
);
const AcquireAllBody = doc(
  z.strictObject({
    ...leaseFields,
    names: doc(z.array(LockName).check(z.minLength(1), z.maxLength(MAX_NAMES)), {
      description:
        `1–${MAX_NAMES} distinct names; with LOCK_KEY_LAYOUT=cluster in one slot (the same {group})`,
    }),
  }),
  { id: "AcquireAllRequest" },
);
// A lease's next, sent back unchanged: a release hands over with it, and a renewal keeps it.
const Next = (description: string) =>
  z.optional(
    doc(z.string().check(z.regex(HINT, "must be the lease's next, unchanged")), { description }),
  );
// A lease's fence, sent back: the call then means exactly that lease.
const Fence = (description: string) =>
  z.optional(doc(z.number().check(z.int(), z.minimum(1)), { description }));
const RenewBody = doc(
  z.strictObject({
    token: Token,
    fence: Fence("The lease's fence: only that lease is renewed"),
    hold: z.optional(holdId("A reentrant lease's hold: only while it is held")),
    ttlMs: duration("ttlMs", "New lease length from now, ms"),
    next: Next("The lease's next, unchanged: the renewed lease keeps it"),
  }),
  { id: "RenewRequest" },
);
const ReleaseBody = doc(
  z.strictObject({
    token: Token,
    fence: Fence(
      "The lease's fence: a retry answers true for exactly this lease, and the release can hand over in place",
    ),
    hold: z.optional(holdId(
      "A reentrant lease's hold to end (the lease's hold): a retry then ends it once",
    )),
    next: Next(
      "The lease's next, unchanged: the release then hands over in place, whichever instance serves it",
    ),
  }),
  { id: "ReleaseRequest" },
);

const serverClock = "Epoch ms, Redis server clock";
const leaseShape = {
  name: LockName,
  token: Token,
  fence: int("Strictly increasing per name"),
  ttlMs: int(),
  expiresAt: int(serverClock),
  serverTime: int(serverClock),
  mode: z.optional(doc(z.enum(["shared", "semaphore"]), { description: "Absent: exclusive" })),
  limit: z.optional(int()),
  permits: z.optional(int()),
  holdCount: z.optional(int("A reentrant lease's holds")),
  hold: z.optional(holdId("This reentrant acquire's hold")),
  next: z.optional(doc(z.string(), {
    description: "Who waited when it was granted (opaque): send it with the release",
  })),
};
const LeaseSchema = doc(z.object(leaseShape), { id: "Lease" });
const waitedMs = z.optional(doc(z.number().check(z.int(), z.minimum(0)), {
  description: "How long the service waited before the request to Redis that granted the " +
    "lease, ms: the lease is valid at least ttlMs from when the client sent its request plus this",
}));
const AcquiredSchema = doc(z.object({ ...leaseShape, waitedMs }), { id: "AcquiredLease" });
const LockInfoSchema = doc(
  z.object({
    name: LockName,
    held: z.boolean(),
    fence: z.optional(int()),
    ttlMs: z.optional(int()),
    expiresAt: z.optional(int()),
    waiters: z.optional(int()),
    meta: z.optional(z.record(z.string(), z.unknown())),
    ...holding,
  }),
  { id: "LockInfo" },
);
const RenewManyBody = doc(
  z.strictObject({
    ttlMs: z.optional(duration("ttlMs", "New lease length from now, ms (default 10000)")),
    leases: z.array(
      z.strictObject({
        name: LockName,
        token: Token,
        fence: Fence("As for one"),
        hold: z.optional(holdId("As for one")),
        next: Next("As for one"),
      }),
    )
      .check(
        z.minLength(1),
        z.maxLength(1000),
      ),
  }),
  { id: "RenewManyRequest" },
);

/** Registers the lock routes on `app`. */
export function lockRoutes(app: Hono<AppEnv>): void {
  route(app, {
    ...post("locks", "acquireLock", "/v1/locks/{name}/acquire", NameParams, AcquireBody),
    summary: "Acquire a lock (a retry with the holder's token returns the same fence)",
    responses: {
      200: json(AcquiredSchema, "Acquired"),
      409: problemDoc(
        "lock_busy or queue_full, with retryAfterMs and Retry-After; mode_mismatch (held in " +
          "another mode), limit_mismatch (a semaphore with another limit) or hold_limit (this " +
          "token holds it 64 times already); lock_lost",
      ),
      ...common,
    },
  }, async (c, { params: { name }, body: options }) => {
    const receivedAt = performance.now();
    const result = await waitFor(
      c,
      options.waitMs,
      (signal) => c.var.locks.acquire(name, { ...options, signal }),
    );
    if (!result.acquired) throw busyError(name, result);
    return c.json({ ...leaseBody(result.lease), waitedMs: waited(result.lease, receivedAt) }, 200);
  });

  route(app, {
    tags: ["locks"],
    method: "post",
    path: "/v1/locks/acquire",
    operationId: "acquireLocks",
    summary: "Acquire several locks exclusively, all or none (one script): a lease per name",
    body: AcquireAllBody,
    responses: {
      200: json(
        doc(z.object({ leases: z.array(LeaseSchema), waitedMs }), { id: "AcquiredLeases" }),
        "Acquired, one lease per name in order; renew and release each with the same token",
      ),
      409: problemDoc("lock_busy, queue_full or mode_mismatch, as for one lock"),
      ...common,
    },
  }, async (c, { body: { names, ...options } }) => {
    const receivedAt = performance.now();
    const result = await waitFor(
      c,
      options.waitMs,
      (signal) => c.var.locks.acquireAll(names, { ...options, signal }),
    );
    if (!result.acquired) throw busyError(names.join(", "), result);
    const waitedMs = waited(result.leases[0]!, receivedAt);
    return c.json({ leases: result.leases.map(leaseBody), waitedMs }, 200);
  });

  route(app, {
    ...post("locks", "renewLock", "/v1/locks/{name}/renew", NameParams, RenewBody),
    summary: "Extend a lease held by this token; the fence stays the same",
    responses: { 200: json(LeaseSchema, "Renewed"), 409: problemDoc("lock_lost"), ...common },
  }, async (c, { params: { name }, body: { token, fence, hold, ttlMs, next } }) => {
    const result = await c.var.locks.renew({ name, token, fence, hold, next }, { ttlMs });
    if (!result.renewed) {
      throw new EdgelockError(
        "lock_lost",
        `Cannot renew lock "${name}": the token does not hold it`,
      );
    }
    return c.json(leaseBody(result.lease), 200);
  });

  route(app, {
    tags: ["locks"],
    method: "post",
    path: "/v1/locks/renew",
    operationId: "renewLocks",
    summary: "Renew up to 1000 leases in one request (one script)",
    body: RenewManyBody,
    responses: {
      200: json(
        doc(
          z.object({
            results: z.array(z.union([
              z.object({ ...leaseShape, renewed: z.literal(true) }),
              z.object({ name: LockName, renewed: z.literal(false) }),
            ])),
          }),
          { id: "RenewManyResults" },
        ),
        "One result per lease, in order",
      ),
      ...common,
    },
  }, async (c, { body: { leases, ttlMs } }) => {
    const results = await c.var.locks.renewMany(leases, { ttlMs });
    return c.json({
      results: results.map((result, i) =>
        result.renewed
          ? { ...leaseBody(result.lease), renewed: true as const }
          : { name: leases[i]!.name, renewed: false as const }
      ),
    }, 200);
  });

  route(app, {
    ...post("locks", "releaseLock", "/v1/locks/{name}/release", NameParams, ReleaseBody),
    summary: "Release a lease; released is false when this token no longer held it",
    responses: {
      200: json(doc(z.object({ released: z.boolean() }), { id: "Released" }), "Done"),
      409: problemDoc("mode_mismatch: a reentrant lease, and no hold named"),
      ...common,
    },
  }, async (c, { params: { name }, body: { token, fence, hold, next } }) => {
    return c.json({ released: await c.var.locks.release({ name, token, fence, hold, next }) }, 200);
  });

  route(app, {
    tags: ["locks"],
    method: "get",
    path: "/v1/locks/{name}",
    operationId: "inspectLock",
    summary: "Whether the lock is held, with fence, TTL and meta; never the token",
    params: NameParams,
    responses: { 200: json(LockInfoSchema, "State"), ...common },
  }, async (c, { params: { name } }) => c.json(await c.var.locks.inspect(name), 200));
}

// Waiting stops when the client goes away; each tenant has a bounded number of waits. A call
// that does not wait is one script, so only a wait takes the request's signal.
function waitFor<T>(
  c: Context<AppEnv>,
  waitMs: number | undefined,
  acquire: (signal?: AbortSignal) => Promise<T | typeof GONE>,
): Promise<T | typeof GONE> {
  if (!waitMs) return acquire();
  const signal = c.req.raw.signal;
  return c.var.wait(() =>
    acquire(signal).catch((error) => {
      if (signal.aborted) return GONE;
      throw error;
    })
  );
}
const GONE = { acquired: false as const, retryAfterMs: 1, reason: "busy" as const };

// How long the service waited before the request to Redis that granted the lease, ms.
function waited(lease: Lease, receivedAt: number): number {
  return Math.max(0, Math.floor((sentAtOf(lease) ?? receivedAt) - receivedAt));
}

function leaseBody(lease: Lease) {
  const { name, token, fence, ttlMs, expiresAt, serverTime } = lease;
  return { name, token, fence, ttlMs, expiresAt, serverTime, ...leaseKind(lease) };
}
