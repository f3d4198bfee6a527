import { LockContext } from "../core/_context.ts";
import { integers, parseJsonText, type RedisLike } from "../core/_runner.ts";
import {
  checkDuration,
  checkName,
  checkOptions,
  checkRecordKind,
  checkToken,
  CLAIM_OPTIONS,
  DEFAULT_LEASE_MS,
  DEFAULT_RETENTION_MS,
  FENCE_GRACE_MS,
  jsonText,
  NAME_PATTERN,
  newToken,
  SEGMENT,
  SEGMENT_PATTERN,
} from "../core/_validate.ts";
import { sha256Hex } from "../core/_crypto.ts";
import { CLAIM, COMPLETE, GET_RECORD, NOTE, RELEASE_CLAIM, RENEW_CLAIM } from "./scripts.ts";
import { InvalidRange, InvalidType } from "../core/_invalid.ts";

/** Options for {@linkcode Records} and {@linkcode Jobs}. */
export interface StoreOptions {
  /** Prefix of every Redis key. @default "edgelock" */
  prefix?: string;
  /** How long one Redis request may take, 1–60000 ms, then `backend_unavailable`. @default 2000 */
  timeoutMs?: number;
  /** Count outcomes in the prefix's stats (`LockOps.stats()`), in the same scripts. @default true */
  stats?: boolean;
  /** Lay the keys out for a Redis Cluster, as `Locks` with `cluster` (the same for both). @default false */
  cluster?: boolean;
  /** Send the scripts with Upstash's `allow-key-locking` flag, as `Locks` with `keyLocking`. */
  keyLocking?: boolean;
}

/** Record kinds; each has its own key space. */
export type RecordKind = "idempotency" | "dedupe";

/** Options for {@linkcode Records.claim}. */
export interface ClaimOptions {
  /** The owner token; choose it before the first attempt to make retries safe. @default random */
  token?: string;
  /** How long the claim lasts if never completed (a crashed worker), 100–3600000 ms. @default 30000 */
  leaseMs?: number;
  /** How long a completed record is kept, 1000–2592000000 ms. @default 86400000 (a day) */
  retentionMs?: number;
  /** Identifies the payload; a claim with another fingerprint is `mismatch`. At most 128 characters. */
  fingerprint?: string;
}

/** The outcome of {@linkcode Records.claim}. */
export type ClaimResult =
  | { state: "claimed"; token: string; fence: number; leaseExpiresAt: number }
  | { state: "completed"; response?: Record<string, unknown> }
  | { state: "in_progress"; retryAfterMs: number }
  | { state: "mismatch" };

/** What anyone may know of a record; never its token. */
export type RecordState =
  | { state: "absent" }
  | { state: "in_progress"; fence: number; leaseExpiresAt: number }
  | { state: "completed"; expiresAt: number; response?: Record<string, unknown> };

const MAX_FINGERPRINT = 128;
/** Largest stored response, as JSON text. */
export const MAX_RESPONSE_BYTES = 48 * 1024;
export { SEGMENT_PATTERN };

// A record id is one segment or scope/segment; a segment is a name or a hashed value (`#` and a
// SHA-256 in hex). Names never hold `#` or `/`, so no two inputs share an id.
const RECORD_ID = new RegExp(`^${SEGMENT}(?:/${SEGMENT})?$`);
const HASHED = /^#[0-9a-f]{64}$/;

/**
 * The id of a record keyed by a scope (e.g. a user id) and a key, each a name or a value hashed
 * by {@linkcode safeName}. `/` cannot occur in either, so no two pairs share an id.
 */
export function recordId(scope: string, key: string): string {
  return `${checkSegment(scope, "scope")}/${checkSegment(key, "key")}`;
}

/**
 * A value as a record id segment: as is when it is a name (1–200 characters of
 * `A-Z a-z 0-9 . _ : -`), else `#` and its SHA-256 in hex. A name never starts with `#`, so
 * two different values never share a segment.
 */
export async function safeName(value: unknown, what = "id"): Promise<string> {
  if (typeof value !== "string" || value === "") {
    throw new InvalidType(`${what} must be a non-empty string`);
  }
  if (NAME_PATTERN.test(value)) return value;
  return `#${await sha256Hex(value)}`;
}

