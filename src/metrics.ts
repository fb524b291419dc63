// Operator metrics: a small typed port the gateway calls (O(1) per request or attempt, nothing per
// chunk), and its Prometheus implementation on a per-gateway prom-client Registry — never the global
// one, so several gateways in one process (tests) keep separate series. Pool gauges are read from the
// live registry only when /metrics is scraped, so they cost nothing on the request path.
// Metric names, labels and the overhead definition are documented in docs/operator.md.
import type * as Prom from "prom-client";
import type { ProviderView } from "./gateway/routing.ts";
import type { SettlementLabel } from "./ledger/charges.ts";
import type { LogFields } from "./log.ts";

// The four classes from their own files (each file's module.exports is the class): the package index
// also loads its Pushgateway (node:http, https), cluster aggregator (node:cluster) and default
// metrics, ~9 MB of idle RSS the gateway never uses.
const Counter: typeof Prom.Counter = require("prom-client/lib/counter");
const Gauge: typeof Prom.Gauge = require("prom-client/lib/gauge");
const Histogram: typeof Prom.Histogram = require("prom-client/lib/histogram");
const Registry: typeof Prom.Registry = require("prom-client/lib/registry");
type Histogram<T extends string> = Prom.Histogram<T>;
type Registry = Prom.Registry;

/** How a buyer request ended. `rejected`: answered before a request actor started (auth, validation, drain). */
export type RequestOutcome = "succeeded" | "failed" | "failed_mid_stream" | "cancelled" | "rejected";

/** How one provider attempt ended, as the request actor saw it. */
export type AttemptOutcome =
  | "completed"
  | "length_limited"
  | "declined"
  | "lost"
  | "provider_error"
  | "timeout"
  | "bad_sequence"
  | "cancelled";

/** One finished buyer request: what metrics count and what the `request_completed` log line says. */
export interface RequestSummary {
  requestId: string;
  accountId: string | null;
  route: string;
  model: string | null;
  /** null when the request was rejected before its body was understood. */
  stream: boolean | null;
  outcome: RequestOutcome;
  /** The HTTP status the buyer got (499: the buyer left before any byte was sent). */
  status: number;
  errorCode: string | null;
  attempts: number;
  inputTokens: number;
  outputTokens: number;
  /** Arrival to the first output chunk of the attempt that served; null when none arrived. */
  ttftMs: number | null;
  totalMs: number;
  /** totalMs minus the time spent waiting on providers (definition in docs/operator.md). */
  overheadMs: number;
}

/**
 * The fields of the one `request_completed` log line per buyer request: ids, counts and timings only.
 * Invariant: nothing here can carry prompt or output text or a key — the summary has no such field.
 */
export function requestLogFields(s: RequestSummary): LogFields {
  return {
    request_id: s.requestId,
    account_id: s.accountId,
    route: s.route,
    model: s.model,
    stream: s.stream,
    outcome: s.outcome,
    status: s.status,
    error_code: s.errorCode,
    attempts: s.attempts,
    input_tokens: s.inputTokens,
    output_tokens: s.outputTokens,
    ttft_ms: s.ttftMs === null ? null : round3(s.ttftMs),
    total_ms: round3(s.totalMs),
    overhead_ms: round3(s.overheadMs),
  };
}

const round3 = (ms: number) => Math.round(ms * 1000) / 1000;

/** What the gateway tells its metrics. Tests pass `noopMetrics`. */
export interface MetricsPort {
  httpResponse(route: string, status: number): void;
  requestCompleted(summary: RequestSummary): void;
  /** `providerId`: whose attempt it was (the console counts recent failures per provider). */
  attemptFinished(outcome: AttemptOutcome, providerId?: string): void;
  /** A new attempt was dispatched after `after` ended the previous one before the first byte. */
  failover(after: AttemptOutcome): void;
  settlementLabelled(label: SettlementLabel): void;
}

export const noopMetrics: MetricsPort = {
  httpResponse() {},
  requestCompleted() {},
  attemptFinished() {},
  failover() {},
  settlementLabelled() {},
};

