// Cron jobs over HTTP: start a run (or learn why not), extend its safety net, finish it.
import * as z from "zod/mini";
import type { Hono } from "hono";
import type { AppEnv } from "../_env.ts";
import { route } from "../_route.ts";
import { common, doc, duration, int, json, name, post, Token, TokenBody } from "../_schemas.ts";

const JobParam = z.object({ job: name() });
const StartBody = doc(
  z.strictObject({
    atMostMs: duration("atMostMs", "The crash safety net, ms"),
    atLeastMs: z.optional(duration("atLeastMs", "Minimum time between starts, ms (≤ atMostMs)")),
    tick: z.optional(doc(
      z.union([
        z.string().check(
          z.regex(
            /^[A-Za-z0-9._:-]{1,200}$/,
            "tick must be 1–200 characters of A-Z a-z 0-9 . _ : -",
          ),
        ),
        z.number().check(z.int(), z.minimum(0, "tick must be a whole number ≥ 0")),
      ], {
        error: "tick must be 1–200 characters of A-Z a-z 0-9 . _ : - or a whole number ≥ 0",
      }),
      { description: "Each tick runs at most once, e.g. the scheduled time" },
    )),
    tickRetentionMs: z.optional(
      duration("retentionMs", "How long a tick is remembered, ms (default 7 days)"),
    ),
    token: z.optional(Token),
  }),
  { id: "JobStartRequest" },
);
const ExtendBody = doc(
  z.strictObject({
    token: Token,
    atMostMs: duration("atMostMs", "The new safety net from now, ms"),
  }),
  { id: "JobExtendRequest" },
);

/** Registers the job routes on `app`. */
export function jobRoutes(app: Hono<AppEnv>): void {
  route(app, {
    ...post("jobs", "startJob", "/v1/jobs/{job}/start", JobParam, StartBody),
    summary: "Start a run unless it runs elsewhere, ran too recently, or ran for this tick",
    responses: {
      200: json(
        z.union([
          z.object({ run: z.literal(true), token: Token, fence: int(), expiresAt: int() }),
          z.object({
            run: z.literal(false),
            reason: z.enum(["running", "too_soon", "tick_done"]),
            retryAfterMs: int(),
          }),
        ]),
        "Whether to run",
      ),
      ...common,
    },
  }, async (c, { params: { job }, body }) => c.json(await c.var.jobs.start(job, body), 200));

  route(
    app,
    {
      ...post("jobs", "extendJob", "/v1/jobs/{job}/extend", JobParam, ExtendBody),
      summary: "Extend a running job's safety net to atMostMs from now (this run's token only)",
      responses: {
        200: json(
          doc(
            z.union([
              z.object({ extended: z.literal(true), expiresAt: int() }),
              z.object({ extended: z.literal(false) }),
            ]),
            { id: "JobExtension" },
          ),
          "Whether the run still held the job",
        ),
        ...common,
      },
    },
    async (c, { params: { job }, body: { token, atMostMs } }) =>
      c.json(await c.var.jobs.extend(job, token, atMostMs), 200),
  );

  route(
    app,
    {
      ...post("jobs", "finishJob", "/v1/jobs/{job}/finish", JobParam, TokenBody),
      summary: "Finish a run; the lock stays until atLeastMs after its start",
      responses: { 200: json(z.object({ finished: z.boolean() }), "Done"), ...common },
    },
    async (c, { params: { job }, body: { token } }) =>
      c.json({ finished: await c.var.jobs.finish(job, token) }, 200),
  );
}
