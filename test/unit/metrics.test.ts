// The Prometheus metrics port (pure, no server): pool gauges read at scrape time, request summaries
// counted once, bounded label values, and one registry per instance.
import { expect, test } from "bun:test";
import type { ProviderView } from "../../src/gateway/routing.ts";
import { createPrometheusMetrics, noopMetrics, routeLabel, type MetricsSources, type RequestSummary } from "../../src/metrics.ts";

const view = (o: Partial<ProviderView>): ProviderView => ({
  sessionId: "s",
  providerId: "p",
  tier: "provisional",
  state: "ready",
  warmModels: ["m1"],
  freeSlots: 1,
  inFlight: 0,
  ...o,
});

const sources = (views: ProviderView[], extra: Partial<MetricsSources> = {}): MetricsSources => ({
  providerViews: () => views,
  handshakingSessions: () => 0,
  ignoredFrames: () => 0,
  liveRequests: () => 0,
  draining: () => false,
  ...extra,
});

const summary = (o: Partial<RequestSummary> = {}): RequestSummary => ({
  requestId: "req_1",
  accountId: "acct_1",
  route: "/v1/chat/completions",
  model: "m1",
  stream: true,
  outcome: "succeeded",
  status: 200,
  errorCode: null,
  attempts: 1,
  inputTokens: 5,
  outputTokens: 7,
  ttftMs: 40,
  totalMs: 100,
  overheadMs: 2,
  ...o,
});

const line = (text: string, prefix: string) => text.split("\n").find((l) => l.startsWith(prefix));

test("pool gauges are computed from the live views when scraped", async () => {
  const views = [view({ tier: "pinned", freeSlots: 3, warmModels: ["a", "b"] }), view({ state: "busy", freeSlots: 0, inFlight: 2, warmModels: ["b"] }), view({ state: "asleep", warmModels: ["c"] })];
  const m = createPrometheusMetrics(sources(views, { handshakingSessions: () => 2, ignoredFrames: () => 4, draining: () => true }));
  const text = await m.render();
  expect(line(text, 'gateway_provider_sessions{tier="pinned",state="ready"}')).toEndWith(" 1");
  expect(line(text, 'gateway_provider_sessions{tier="provisional",state="busy"}')).toEndWith(" 1");
  expect(line(text, 'gateway_provider_sessions{tier="provisional",state="asleep"}')).toEndWith(" 1");
  expect(line(text, 'gateway_provider_sessions{tier="none",state="handshaking"}')).toEndWith(" 2");
  expect(line(text, "gateway_provider_free_slots ")).toBe("gateway_provider_free_slots 3");
  expect(line(text, "gateway_provider_in_flight_attempts ")).toBe("gateway_provider_in_flight_attempts 2");
  // Asleep providers' models are not warm.
  expect(line(text, "gateway_warm_models ")).toBe("gateway_warm_models 2");
  expect(line(text, "gateway_draining ")).toBe("gateway_draining 1");
  expect(line(text, "gateway_provider_frames_ignored_total ")).toBe("gateway_provider_frames_ignored_total 4");
  // The next scrape sees the next state (no stale label sets left behind).
  views.length = 0;
  const again = await m.render();
  expect(line(again, 'gateway_provider_sessions{tier="pinned",state="ready"}')).toEndWith(" 0");
  expect(line(again, "gateway_warm_models ")).toBe("gateway_warm_models 0");
});

test("a finished request moves requests, tokens and the three histograms; a rejected one only the counters", async () => {
  const m = createPrometheusMetrics(sources([]));
  m.requestCompleted(summary());
  m.requestCompleted(summary({ outcome: "rejected", status: 401, stream: null, inputTokens: 0, outputTokens: 0, ttftMs: null }));
  const text = await m.render();
  expect(line(text, 'gateway_requests_total{route="/v1/chat/completions",outcome="succeeded",status="200",stream="yes"}')).toEndWith(" 1");
  expect(line(text, 'gateway_requests_total{route="/v1/chat/completions",outcome="rejected",status="401",stream="unknown"}')).toEndWith(" 1");
  expect(line(text, 'gateway_tokens_total{direction="input"}')).toEndWith(" 5");
  expect(line(text, 'gateway_tokens_total{direction="output"}')).toEndWith(" 7");
  expect(line(text, 'gateway_time_to_first_token_seconds_sum{stream="yes"}')).toBe('gateway_time_to_first_token_seconds_sum{stream="yes"} 0.04');
  expect(line(text, 'gateway_overhead_seconds_count{stream="yes"}')).toEndWith(" 1");
  expect(line(text, 'gateway_request_duration_seconds_count{stream="yes"}')).toEndWith(" 1");
  // No histogram series for the rejected one.
  expect(line(text, 'gateway_time_to_first_token_seconds_count{stream="unknown"}')).toBeUndefined();
});

test("attempts, failovers and settlements count by label; known labels start at 0", async () => {
  const m = createPrometheusMetrics(sources([]));
  expect(line(await m.render(), 'gateway_attempts_total{outcome="declined"}')).toEndWith(" 0");
  expect(line(await m.render(), 'gateway_settlements_total{label="verified"}')).toEndWith(" 0");
  m.attemptFinished("declined");
  m.failover("declined");
  m.settlementLabelled("verified");
  const text = await m.render();
  expect(line(text, 'gateway_attempts_total{outcome="declined"}')).toEndWith(" 1");
  expect(line(text, 'gateway_failovers_total{after="declined"}')).toEndWith(" 1");
  expect(line(text, 'gateway_settlements_total{label="verified"}')).toEndWith(" 1");
});

test("route labels are bounded: unknown paths are `other`", () => {
  expect(routeLabel("/v1/chat/completions")).toBe("/v1/chat/completions");
  expect(routeLabel("/metrics")).toBe("/metrics");
  expect(routeLabel("/wp-admin/../etc/passwd")).toBe("other");
});

test("instances do not share a registry, and the no-op port accepts every call", async () => {
  const a = createPrometheusMetrics(sources([]));
  const b = createPrometheusMetrics(sources([]));
  a.httpResponse("/healthz", 200);
  expect(await a.render()).toContain('gateway_http_requests_total{route="/healthz",status="200"} 1');
  expect(await b.render()).not.toContain('route="/healthz"');
  expect(a.contentType).toContain("text/plain");
  noopMetrics.requestCompleted(summary());
  noopMetrics.attemptFinished("lost");
  noopMetrics.failover("lost");
  noopMetrics.httpResponse("/x", 500);
  noopMetrics.settlementLabelled("pending");
});

test("gateway_settlements_total has exactly the final labels docs/operator.md lists, never pending", async () => {
  const metrics = createPrometheusMetrics(sources([]));
  const text = await metrics.render();
  const labels = [...text.matchAll(/^gateway_settlements_total\{label="([a-z_]+)"\}/gm)].map((m) => m[1]);
  expect(labels.sort()).toEqual(["quarantined", "verified", "zero_settled"]);
  const doc = await Bun.file(new URL("../../docs/operator.md", import.meta.url)).text();
  const row = doc.split("\n").find((l) => l.startsWith("| `gateway_settlements_total`"))!;
  for (const label of labels) expect(row).toContain(`\`${label}\``);
  expect(row).not.toContain("`pending`/");
});