/** Live state read at scrape time. */
export interface MetricsSources {
  providerViews(): Iterable<ProviderView>;
  /** Provider sockets still in the handshake. */
  handshakingSessions(): number;
  ignoredFrames(): number;
  /** Receipt frames counted and not stored, by reason; absent = none counted. */
  ignoredReceipts?(): Readonly<Record<string, number>>;
  liveRequests(): number;
  draining(): boolean;
  /** Routing's cooldowns, admission queue, sticky lookups and hedges (docs/routing.md); absent in bare tests. */
  routing?(): RoutingMetrics;
  /** Engines the node depends on (Redis in a cluster), and whether each is reachable now. */
  engines?(): Record<string, boolean>;
  /** Whether the durable store's database answers (always on the embedded store). */
  storeUp?(): boolean;
  /** Retries waiting for the result of an identical request in flight (docs/buyer-api.md). */
  waitingRetries?(): number;
  /** The admission gate (src/http/admissionGate.ts): requests waiting for a turn now, and counts since start. */
  admissionGate?(): { waiting: number; waited: number; shed: number };
}

/** What routing shows in /metrics: gauges now, and counters since start. */
export interface RoutingMetrics {
  cooldowns: Record<"cooling" | "half_open" | "trial", number>;
  cooldownTransitions: Record<"cooled" | "trial_started" | "reset", number>;
  queueDepth: number;
  queue: Record<"served" | "expired" | "full", number>;
  sticky: Record<"hit" | "miss", number>;
  hedges: Record<"sent" | "won" | "lost", number>;
}

export interface PrometheusMetrics extends MetricsPort {
  readonly registry: Registry;
  readonly contentType: string;
  /** The exposition text for GET /metrics. */
  render(): Promise<string>;
}

const TIERS = ["pinned", "provisional"] as const;
const STATES = ["ready", "busy", "asleep", "draining"] as const;
const ATTEMPT_OUTCOMES: readonly AttemptOutcome[] = [
  "completed",
  "length_limited",
  "declined",
  "lost",
  "provider_error",
  "timeout",
  "bad_sequence",
  "cancelled",
];
// Final labels only: an attempt is counted once, when it leaves `pending` (docs/operator.md).
const SETTLEMENT_LABELS: readonly SettlementLabel[] = ["verified", "quarantined", "zero_settled"];

/** Routes get their own label value; anything else is `other`, so scanners cannot grow the series. */
export const KNOWN_ROUTES: ReadonlySet<string> = new Set([
  "/v1/chat/completions",
  "/v1/messages",
  "/v1/responses",
  "/v1/models",
  "/v1/status",
  "/v1/catalog",
  "/v1/catalog/pubkey",
  "/healthz",
  "/metrics",
  "/account",
  "/demo",
  "/auth/demo-session",
]);

export const routeLabel = (pathname: string): string => (KNOWN_ROUTES.has(pathname) ? pathname : "other");

const streamLabel = (stream: boolean | null) => (stream === null ? "unknown" : stream ? "yes" : "no");

