// Cron jobs over HTTP: start a run (or learn why not), extend its safety net, finish it.
import { createRoute, type OpenAPIHono, z } from "@hono/zod-openapi";
import type { AppEnv } from "../_env.ts";
import { common, duration, json, nameParam, post, Token, TokenBody } from "../_schemas.ts";

const JobParam = z.object({ job: nameParam("job") });
const StartBody = z.strictObject({
  atMostMs: duration("atMostMs", "The crash safety net, ms"),
  atLeastMs: duration("atLeastMs", "Minimum time between starts, ms (≤ atMostMs)").optional(),
  tick: z.union([z.string().regex(/^[A-Za-z0-9._:-]{1,200}$/), z.number().int().nonnegative()])
    .optional().openapi({ description: "Each tick runs at most once, e.g. the scheduled time" }),
  tickRetentionMs: duration("retentionMs", "How long a tick is remembered, ms (default 7 days)")
    .optional(),
  token: Token.optional(),
}).openapi("JobStartRequest");
const ExtendBody = z.strictObject({
  token: Token,
  atMostMs: duration("atMostMs", "The new safety net from now, ms"),
}).openapi("JobExtendRequest");

/** Registers the job routes on `app`. */
export function jobRoutes(app: OpenAPIHono<AppEnv>): void {
  app.openapi(
    createRoute({
      ...post("jobs", "startJob", "/v1/jobs/{job}/start", JobParam, StartBody),
      summary: "Start a run unless it runs elsewhere, ran too recently, or ran for this tick",
      responses: {
        200: json(
          z.union([
            z.object({
              run: z.literal(true),
              token: Token,
              fence: z.number().int(),
              expiresAt: z.number().int(),
            }),
            z.object({
              run: z.literal(false),
              reason: z.enum(["running", "too_soon", "tick_done"]),
              retryAfterMs: z.number().int(),
            }),
          ]),
          "Whether to run",
        ),
        ...common,
      },
    }),
    async (c) => {
      const { job } = c.req.valid("param");
      return c.json(await c.var.jobs.start(job, c.req.valid("json")), 200);
    },
  );
  app.openapi(
    createRoute({
      ...post("jobs", "extendJob", "/v1/jobs/{job}/extend", JobParam, ExtendBody),
      summary: "Extend a running job's safety net to atMostMs from now (this run's token only)",
      responses: {
        200: json(
          z.union([
            z.object({ extended: z.literal(true), expiresAt: z.number().int() }),
            z.object({ extended: z.literal(false) }),
          ]).openapi("JobExtension"),
          "Whether the run still held the job",
        ),
        ...common,
      },
    }),
    async (c) => {
      const { job } = c.req.valid("param");
      const { token, atMostMs } = c.req.valid("json");
      return c.json(await c.var.jobs.extend(job, token, atMostMs), 200);
    },
  );
  app.openapi(
    createRoute({
      ...post("jobs", "finishJob", "/v1/jobs/{job}/finish", JobParam, TokenBody),
      summary: "Finish a run; the lock stays until atLeastMs after its start",
      responses: { 200: json(z.object({ finished: z.boolean() }), "Done"), ...common },
    }),
    async (c) => {
      const { job } = c.req.valid("param");
      const finished = await c.var.jobs.finish(job, c.req.valid("json").token);
      return c.json({ finished }, 200);
    },
  );
}
