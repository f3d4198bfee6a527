/**
 * OpenTelemetry for edgelock: `openTelemetry()` gives a `Locks` `onEvent` hook that records a
 * span per lock operation and metrics through `@opentelemetry/api`. Without an SDK the API is a
 * no-op; Deno exports what it records by itself (`OTEL_DENO=true`), and Node or a Worker export
 * through whatever SDK the application registers. Lock names are left out of spans unless asked
 * for (`lockNames: "hash"` or `"plain"`); metrics never carry a name, so their cardinality stays
 * bounded.
 *
 * @example
 * ```ts
 * import { Redis } from "@upstash/redis";
 * import { Locks } from "@edgelock/edgelock";
 * import { openTelemetry } from "@edgelock/edgelock/otel";
 *
 * const locks = new Locks(Redis.fromEnv(), { onEvent: openTelemetry() });
 * ```
 *
 * @module
 */
import {
  type Attributes,
  type Meter,
  metrics,
  SpanKind,
  SpanStatusCode,
  trace,
  type Tracer,
} from "@opentelemetry/api";
import type { LockEvent } from "../core/types.ts";
import { WAIT_BUCKETS_MS } from "../core/stats.ts";
import { InvalidRange } from "../core/_invalid.ts";

/** Options for {@linkcode openTelemetry}. */
export interface OpenTelemetryOptions {
  /** The tracer spans are made with. @default trace.getTracer("edgelock") */
  tracer?: Tracer;
  /** The meter metrics are made with. @default metrics.getMeter("edgelock") */
  meter?: Meter;
  /**
   * Whether spans carry the lock name: `omit`, `hash` (FNV-1a, to correlate spans, not to hide a
   * guessable name) or `plain`. @default "omit"
   */
  lockNames?: "omit" | "hash" | "plain";
}

/** An `onEvent` hook for `new Locks(redis, { onEvent })` (the service's events carry a tenant). */
export function openTelemetry(
  { tracer, meter, lockNames = "omit" }: OpenTelemetryOptions = {},
): (event: LockEvent & { tenant?: string }) => void {
  if (!["omit", "hash", "plain"].includes(lockNames)) {
    throw new InvalidRange('lockNames must be "omit", "hash" or "plain"');
  }
  tracer ??= trace.getTracer("edgelock");
  meter ??= metrics.getMeter("edgelock");
  const operations = meter.createCounter("edgelock.operations", {
    description: "Lock operations by operation and outcome",
    unit: "{operation}",
  });
  const durations = meter.createHistogram("edgelock.operation.duration", {
    description: "How long each lock operation took, waits included",
    unit: "s",
  });
  const waits = meter.createHistogram("edgelock.lock.wait.duration", {
    description: "Time from an acquire call to its grant",
    unit: "s",
    advice: { explicitBucketBoundaries: WAIT_BUCKETS_MS.map((ms) => ms / 1000) },
  });
  return (event) => {
    const operation = event.type === "error" ? event.operation : event.type;
    const outcome = event.type === "error"
      ? "error"
      : "outcome" in event
      ? event.outcome
      : event.type;
    const attributes: Attributes = {
      "edgelock.operation": operation,
      "edgelock.outcome": outcome,
      ...(event.tenant !== undefined && { "edgelock.tenant": event.tenant }),
    };
    if (event.type === "wait") return; // a look while waiting is part of the acquire's span
    operations.add(1, attributes);
    durations.record(event.durationMs / 1000, attributes);
    if (event.type === "acquire" && event.outcome === "granted") {
      waits.record(event.waitedMs / 1000, event.tenant ? { "edgelock.tenant": event.tenant } : {});
    }
    const span = tracer.startSpan(`edgelock ${operation}`, {
      kind: SpanKind.CLIENT,
      startTime: event.at - event.durationMs,
      attributes: {
        ...attributes,
        ...("fence" in event && event.fence !== undefined && { "edgelock.fence": event.fence }),
        ...(lockNames === "plain" && event.name && { "edgelock.lock.name": event.name }),
        ...(lockNames === "hash" && event.name && { "edgelock.lock.name_hash": fnv1a(event.name) }),
      },
    });
    if (event.type === "error") {
      span.recordException(event.error instanceof Error ? event.error : String(event.error));
      span.setStatus({ code: SpanStatusCode.ERROR, message: "Redis failed" });
    } else if (event.type === "lost") {
      span.setStatus({ code: SpanStatusCode.ERROR, message: "lease lost" });
    }
    span.end(event.at);
  };
}

// FNV-1a, 32 bits, as 8 hex digits: synchronous and small, for correlation only.
function fnv1a(text: string): string {
  let hash = 0x811c9dc5;
  for (const byte of new TextEncoder().encode(text)) {
    hash ^= byte;
    hash = Math.imul(hash, 0x01000193) >>> 0;
  }
  return hash.toString(16).padStart(8, "0");
}
