// Idempotency keys and deduplicated ids over HTTP, with the surface of the library's `Records`.
import {
  checkDuration,
  checkOptions,
  checkRecordKind,
  checkToken,
  CLAIM_OPTIONS,
  DEFAULT_LEASE_MS,
  DEFAULT_RETENTION_MS,
  jsonText,
  newToken,
  SEGMENT_PATTERN,
} from "../core/_validate.ts";
import type {
  ClaimOptions,
  ClaimRenewal,
  ClaimResult,
  RecordKind,
  RecordState,
  RecordStore,
} from "../uses/records.ts";
import { fromProblem, type Http } from "./_http.ts";
import { InvalidRange } from "../core/_invalid.ts";

type Data = Record<string, unknown>;

/** The records store over `http`. */
export function createRecords(http: Http): RecordStore {
  return {
    async claim(kind: RecordKind, id: string, opts: ClaimOptions = {}): Promise<ClaimResult> {
      checkOptions(opts, CLAIM_OPTIONS, "claim()");
      const body = {
        token: opts.token === undefined ? newToken() : checkToken(opts.token),
        leaseMs: checkDuration(opts.leaseMs, "leaseMs", DEFAULT_LEASE_MS),
        retentionMs: checkDuration(opts.retentionMs, "retentionMs", DEFAULT_RETENTION_MS),
        ...(opts.fingerprint !== undefined && { fingerprint: opts.fingerprint }),
      };
      const { status, data } = await http.call("POST", recordPath(kind, id, "claim"), body);
      return claimResult(status, data);
    },
    async renew(kind, id, token, leaseMs = DEFAULT_LEASE_MS): Promise<ClaimRenewal> {
      const body = { token: checkToken(token), leaseMs: checkDuration(leaseMs, "leaseMs", 0) };
      return await http.ok("POST", recordPath(kind, id, "renew"), body);
    },
    async complete(kind, id, token, response): Promise<boolean> {
      jsonText(response, "response");
      const body = { token: checkToken(token), ...(response !== undefined && { response }) };
      const action = kind === "dedupe" ? "done" : "complete";
      const { status, data } = await http.call("POST", recordPath(kind, id, action), body);
      if (status === 200) return true;
      if (data.code === "lease_lost") return false;
      throw fromProblem(status, data);
    },
    async release(kind, id, token): Promise<boolean> {
      const body = { token: checkToken(token) };
      const data = await http.ok<Data>("POST", recordPath(kind, id, "release"), body);
      return data.released === true;
    },
    async get(kind, id): Promise<RecordState> {
      const data = await http.ok<Data>("GET", recordPath(kind, id));
      return (data.state === "done" ? { ...data, state: "completed" } : data) as RecordState;
    },
  };
}

// A claim's reply: 201 is a new claim, 200 a completed one (with its stored response).
function claimResult(status: number, data: Data): ClaimResult {
  if (status === 201) return data as unknown as ClaimResult;
  if (status === 200) {
    const response = data.response as Data | undefined;
    return response ? { state: "completed", response } : { state: "completed" };
  }
  if (data.code === "in_progress") {
    return { state: "in_progress", retryAfterMs: Number(data.retryAfterMs) || 1 };
  }
  if (data.code === "fingerprint_mismatch") return { state: "mismatch" };
  throw fromProblem(status, data);
}

// Over HTTP a record id is scope/key (idempotency) or namespace/id (dedupe), as recordId() makes.
function recordPath(kind: RecordKind, id: string, action?: string): string {
  checkRecordKind(kind);
  const parts = typeof id === "string" ? id.split("/") : [];
  if (parts.length !== 2 || !parts.every((part) => SEGMENT_PATTERN.test(part))) {
    throw new InvalidRange(`The ${kind} id must be scope/key, from recordId()`);
  }
  const path = `v1/${kind}/${parts.map(encodeURIComponent).join("/")}`;
  return action ? `${path}/${action}` : path;
}
