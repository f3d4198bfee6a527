// OpenTelemetry through @opentelemetry/api, recorded by the real SDKs' in-memory exporters.
import assert from "node:assert/strict";
import {
  BasicTracerProvider,
  InMemorySpanExporter,
  SimpleSpanProcessor,
} from "@opentelemetry/sdk-trace-base";
import {
  AggregationTemporality,
  InMemoryMetricExporter,
  MeterProvider,
  PeriodicExportingMetricReader,
} from "@opentelemetry/sdk-metrics";
import { LockOps, Locks } from "../src/core/mod.ts";
import { openTelemetry } from "../src/otel/mod.ts";
import { keygen, shared, startBackend } from "./_backend.ts";
import { freePort } from "../dev/redis_server.ts";

const fixture = shared(async () => {
  const backend = await startBackend();
  const spans = new InMemorySpanExporter();
  const tracerProvider = new BasicTracerProvider({
    spanProcessors: [new SimpleSpanProcessor(spans)],
  });
  const exporter = new InMemoryMetricExporter(AggregationTemporality.CUMULATIVE);
  const reader = new PeriodicExportingMetricReader({ exporter, exportIntervalMillis: 60_000 });
  const meterProvider = new MeterProvider({ readers: [reader] });
  return { backend, spans, tracerProvider, exporter, reader, meterProvider };
}, async ({ backend, tracerProvider, meterProvider }) => {
  await meterProvider.shutdown();
  await tracerProvider.shutdown();
  await backend.stop();
});

Deno.test("a span per operation, with outcome and fence, and no lock name by default", async () => {
  const { backend, spans, tracerProvider, exporter, reader, meterProvider } = await fixture();
  const locks = new Locks(backend.redis, {
    prefix: keygen("otel"),
    onEvent: openTelemetry({
      tracer: tracerProvider.getTracer("edgelock"),
      meter: meterProvider.getMeter("edgelock"),
    }),
  });
  const first = await locks.acquire("secret-customer-42", { ttlMs: 5000 });
  assert.ok(first.acquired);
  assert.equal((await locks.acquire("secret-customer-42", { waitMs: 100 })).acquired, false);
  await locks.renew(first.lease);
  await locks.release(first.lease);
  const finished = spans.getFinishedSpans();
  assert.deepEqual(
    finished.map((s) => [s.name, s.attributes["edgelock.outcome"]]),
    [
      ["edgelock acquire", "granted"],
      ["edgelock acquire", "timeout"],
      ["edgelock renew", "renewed"],
      ["edgelock release", "released"],
    ],
  );
  assert.equal(finished[0]!.attributes["edgelock.fence"], first.lease.fence);
  const timeout = finished[1]!;
  const ms = (timeout.endTime[0] - timeout.startTime[0]) * 1000 +
    (timeout.endTime[1] - timeout.startTime[1]) / 1e6;
  assert.ok(ms >= 90 && ms < 2000, `the waiting acquire's span lasts its wait: ${ms} ms`);
  assert.ok(
    !JSON.stringify(finished.map((s) => s.attributes)).includes("secret-customer-42"),
    "no lock name in any span",
  );

  await reader.forceFlush();
  const exported = exporter.getMetrics().at(-1)!.scopeMetrics[0]!.metrics;
  const counter = exported.find((m) => m.descriptor.name === "edgelock.operations")!;
  const count = (operation: string, outcome: string) =>
    counter.dataPoints.find((p) =>
      p.attributes["edgelock.operation"] === operation &&
      p.attributes["edgelock.outcome"] === outcome
    )?.value;
  assert.equal(count("acquire", "granted"), 1);
  assert.equal(count("acquire", "timeout"), 1);
  assert.equal(count("release", "released"), 1);
  const waits = exported.find((m) => m.descriptor.name === "edgelock.lock.wait.duration")!;
  assert.equal(waits.descriptor.unit, "s");
  assert.equal((waits.dataPoints[0]!.value as { count: number }).count, 1);
});

Deno.test("lock names are hashed or kept only when asked, and a lost lease is an error", async () => {
  const { backend, spans, tracerProvider } = await fixture();
  spans.reset();
  const options = {
    prefix: keygen("otel"),
    onEvent: openTelemetry({ tracer: tracerProvider.getTracer("e"), lockNames: "hash" }),
  };
  const hashed = new Locks(backend.redis, options);
  const lease = await hashed.acquire("n1");
  assert.ok(lease.acquired);
  await new LockOps(backend.redis, options).break("n1", { by: "ops" });
  assert.equal(await hashed.release(lease.lease), false);
  const [granted, lost] = spans.getFinishedSpans();
  assert.match(String(granted!.attributes["edgelock.lock.name_hash"]), /^[0-9a-f]{8}$/);
  assert.equal(granted!.attributes["edgelock.lock.name"], undefined);
  assert.equal(lost!.attributes["edgelock.outcome"], "lost");
  assert.throws(() => openTelemetry({ lockNames: "all" as "plain" }), RangeError);
});

Deno.test("a Redis failure is an error span, and the call still fails as before", async () => {
  const { backend, spans, tracerProvider } = await fixture();
  spans.reset();
  // Nothing listens on a free port: connection refused, an outage to retry.
  const down = new Locks(backend.client({ url: `http://127.0.0.1:${await freePort()}` }), {
    timeoutMs: 500,
    onEvent: openTelemetry({ tracer: tracerProvider.getTracer("e") }),
  });
  await assert.rejects(down.acquire("x"), { code: "backend_unavailable" });
  const [span] = spans.getFinishedSpans();
  assert.equal(span!.name, "edgelock acquire");
  assert.equal(span!.status.code, 2 /* ERROR */);
});
