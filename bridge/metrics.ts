// The bridge's Prometheus metrics (text exposition format 0.0.4): requests by route and status,
// commands, Redis error replies, request latency by route, and pool use. Labels are fixed words
// (routes, status codes, pools), never a key or a command's arguments.

/** What one request was, for the metrics and the request log. */
export interface RequestRecord {
  /** `command` (`/`), `path` (`/get/k`), `pipeline`, `multi-exec`, `subscribe`, `psubscribe`. */
  route: string;
  status: number;
  seconds: number;
  /** Redis commands the request carried. */
  commands: number;
  /** Commands answered with a Redis error (in their slot, or as the whole reply). */
  errors: number;
}

const BUCKETS = [
  0.0005,
  0.001,
  0.0025,
  0.005,
  0.01,
  0.025,
  0.05,
  0.1,
  0.25,
  0.5,
  1,
  2.5,
  5,
  10,
  30,
];

interface Latency {
  counts: number[];
  sum: number;
  count: number;
}

/** Counters kept in memory since the bridge started. */
export class BridgeMetrics {
  #requests = new Map<string, number>();
  #latency = new Map<string, Latency>();
  #commands = 0;
  #errors = 0;

  record({ route, status, seconds, commands, errors }: RequestRecord): void {
    const key = `${route} ${status}`;
    this.#requests.set(key, (this.#requests.get(key) ?? 0) + 1);
    this.#commands += commands;
    this.#errors += errors;
    let latency = this.#latency.get(route);
    if (!latency) {
      this.#latency.set(
        route,
        latency = { counts: BUCKETS.map(() => 0), sum: 0, count: 0 },
      );
    }
    const at = BUCKETS.findIndex((le) => seconds <= le);
    if (at >= 0) latency.counts[at]!++;
    latency.sum += seconds;
    latency.count++;
  }

  /** The exposition; `pools` are gauges by pool name (in use, and size where it has one). */
  text(pools: Record<string, { in_use: number; size?: number }>): string {
    const lines = [
      "# HELP edgelock_bridge_requests_total HTTP requests by route and status.",
      "# TYPE edgelock_bridge_requests_total counter",
    ];
    for (const [key, value] of [...this.#requests].sort()) {
      const [route, status] = key.split(" ");
      lines.push(`edgelock_bridge_requests_total{route="${route}",status="${status}"} ${value}`);
    }
    lines.push(
      "# HELP edgelock_bridge_commands_total Redis commands the requests carried.",
      "# TYPE edgelock_bridge_commands_total counter",
      `edgelock_bridge_commands_total ${this.#commands}`,
      "# HELP edgelock_bridge_command_errors_total Commands Redis (or the bridge) answered with an error.",
      "# TYPE edgelock_bridge_command_errors_total counter",
      `edgelock_bridge_command_errors_total ${this.#errors}`,
      "# HELP edgelock_bridge_request_duration_seconds Time to answer a request, by route (a stream: to its first byte).",
      "# TYPE edgelock_bridge_request_duration_seconds histogram",
    );
    for (const [route, { counts, sum, count }] of [...this.#latency].sort()) {
      let cumulative = 0;
      BUCKETS.forEach((le, i) => {
        cumulative += counts[i]!;
        lines.push(
          `edgelock_bridge_request_duration_seconds_bucket{route="${route}",le="${le}"} ${cumulative}`,
        );
      });
      const name = "edgelock_bridge_request_duration_seconds";
      lines.push(
        `${name}_bucket{route="${route}",le="+Inf"} ${count}`,
        `${name}_sum{route="${route}"} ${sum}`,
        `${name}_count{route="${route}"} ${count}`,
      );
    }
    lines.push(
      "# HELP edgelock_bridge_pool_in_use Connections (or, on the shared pool, commands) in use, by pool.",
      "# TYPE edgelock_bridge_pool_in_use gauge",
      ...Object.entries(pools).map(([pool, { in_use }]) =>
        `edgelock_bridge_pool_in_use{pool="${pool}"} ${in_use}`
      ),
      "# HELP edgelock_bridge_pool_size Connections a pool has, or may open at most.",
      "# TYPE edgelock_bridge_pool_size gauge",
      ...Object.entries(pools).flatMap(([pool, { size }]) =>
        size === undefined ? [] : [`edgelock_bridge_pool_size{pool="${pool}"} ${size}`]
      ),
    );
    return lines.join("\n") + "\n";
  }
}