function checkSegment(value: unknown, what: string): string {
  return typeof value === "string" && HASHED.test(value) ? value : checkName(value, what);
}

/**
 * What the uses need of a record store: {@linkcode Records} in the library, or the typed
 * client's `records` over HTTP, with the same names and results.
 */
export interface RecordStore {
  /** Claims `kind`/`id` for one worker, or says why not. */
  claim(kind: RecordKind, id: string, options?: ClaimOptions): Promise<ClaimResult>;
  /** Extends a claim still held by `token`, to `leaseMs` from now (default 30000). */
  renew(kind: RecordKind, id: string, token: string, leaseMs?: number): Promise<ClaimRenewal>;
  /** Completes `token`'s claim, keeping `response`; `false` when the claim is no longer its. */
  complete(
    kind: RecordKind,
    id: string,
    token: string,
    response?: Record<string, unknown>,
  ): Promise<boolean>;
  /** Gives up `token`'s claim, so a retry may redo the work. */
  release(kind: RecordKind, id: string, token: string): Promise<boolean>;
  /** The record's state; never its token. */
  get(kind: RecordKind, id: string): Promise<RecordState>;
  /** Counts a webhook whose signature failed, where stats are kept; never throws. */
  noteSignatureFailure?(): Promise<void>;
}

/** The outcome of {@linkcode RecordStore.renew}. */
export type ClaimRenewal = { renewed: true; leaseExpiresAt: number } | { renewed: false };

/**
 * The "exactly once" state machine behind idempotency and webhook deduplication: absent →
 * claimed (a short lease with an owner token and fence) → completed (kept for its retention), or
 * back to absent on release. Every transition is one script; complete and release check the owner
 * token, so a late worker can never overwrite a newer result.
 */
export class Records implements RecordStore {
  readonly #context: LockContext;

  /** Records on `redis` (an `@upstash/redis` client), its keys under `prefix`. */
  constructor(redis: RedisLike, options: StoreOptions = {}) {
    this.#context = new LockContext(redis, "Records", options);
  }

  /**
   * Counts a webhook whose signature failed in the stats (`dedupe.signature_failed`): no claim
   * script sees it. Never throws; nothing with stats off.
   */
  async noteSignatureFailure(): Promise<void> {
    if (!this.#context.keys.stats) return;
    const { statsKey } = this.#context.keys.statsKeys(""); // one bucket's, in the cluster layout
    const call = NOTE.call({
      keys: { statsKey: statsKey! },
      args: { field: "dedupe.signature_failed" },
    });
    await this.#context.run(NOTE, call).catch(() => {});
  }

  /** Claims `kind`/`id` for one worker, or says why not. */
  async claim(kind: RecordKind, id: string, options: ClaimOptions = {}): Promise<ClaimResult> {
    checkOptions(options, CLAIM_OPTIONS, "claim()");
    const keys = this.#recordKeys(kind, id);
    const token = options.token === undefined ? newToken() : checkToken(options.token);
    const leaseMs = checkDuration(options.leaseMs, "leaseMs", DEFAULT_LEASE_MS);
    const retentionMs = checkDuration(options.retentionMs, "retentionMs", DEFAULT_RETENTION_MS);
    const fingerprint = options.fingerprint ?? "";
    if (typeof fingerprint !== "string" || fingerprint.length > MAX_FINGERPRINT) {
      throw new InvalidRange(
        `fingerprint must be a string of at most ${MAX_FINGERPRINT} characters`,
      );
    }
    const { statsKey } = this.#context.keys.statsKeys(id);
    const reply = await this.#context.run(
      CLAIM,
      CLAIM.call({
        keys: { ...keys, statsKey },
        args: {
          token,
          leaseMs,
          retentionMs: String(retentionMs),
          fingerprint,
          graceMs: FENCE_GRACE_MS,
          label: kind,
        },
      }),
    );
    const [outcome] = integers(CLAIM, reply, 2);
    if (outcome === 1) {
      const [, fence, granted, now] = integers(CLAIM, reply, 4) as number[];
      return { state: "claimed", token, fence: fence!, leaseExpiresAt: now! + granted! };
    }
    if (outcome === 0) {
      return { state: "in_progress", retryAfterMs: Math.max(1, integers(CLAIM, reply, 2)[1]!) };
    }
    if (outcome === 2) {
      const response = parseJsonText((reply as unknown[])[2]);
      return response ? { state: "completed", response } : { state: "completed" };
    }
    return { state: "mismatch" };
  }

