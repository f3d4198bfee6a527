// Cron jobs over HTTP, with the surface of the library's `Jobs`.
import {
  checkDuration,
  checkName,
  checkOptions,
  checkTick,
  checkToken,
  JOB_OPTIONS,
  newToken,
} from "../core/_validate.ts";
import type { JobExtension, JobStart, JobStore, StartJobOptions } from "../uses/jobs.ts";
import type { Http } from "./_http.ts";
import { InvalidType } from "../core/_invalid.ts";

/** The job store over `http`. */
export function createJobs(http: Http): JobStore {
  const jobPath = (job: string, action: string) =>
    `v1/jobs/${encodeURIComponent(checkName(job, "job name"))}/${action}`;
  return {
    async start(job: string, opts: StartJobOptions): Promise<JobStart> {
      checkOptions(opts, JOB_OPTIONS, "start()");
      if (opts?.atMostMs === undefined) throw new InvalidType("atMostMs is required");
      const body = {
        ...opts,
        token: opts.token === undefined ? newToken() : checkToken(opts.token),
        ...(opts.tick !== undefined && { tick: checkTick(opts.tick) }),
      };
      return await http.ok("POST", jobPath(job, "start"), body);
    },
    async extend(job: string, token: string, atMostMs: number): Promise<JobExtension> {
      const body = { token: checkToken(token), atMostMs: checkDuration(atMostMs, "atMostMs", 0) };
      return await http.ok("POST", jobPath(job, "extend"), body);
    },
    async finish(job: string, token: string): Promise<boolean> {
      const data = await http.ok<{ finished?: unknown }>("POST", jobPath(job, "finish"), {
        token: checkToken(token),
      });
      return data.finished === true;
    },
  };
}