/** Creates the metrics of one gateway on a fresh Registry. */
export function createPrometheusMetrics(sources: MetricsSources): PrometheusMetrics {
  const registry = new Registry();
  const registers = [registry];

  const httpRequests = new Counter({
    name: "gateway_http_requests_total",
    help: "HTTP responses by route (known paths, else other) and status code.",
    labelNames: ["route", "status"] as const,
    registers,
  });
  const requests = new Counter({
    name: "gateway_requests_total",
    help: "Buyer inference requests by route, outcome, HTTP status given to the buyer (499 = buyer left first) and stream.",
    labelNames: ["route", "outcome", "status", "stream"] as const,
    registers,
  });
  const tokens = new Counter({
    name: "gateway_tokens_total",
    help: "Tokens of finished requests: input = prompt tokens as the provider reported them (capped by the gateway's bound), output = tokens relayed to buyers.",
    labelNames: ["direction"] as const,
    registers,
  });
  const attempts = new Counter({
    name: "gateway_attempts_total",
    help: "Provider attempts by how they ended.",
    labelNames: ["outcome"] as const,
    registers,
  });
  const failovers = new Counter({
    name: "gateway_failovers_total",
    help: "Attempts dispatched after an earlier attempt of the same request failed before the first byte, by how that one ended.",
    labelNames: ["after"] as const,
    registers,
  });
  const settlements = new Counter({
    name: "gateway_settlements_total",
    help: "Provider attempts by their final settlement label.",
    labelNames: ["label"] as const,
    registers,
  });
  const ttft = new Histogram({
    name: "gateway_time_to_first_token_seconds",
    help: "From the buyer request's arrival to the first output chunk of the attempt that served it.",
    labelNames: ["stream"] as const,
    buckets: [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60],
    registers,
  });
  const duration = new Histogram({
    name: "gateway_request_duration_seconds",
    help: "From the buyer request's arrival to the end of its response.",
    labelNames: ["stream"] as const,
    buckets: [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300],
    registers,
  });
  const overhead = new Histogram({
    name: "gateway_overhead_seconds",
    help: "Request duration minus the time spent waiting on providers (see docs/operator.md).",
    labelNames: ["stream"] as const,
    buckets: [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1],
    registers,
  });

  // Pool gauges: computed from the live registry at scrape time.
  new Gauge({
    name: "gateway_provider_sessions",
    help: "Admitted provider sessions by tier and state; state=handshaking counts sockets not yet admitted.",
    labelNames: ["tier", "state"] as const,
    registers,
    collect() {
      this.reset();
      for (const tier of TIERS) for (const state of STATES) this.set({ tier, state }, 0);
      for (const v of sources.providerViews()) this.inc({ tier: v.tier, state: v.state });
      this.set({ tier: "none", state: "handshaking" }, sources.handshakingSessions());
    },
  });
  new Gauge({
    name: "gateway_engine_up",
    help: "Whether an engine this node depends on (redis in a cluster) answered its last command: 1 up, 0 down.",
    labelNames: ["engine"] as const,
    registers,
    collect() {
      this.reset();
      for (const [engine, up] of Object.entries(sources.engines?.() ?? {})) this.set({ engine }, up ? 1 : 0);
    },
  });
  new Gauge({
    name: "gateway_provider_free_slots",
    help: "Free job slots on ready provider sessions.",
    registers,
    collect() {
      let n = 0;
      for (const v of sources.providerViews()) if (v.state === "ready") n += v.freeSlots;
      this.set(n);
    },
  });
  new Gauge({
    name: "gateway_provider_in_flight_attempts",
    help: "Attempts in flight on admitted provider sessions.",
    registers,
    collect() {
      let n = 0;
      for (const v of sources.providerViews()) n += v.inFlight;
      this.set(n);
    },
  });
  new Gauge({
    name: "gateway_warm_models",
    help: "Distinct model ids warm on at least one awake provider.",
    registers,
    collect() {
      const ids = new Set<string>();
      for (const v of sources.providerViews()) if (v.state !== "asleep") for (const m of v.warmModels) ids.add(m);
      this.set(ids.size);
    },
  });
  new Gauge({
    name: "gateway_live_requests",
    help: "Buyer requests with a live request actor.",
    registers,
    collect() {
      this.set(sources.liveRequests());
    },
  });
  new Gauge({
    name: "gateway_draining",
    help: "1 while the gateway drains (after SIGTERM), else 0.",
    registers,
    collect() {
      this.set(sources.draining() ? 1 : 0);
    },
  });
  new Gauge({
    name: "gateway_store_up",
    help: "1 while the durable store's database answers (PostgreSQL on a cluster node; always 1 on SQLite), else 0.",
    registers,
    collect() {
      this.set(sources.storeUp?.() === false ? 0 : 1);
    },
  });
  new Gauge({
    name: "gateway_retries_waiting",
    help: "Buyer retries (x-stainless-retry-count >= 1) waiting for the result of an identical request still in flight, to replay it.",
    registers,
    collect() {
      this.set(sources.waitingRetries?.() ?? 0);
    },
  });
  new Gauge({
    name: "gateway_admission_turn_waiting",
    help: "New inference requests waiting for an admission turn (more than admissionsPerTurn arrived in one event-loop turn).",
    registers,
    collect() {
      this.set(sources.admissionGate?.().waiting ?? 0);
    },
  });
  new Counter({
    name: "gateway_admission_turn_total",
    help: "New inference requests that did not start in the turn they arrived: waited (for a later turn), shed (503 coordinator_unavailable at once, the oldest waiter past admissionQueueMs).",
    labelNames: ["outcome"] as const,
    registers,
    collect() {
      const gate = sources.admissionGate?.();
      this.reset();
      this.inc({ outcome: "waited" }, gate?.waited ?? 0);
      this.inc({ outcome: "shed" }, gate?.shed ?? 0);
    },
  });
  new Counter({
    name: "gateway_provider_frames_ignored_total",
    help: "Provider frames about jobs the session does not hold (docs/protocol.md).",
    registers,
    collect() {
      // The registry owns the count; mirror it (a counter cannot be set, so reset and add).
      this.reset();
      this.inc(sources.ignoredFrames());
    },
  });

  // Routing (docs/routing.md): read from the routing state at scrape time.
  const routing = sources.routing;
  if (routing) {
    new Gauge({
      name: "gateway_provider_cooldowns",
      help: "(provider, model) pairs not healthy, by state: cooling (routed only as a last resort), half_open (one trial may go), trial (a trial is running).",
      labelNames: ["state"] as const,
      registers,
      collect() {
        for (const [state, n] of Object.entries(routing().cooldowns)) this.set({ state }, n);
      },
    });
    new Gauge({
      name: "gateway_admission_queue_depth",
      help: "Buyer requests waiting for a free provider slot.",
      registers,
      collect() {
        this.set(routing().queueDepth);
      },
    });
    const mirrored = (name: string, help: string, label: string, read: (r: RoutingMetrics) => Record<string, number>) =>
      new Counter({
        name,
        help,
        labelNames: [label],
        registers,
        collect() {
          // Routing owns the counts; mirror them (a counter cannot be set, so reset and add).
          this.reset();
          for (const [value, n] of Object.entries(read(routing()))) this.inc({ [label]: value }, n);
        },
      });
    mirrored("gateway_cooldown_transitions_total", "Cooldown transitions of (provider, model) pairs: cooled (a failure), trial_started, reset (a success after failures).", "event", (r) => r.cooldownTransitions);
    mirrored("gateway_admission_queue_total", "Requests that waited for a slot, by how the wait ended: served, expired (503 after queueWaitMs), full (503 at once, queue at queueMaxDepth).", "outcome", (r) => r.queue);
    mirrored("gateway_sticky_lookups_total", "Requests with a conversation tag (sticky routing on): hit = routed to the pinned provider, miss = routed otherwise.", "result", (r) => r.sticky);
    mirrored("gateway_hedges_total", "Hedged dispatch: sent, won (the hedge delivered first), lost (the first attempt delivered first).", "result", (r) => r.hedges);
  }
  new Counter({
    name: "gateway_receipts_not_stored_total",
    help: "Receipt frames not stored: a duplicate for an open attempt, one after the attempt's final outcome (answered with its settled frame), or one for no attempt of that provider.",
    labelNames: ["reason"] as const,
    registers,
    collect() {
      this.reset();
      for (const [reason, n] of Object.entries(sources.ignoredReceipts?.() ?? {})) this.inc({ reason }, n);
    },
  });

  // Known label values start at 0 so rate() works from the first scrape and dashboards see every series.
  for (const outcome of ATTEMPT_OUTCOMES) attempts.inc({ outcome }, 0);
  for (const label of SETTLEMENT_LABELS) settlements.inc({ label }, 0);
  tokens.inc({ direction: "input" }, 0);
  tokens.inc({ direction: "output" }, 0);

  // prom-client hashes the label set on every inc/observe; per request that was most of its cost.
  // Children bound once per label set (a small, fixed set of values) skip it.
  const requestsBy = boundChildren((key: string) => {
    const [route, outcome, status, stream] = key.split("\u0000") as [string, string, string, string];
    return requests.labels({ route, outcome, status, stream });
  });
  const inputTokens = tokens.labels({ direction: "input" });
  const outputTokens = tokens.labels({ direction: "output" });
  const byStream = (h: Histogram<"stream">) => boundChildren((stream: string) => h.labels({ stream }));
  const ttftBy = byStream(ttft);
  const durationBy = byStream(duration);
  const overheadBy = byStream(overhead);

  return {
    registry,
    contentType: registry.contentType,
    render: () => registry.metrics(),
    httpResponse(route, status) {
      httpRequests.inc({ route, status: String(status) });
    },
    requestCompleted(s) {
      const stream = streamLabel(s.stream);
      requestsBy(`${s.route}\u0000${s.outcome}\u0000${s.status}\u0000${stream}`).inc();
      if (s.inputTokens > 0) inputTokens.inc(s.inputTokens);
      if (s.outputTokens > 0) outputTokens.inc(s.outputTokens);
      if (s.outcome === "rejected") return;
      if (s.ttftMs !== null) ttftBy(stream).observe(s.ttftMs / 1000);
      durationBy(stream).observe(s.totalMs / 1000);
      overheadBy(stream).observe(s.overheadMs / 1000);
    },
    attemptFinished(outcome) {
      attempts.inc({ outcome });
    },
    failover(after) {
      failovers.inc({ after });
    },
    settlementLabelled(label) {
      settlements.inc({ label });
    },
  };
}

/** One child per label-set key, made on first use. */
function boundChildren<C>(make: (key: string) => C): (key: string) => C {
  const children = new Map<string, C>();
  return (key) => {
    let child = children.get(key);
    if (child === undefined) {
      child = make(key);
      children.set(key, child);
    }
    return child;
  };
}