  /** Extends a claim still held by `token`. */
  async renew(
    kind: RecordKind,
    id: string,
    token: string,
    leaseMs = DEFAULT_LEASE_MS,
  ): Promise<ClaimRenewal> {
    const keys = this.#recordKeys(kind, id);
    const args = {
      token: checkToken(token),
      leaseMs: checkDuration(leaseMs, "leaseMs", 0),
      graceMs: FENCE_GRACE_MS,
    };
    const reply = await this.#context.run(RENEW_CLAIM, RENEW_CLAIM.call({ keys, args }));
    if (integers(RENEW_CLAIM, reply, 2)[0] !== 1) return { renewed: false };
    const [, , granted, now] = integers(RENEW_CLAIM, reply, 4) as number[];
    return { renewed: true, leaseExpiresAt: now! + granted! };
  }

  /**
   * Completes `token`'s claim, keeping `response` (a JSON object, at most 48 KiB) for the
   * retention. `false` when the claim is no longer this token's: the newer result stands.
   */
  async complete(
    kind: RecordKind,
    id: string,
    token: string,
    response?: Record<string, unknown>,
  ): Promise<boolean> {
    const keys = this.#recordKeys(kind, id);
    const text = response === undefined ? "" : jsonText(response, "response");
    if (response !== undefined && (typeof response !== "object" || Array.isArray(response))) {
      throw new InvalidType("response must be a JSON object");
    }
    if (new TextEncoder().encode(text).length > MAX_RESPONSE_BYTES) {
      throw new InvalidRange(`response must be at most ${MAX_RESPONSE_BYTES} bytes as JSON`);
    }
    const { recordKey } = keys;
    const args = { token: checkToken(token), response: text };
    const reply = await this.#context.run(COMPLETE, COMPLETE.call({ keys: { recordKey }, args }));
    return integers(COMPLETE, [reply], 1)[0] === 1;
  }

  /** Gives up `token`'s claim (the work failed cleanly, so a retry may redo it). */
  async release(kind: RecordKind, id: string, token: string): Promise<boolean> {
    const { recordKey } = this.#recordKeys(kind, id);
    const call = RELEASE_CLAIM.call({ keys: { recordKey }, args: { token: checkToken(token) } });
    const reply = await this.#context.run(RELEASE_CLAIM, call);
    return integers(RELEASE_CLAIM, [reply], 1)[0] === 1;
  }

  /** Reads a record's state on the primary; never its token. */
  async get(kind: RecordKind, id: string): Promise<RecordState> {
    const { recordKey } = this.#recordKeys(kind, id);
    const reply = await this.#context.run(
      GET_RECORD,
      GET_RECORD.call({ keys: { recordKey }, args: {} }),
    );
    const [outcome] = integers(GET_RECORD, reply, 2);
    if (outcome === 0) return { state: "absent" };
    const [, now, pttl] = integers(GET_RECORD, reply, 3) as number[];
    if (outcome === 1) {
      const [, , , fence] = integers(GET_RECORD, reply, 4);
      return { state: "in_progress", fence: fence!, leaseExpiresAt: now! + pttl! };
    }
    const response = parseJsonText((reply as unknown[])[3]);
    return { state: "completed", expiresAt: now! + pttl!, ...(response && { response }) };
  }

  // The id sits in a hash tag so a record's keys share a cluster slot.
  #recordKeys(kind: RecordKind, id: string): { recordKey: string; fenceKey: string } {
    checkRecordKind(kind);
    if (typeof id !== "string" || !RECORD_ID.test(id)) {
      throw new InvalidRange(`The ${kind} id must be a name or scope/key, from recordId()`);
    }
    const base = `${this.#context.keys.base(id)}:${kind}:{${id}}`;
    return { recordKey: base, fenceKey: `${base}:fence` };
  }
}
