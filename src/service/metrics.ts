/**
 * The stats in the Prometheus text exposition format (version 0.0.4): base units (seconds),
 * `_total` counters, and only the labels `tenant` and `outcome`, never a lock name, so the
 * number of series is bounded by tenants × outcomes.
 *
 * @module
 */
import type { Counts, Histogram, Stats } from "../core/stats.ts";

type Series = { labels: Record<string, string>; value: number };

interface Family {
  name: string;
  type: "counter" | "gauge";
  help: string;
  series: (counts: Counts, stats: Stats) => Series[];
}

const byOutcome = (group: Record<string, number>): Series[] =>
  Object.entries(group).map(([outcome, value]) => ({ labels: { outcome }, value }));

const FAMILIES: Family[] = [
  {
    name: "edgelock_acquire_total",
    type: "counter",
    help: "Lock acquisitions by outcome: granted, busy (no wait), timeout, queue_full, aborted.",
    series: (c) => byOutcome(c.acquire),
  },
  {
    name: "edgelock_renew_total",
    type: "counter",
    help: "Lease renewals by outcome: renewed, or lost (the lease was gone).",
    series: (c) => byOutcome(c.renew),
  },
  {
    name: "edgelock_release_total",
    type: "counter",
    help: "Lease releases by outcome: released, or lost (the lease was gone).",
    series: (c) => byOutcome(c.release),
  },
  {
    name: "edgelock_lease_lost_total",
    type: "counter",
    help: "Renewals and releases that found their lease gone: expired, broken or taken over.",
    series: (c) => [{ labels: {}, value: c.lease_lost }],
  },
  {
    name: "edgelock_break_total",
    type: "counter",
    help: "Locks broken by an operator.",
    series: (c) => [{ labels: {}, value: c.break.broken }],
  },
  {
    name: "edgelock_idempotency_total",
    type: "counter",
    help: "Idempotency keys by outcome: first run, replay, conflict (in flight), mismatch.",
    series: (c) => byOutcome(c.idempotency),
  },
  {
    name: "edgelock_dedupe_total",
    type: "counter",
    help: "Webhook deliveries (and other dedupe ids) by outcome: first, replay (a duplicate of " +
      "a processed one), conflict (a duplicate while in flight), mismatch, signature_failed.",
    series: (c) => byOutcome(c.dedupe),
  },
  {
    name: "edgelock_cron_total",
    type: "counter",
    help: "Cron job starts by outcome: run, or skipped as running, too_soon or tick_done.",
    series: (c) => byOutcome(c.cron),
  },
  {
    name: "edgelock_locks_held",
    type: "gauge",
    help: "Locks held now.",
    series: (_, s) => [{ labels: {}, value: s.locks_held }],
  },
];

const HISTOGRAMS = [
  ["edgelock_wait_seconds", "wait", "Time from an acquire call to its grant, seconds."],
  ["edgelock_hold_seconds", "hold", "Time from a grant to its release, seconds."],
] as const;

/** The exposition of each tenant's totals. */
export function toPrometheus(tenants: readonly { tenant: string; stats: Stats }[]): string {
  const lines: string[] = [];
  for (const family of FAMILIES) {
    lines.push(`# HELP ${family.name} ${family.help}`, `# TYPE ${family.name} ${family.type}`);
    for (const { tenant, stats } of tenants) {
      for (const { labels, value } of family.series(stats.total, stats)) {
        lines.push(`${family.name}${labelText({ tenant, ...labels })} ${value}`);
      }
    }
  }
  for (const [name, field, help] of HISTOGRAMS) {
    lines.push(`# HELP ${name} ${help}`, `# TYPE ${name} histogram`);
    for (const { tenant, stats } of tenants) {
      histogramLines(lines, name, tenant, stats.total[field]);
    }
  }
  return lines.join("\n") + "\n";
}

function histogramLines(lines: string[], name: string, tenant: string, h: Histogram): void {
  let cumulative = 0;
  for (const { le_ms, count } of h.buckets) {
    cumulative += count;
    const le = le_ms === null ? "+Inf" : String(le_ms / 1000);
    lines.push(`${name}_bucket${labelText({ tenant, le })} ${cumulative}`);
  }
  lines.push(`${name}_sum${labelText({ tenant })} ${(h.sum_ms ?? 0) / 1000}`);
  lines.push(`${name}_count${labelText({ tenant })} ${h.count}`);
}

// Label values escaped as the format asks: backslash, double quote and newline.
function labelText(labels: Record<string, string>): string {
  const pairs = Object.entries(labels).map(([k, v]) =>
    `${k}="${v.replace(/\\/g, "\\\\").replace(/"/g, '\\"').replace(/\n/g, "\\n")}"`
  );
  return `{${pairs.join(",")}}`;
}
