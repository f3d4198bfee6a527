import { LockContext } from "../core/_context.ts";
import { integers, type RedisLike } from "../core/_runner.ts";
import { EdgelockError } from "../core/errors.ts";
import {
  checkDuration,
  checkName,
  checkOptions,
  checkTick,
  checkToken,
  FENCE_GRACE_MS,
  JOB_OPTIONS,
  newToken,
} from "../core/_validate.ts";
import type { StoreOptions } from "./records.ts";
import { EXTEND_JOB, FINISH_JOB, START_JOB } from "./scripts.ts";
import { InvalidRange, InvalidType } from "../core/_invalid.ts";

/** Options for {@linkcode Jobs.start}. */
export interface StartJobOptions {
  /** The crash safety net: the lock frees this long after start, 100–86400000 ms. */
  atMostMs: number;
  /** No other run starts until this long after this start, 0–atMostMs. @default 0 */
  atLeastMs?: number;
  /**
   * A scheduled tick (e.g. `controller.scheduledTime`, or the `Date` a Node scheduler passes):
   * each tick runs at most once. A `Date` is its epoch ms, so it names the same tick as the number.
   */
  tick?: string | number | Date;
  /** How long a tick is remembered, ms. @default 7 days */
  tickRetentionMs?: number;
  /**
   * This run's owner token. A start retried with it while its run is unfinished (the first
   * start's reply was lost) is that run again, so each trigger needs a token of its own.
   * @default random
   */
  token?: string;
}

/** The outcome of {@linkcode Jobs.start}. */
export type JobStart =
  | { run: true; token: string; fence: number; expiresAt: number }
  | {
    run: false;
    reason: "running" | "too_soon" | "tick_done";
    /** When the job may start again, ms: for `tick_done`, with a later tick (0: now). */
    retryAfterMs: number;
  };

const DEFAULT_TICK_RETENTION_MS = 7 * 86_400_000;
const JOB_REASONS = { 1: "running", 2: "too_soon", 3: "tick_done" } as const;

/**
 * What `cronGuard` needs of a job store: {@linkcode Jobs} in the library, or the typed client's
 * `jobs` over HTTP, with the same names and results.
 */
export interface JobStore {
  /** Starts a run of `job` unless it runs elsewhere, ran too recently, or ran for this tick. */
  start(job: string, options: StartJobOptions): Promise<JobStart>;
  /** Extends a running job's safety net to `atMostMs` from now. */
  extend(job: string, token: string, atMostMs: number): Promise<JobExtension>;
  /** Finishes `token`'s run; the lock stays until `atLeastMs` after its start. */
  finish(job: string, token: string): Promise<boolean>;
}

/** The outcome of {@linkcode JobStore.extend}. */
export type JobExtension = { extended: true; expiresAt: number } | { extended: false };

/**
 * Scheduled jobs with ShedLock semantics: a run starts unless another runs, one started less than
 * `atLeastMs` ago, or one ran for the same tick; `atMostMs` frees the lock after a crash.
 */
export class Jobs implements JobStore {
  readonly #context: LockContext;

  /** Jobs on `redis` (an `@upstash/redis` client), its keys under `prefix`. */
  constructor(redis: RedisLike, options: StoreOptions = {}) {
    this.#context = new LockContext(redis, "Jobs", options);
  }

  /** Starts a run of `job` unless it runs elsewhere, ran too recently, or ran for this tick. */
  async start(job: string, options: StartJobOptions): Promise<JobStart> {
    checkName(job, "job name");
    checkOptions(options, JOB_OPTIONS, "start()");
    if (options?.atMostMs === undefined) throw new InvalidType("atMostMs is required");
    const atMostMs = checkDuration(options.atMostMs, "atMostMs", 0);
    const atLeastMs = checkDuration(options.atLeastMs, "atLeastMs", 0);
    if (atLeastMs > atMostMs) throw new InvalidRange("atLeastMs must not exceed atMostMs");
    const tickRetentionMs = checkDuration(
      options.tickRetentionMs,
      "retentionMs",
      DEFAULT_TICK_RETENTION_MS,
      "tickRetentionMs",
    );
    const tick = options.tick === undefined ? undefined : checkTick(options.tick);
    const token = options.token === undefined ? newToken() : checkToken(options.token);
    const { jobKey, fenceKey } = this.#jobKeys(job);
    const call = START_JOB.call({
      keys: {
        jobKey,
        fenceKey,
        tickKey: `${jobKey}:tick:${tick ?? ""}`,
        statsKey: this.#context.keys.statsKeys(job).statsKey,
      },
      args: {
        token,
        atMostMs,
        atLeastMs,
        tickKeepMs: tickRetentionMs,
        graceMs: FENCE_GRACE_MS,
        hasTick: tick !== undefined,
      },
    });
    const reply = await this.#context.run(START_JOB, call);
    const [run, a, b, c] = integers(START_JOB, reply, 4) as number[];
    if (run === 1) return { run: true, token, fence: a!, expiresAt: c! + b! };
    const reason = JOB_REASONS[a as 1 | 2 | 3];
    if (!reason) {
      throw new EdgelockError("backend_unavailable", `Redis answered start_job with reason ${a}`);
    }
    return { run: false, reason, retryAfterMs: b! };
  }

  /** Extends a running job's safety net to `atMostMs` from now. */
  async extend(
    job: string,
    token: string,
    atMostMs: number,
  ): Promise<JobExtension> {
    checkName(job, "job name");
    const args = {
      token: checkToken(token),
      atMostMs: checkDuration(atMostMs, "atMostMs", 0),
      graceMs: FENCE_GRACE_MS,
    };
    const call = EXTEND_JOB.call({ keys: this.#jobKeys(job), args });
    const reply = await this.#context.run(EXTEND_JOB, call);
    if (integers(EXTEND_JOB, reply, 2)[0] !== 1) return { extended: false };
    const [, , granted, now] = integers(EXTEND_JOB, reply, 4) as number[];
    return { extended: true, expiresAt: now! + granted! };
  }

  /** Finishes `token`'s run; the lock stays until `atLeastMs` after its start. */
  async finish(job: string, token: string): Promise<boolean> {
    checkName(job, "job name");
    const { jobKey } = this.#jobKeys(job);
    const call = FINISH_JOB.call({ keys: { jobKey }, args: { token: checkToken(token) } });
    const reply = await this.#context.run(FINISH_JOB, call);
    return integers(FINISH_JOB, [reply], 1)[0] === 1;
  }

  #jobKeys(job: string): { jobKey: string; fenceKey: string } {
    const base = `${this.#context.keys.base(job)}:job:{${job}}`;
    return { jobKey: base, fenceKey: `${base}:fence` };
  }
}
