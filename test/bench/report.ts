// The benchmark's result shape, the figures derived from it (added = path − direct; ratios to the
// bare relay and to the required-work floor), the issue's targets, and the Markdown written between
// the markers of docs/benchmarks.md.
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import type { LoadResult, Percentiles, StreamResult } from "./driver.ts";

export type PathName = "direct" | "relay" | "floor" | "full";
/** The paths measured against direct. */
type Hop = Exclude<PathName, "direct">;

export interface PathResult {
  latency_c1: LoadResult;
  load: (LoadResult & { concurrency: number; passed: boolean })[];
  stream_c1: { ttft_ms: Percentiles; gap_ms: Percentiles; transit_ms: Percentiles; ttft_run: StreamResult; gap_run: StreamResult };
  /** The median of `stream_throughput_runs` (deltas/s of each run). */
  stream_throughput: StreamResult;
  stream_throughput_runs?: number[];
  streams: (StreamResult & { level: number; passed: boolean; rss_peak_mb: number | null; per_stream_kb: number | null; provider_rss_peak_mb: number | null })[];
  rss_idle_mb: number | null;
  overhead_nonstream_ms?: { n: number; p50: number; p99: number };
  overhead_stream_ms?: { n: number; p50: number; p99: number };
}

type Results = Partial<Record<PathName, PathResult>>;

export interface Derived {
  added_latency_c1_ms: Partial<Record<Hop, { p50: number; p99: number }>>;
  sustained_rps: Partial<Record<PathName, { rps: number; concurrency: number; p99_ms: number } | null>>;
  added_ttft_ms: Partial<Record<Hop, { p50: number; p99: number }>>;
  added_gap_ms: Partial<Record<Hop, { p50: number; p99: number }>>;
  added_transit_ms: Partial<Record<Hop, { p50: number; p99: number }>>;
  stall_free_streams: Partial<Record<PathName, number>>;
  rss: Partial<Record<Hop, { idle_mb: number | null; per_stream_kb: number | null; at_streams: number | null }>>;
  stream_frames_per_s: Partial<Record<PathName, number>>;
  ratios_full_to_relay: Record<string, number | null>;
  /** The same ratios against the required-work floor (floor.ts): the share of the gap that is the gateway's own. */
  ratios_full_to_floor: Record<string, number | null>;
  targets: { name: string; target: string; measured: string; met: boolean | null; note: string }[];
}

export interface BenchResult {
  meta: Record<string, unknown>;
  paths: Results;
  derived: Derived;
}

const r3 = (x: number) => Math.round(x * 1000) / 1000;
const sub = (a: Percentiles | undefined, b: Percentiles | undefined) => (a && b ? { p50: r3(a.p50 - b.p50), p99: r3(a.p99 - b.p99) } : undefined);
const ratio = (a: number | null | undefined, b: number | null | undefined) => (a == null || b == null || b === 0 ? null : Math.round((a / b) * 100) / 100);

export function derive(p: Results): Derived {
  const d = p.direct;
  const hops = (["relay", "floor", "full"] as const).filter((n) => p[n]);
  const added = (pick: (x: PathResult) => Percentiles) => (d ? Object.fromEntries(hops.map((n) => [n, sub(pick(p[n]!), pick(d))])) : {});
  const sustained = (x: PathResult | undefined) => {
    const ok = (x?.load ?? []).filter((l) => l.passed).sort((a, b) => b.rps - a.rps)[0];
    return ok ? { rps: ok.rps, concurrency: ok.concurrency, p99_ms: ok.latency_ms.p99 } : null;
  };
  const stallFree = (x: PathResult | undefined) => Math.max(0, ...(x?.streams ?? []).filter((s) => s.passed).map((s) => s.level));
  const rssOf = (x: PathResult | undefined) => {
    if (!x) return undefined;
    const passed = x.streams.filter((s) => s.passed && s.level >= 128);
    const at = passed[passed.length - 1] ?? x.streams[x.streams.length - 1];
    return { idle_mb: x.rss_idle_mb === null ? null : r3(x.rss_idle_mb), per_stream_kb: at?.per_stream_kb == null ? null : r3(at.per_stream_kb), at_streams: at?.level ?? null };
  };
  const out: Derived = {
    added_latency_c1_ms: added((x) => x.latency_c1.latency_ms),
    sustained_rps: Object.fromEntries(Object.entries(p).map(([k, v]) => [k, sustained(v)])),
    added_ttft_ms: added((x) => x.stream_c1.ttft_ms),
    added_gap_ms: added((x) => x.stream_c1.gap_ms),
    added_transit_ms: added((x) => x.stream_c1.transit_ms),
    stall_free_streams: Object.fromEntries(Object.entries(p).map(([k, v]) => [k, stallFree(v)])),
    rss: Object.fromEntries(hops.map((n) => [n, rssOf(p[n])])),
    stream_frames_per_s: Object.fromEntries(Object.entries(p).map(([k, v]) => [k, v!.stream_throughput.frames_per_s])),
    ratios_full_to_relay: {},
    ratios_full_to_floor: {},
    targets: [],
  };
  const f = out;
  const ratiosTo = (base: "relay" | "floor") => ({
    added_latency_p50: ratio(f.added_latency_c1_ms.full?.p50, f.added_latency_c1_ms[base]?.p50),
    added_latency_p99: ratio(f.added_latency_c1_ms.full?.p99, f.added_latency_c1_ms[base]?.p99),
    sustained_rps: ratio(f.sustained_rps.full?.rps, f.sustained_rps[base]?.rps),
    added_ttft_p50: ratio(f.added_ttft_ms.full?.p50, f.added_ttft_ms[base]?.p50),
    added_ttft_p99: ratio(f.added_ttft_ms.full?.p99, f.added_ttft_ms[base]?.p99),
    added_transit_p50: ratio(f.added_transit_ms.full?.p50, f.added_transit_ms[base]?.p50),
    added_transit_p99: ratio(f.added_transit_ms.full?.p99, f.added_transit_ms[base]?.p99),
    stall_free_streams: ratio(f.stall_free_streams.full, f.stall_free_streams[base]),
    rss_idle: ratio(f.rss.full?.idle_mb, f.rss[base]?.idle_mb),
    rss_per_stream: ratio(f.rss.full?.per_stream_kb, f.rss[base]?.per_stream_kb),
    stream_frames_per_s: ratio(f.stream_frames_per_s.full, f.stream_frames_per_s[base]),
  });
  out.ratios_full_to_relay = ratiosTo("relay");
  out.ratios_full_to_floor = ratiosTo("floor");
  const t = (name: string, target: string, value: number | null | undefined, limit: number, atMost: boolean, unit: string, note = "") => {
    const met = value == null ? null : atMost ? value <= limit : value >= limit;
    const miss = value == null || met ? "" : ` (missed by ${r3(Math.abs(value - limit))} ${unit})`;
    out.targets.push({ name, target, measured: value == null ? "n/a" : `${r3(value)} ${unit}${miss}`, met, note });
  };
  t("added p99 at concurrency 1", "≤ 0.5 ms", f.added_latency_c1_ms.full?.p99, 0.5, true, "ms");
  t("sustained req/s, mock at 20 ms", "≥ 3,000", f.sustained_rps.full?.rps ?? (p.full ? 0 : null), 3000, false, "req/s");
  t("added TTFT p99", "≤ 1 ms", f.added_ttft_ms.full?.p99, 1, true, "ms");
  t("added inter-frame gap p99", "≤ 0.1 ms", f.added_gap_ms.full?.p99, 0.1, true, "ms", "gap p99 of the stack − gap p99 direct");
  t("stall-free concurrent streams", "≥ 1,024", p.full ? f.stall_free_streams.full : null, 1024, false, "streams");
  t("gateway RSS idle", "≤ 150 MB", f.rss.full?.idle_mb, 150, true, "MB");
  t("gateway RSS per live stream", "≤ 50 KB", f.rss.full?.per_stream_kb, 50, true, "KB", f.rss.full?.at_streams ? `at ${f.rss.full.at_streams} streams` : "");
  t("streaming throughput vs bare relay", "≥ 60 %", out.ratios_full_to_relay.stream_frames_per_s === null ? null : out.ratios_full_to_relay.stream_frames_per_s! * 100, 60, false, "%", "unthrottled deltas/s, 32 streams");
  return out;
}

const fmt = (x: number | null | undefined, digits = 3) => (x == null || Number.isNaN(x) ? "–" : String(Math.round(x * 10 ** digits) / 10 ** digits));

export function renderMarkdown(r: BenchResult): string {
  const { meta, paths: p, derived: d } = r;
  const names = (["direct", "relay", "floor", "full"] as const).filter((n) => p[n]);
  const label = { direct: "direct", relay: "bare relay", floor: "required-work floor", full: "full stack" };
  const floor = Boolean(p.floor);
  const row = (cells: (string | number)[]) => `| ${cells.join(" | ")} |`;
  const lines: string[] = [];
  lines.push(`Run ${meta.date} · ${meta.cores} cores (${meta.cpu}) · Bun ${meta.bun} · scale ${meta.scale} · ${meta.providers} provider runtimes · gateway log level ${meta.gateway_log_level} · warm-up ${meta.warmup_ms ?? 0} ms a path · driver: ${meta.driver} · ${meta.wall_s} s`);
  lines.push("");
  lines.push("**Targets (issue 7), full stack**");
  lines.push("");
  lines.push(row(["figure", "target", "measured", "met"]));
  lines.push(row(["---", "---", "---", "---"]));
  for (const t of d.targets) lines.push(row([t.name + (t.note ? ` (${t.note})` : ""), t.target, t.measured, t.met === null ? "–" : t.met ? "yes" : "**no**"]));
  lines.push("");
  lines.push("**Per path** (latencies in ms; *added* = path − direct)");
  lines.push("");
  lines.push(row(["figure", ...names.map((n) => label[n]), "full ÷ relay", ...(floor ? ["full ÷ floor"] : [])]));
  lines.push(row(["---", ...names.map(() => "---:"), "---:", ...(floor ? ["---:"] : [])]));
  const perPath = (name: string, f: (x: PathResult, n: PathName) => string, ratioKey?: string) =>
    lines.push(
      row([
        name,
        ...names.map((n) => f(p[n]!, n)),
        ratioKey ? fmt(d.ratios_full_to_relay[ratioKey], 2) : "",
        ...(floor ? [ratioKey ? fmt(d.ratios_full_to_floor[ratioKey], 2) : ""] : []),
      ]),
    );
  perPath("latency c=1 p50 / p99", (x) => `${fmt(x.latency_c1.latency_ms.p50)} / ${fmt(x.latency_c1.latency_ms.p99)}`);
  perPath("added latency c=1 p50 / p99", (_x, n) => (n === "direct" ? "–" : `${fmt(d.added_latency_c1_ms[n]?.p50)} / ${fmt(d.added_latency_c1_ms[n]?.p99)}`), "added_latency_p99");
  perPath("sustained req/s (mock 20 ms; p99 < 1 s, errors ≤ 0.1 %)", (_x, n) => {
    const s = d.sustained_rps[n];
    return s ? `${s.rps} (c=${s.concurrency}, p99 ${fmt(s.p99_ms, 1)})` : "none";
  }, "sustained_rps");
  perPath("stream c=1 TTFT p50 / p99", (x) => `${fmt(x.stream_c1.ttft_ms.p50)} / ${fmt(x.stream_c1.ttft_ms.p99)}`);
  perPath("added TTFT p50 / p99", (_x, n) => (n === "direct" ? "–" : `${fmt(d.added_ttft_ms[n]?.p50)} / ${fmt(d.added_ttft_ms[n]?.p99)}`), "added_ttft_p99");
  perPath("inter-frame gap p50 / p99", (x) => `${fmt(x.stream_c1.gap_ms.p50)} / ${fmt(x.stream_c1.gap_ms.p99)}`);
  perPath("added gap p50 / p99", (_x, n) => (n === "direct" ? "–" : `${fmt(d.added_gap_ms[n]?.p50)} / ${fmt(d.added_gap_ms[n]?.p99)}`));
  perPath("per-chunk transit p50 / p99 (mock stamp → driver)", (x) => `${fmt(x.stream_c1.transit_ms.p50)} / ${fmt(x.stream_c1.transit_ms.p99)}`);
  // Each stream's last delta alone (the end of the request follows it): where the stack's p99 comes from (ninth pass).
  perPath("… of each stream's last delta alone p50 / p99", (x) => (x.stream_c1.gap_run.transit_last_ms ? `${fmt(x.stream_c1.gap_run.transit_last_ms.p50)} / ${fmt(x.stream_c1.gap_run.transit_last_ms.p99)}` : "–"));
  perPath("added per-chunk transit p50 / p99", (_x, n) => (n === "direct" ? "–" : `${fmt(d.added_transit_ms[n]?.p50)} / ${fmt(d.added_transit_ms[n]?.p99)}`), "added_transit_p99");
  perPath(
    "streaming deltas/s (32 streams × 256 unthrottled deltas; median of the runs in brackets)",
    (x) => `${x.stream_throughput.frames_per_s}${x.stream_throughput_runs ? ` (${x.stream_throughput_runs.join(", ")})` : ""}`,
    "stream_frames_per_s",
  );
  perPath("… SSE content events carrying them (per stream)", (x) => (x.stream_throughput.events === undefined ? "–" : (x.stream_throughput.events / x.stream_throughput.streams).toFixed(1)));
  perPath("stall-free concurrent streams", (_x, n) => String(d.stall_free_streams[n] ?? 0), "stall_free_streams");
  perPath("server RSS idle (MB)", (x) => fmt(x.rss_idle_mb, 1), "rss_idle");
  perPath("server RSS per live stream (KB)", (_x, n) => (n === "direct" ? "–" : `${fmt(d.rss[n]?.per_stream_kb, 1)} (at ${d.rss[n]?.at_streams})`), "rss_per_stream");
  if (p.full?.overhead_nonstream_ms) {
    const o = p.full.overhead_nonstream_ms;
    const s = p.full.overhead_stream_ms;
    lines.push("");
    lines.push(
      `Gateway's own overhead histogram (\`gateway_overhead_seconds\`, interpolated within buckets): non-streaming c=1 p50 ${fmt(o.p50)} ms, p99 ${fmt(o.p99)} ms (n=${o.n})` +
        (s ? `; streaming c=1 p50 ${fmt(s.p50)} ms, p99 ${fmt(s.p99)} ms (n=${s.n}).` : "."),
    );
  }
  lines.push("");
  lines.push("**Load ladder** (closed loop, mock at 20 ms): concurrency → req/s, p50 / p99 ms, errors");
  lines.push("");
  for (const n of names) {
    lines.push(`- ${label[n]}: ` + p[n]!.load.map((l) => `c=${l.concurrency} → ${l.rps} (${fmt(l.latency_ms.p50, 1)} / ${fmt(l.latency_ms.p99, 1)}, ${l.errors})${l.passed ? "" : " ✗"}`).join("; "));
  }
  lines.push("");
  lines.push("**Stream ladder** (64 × 16-byte deltas every 20 ms): streams → delivered %, stalled streams, max gap ms, TTFT p99 ms, server RSS peak MB");
  lines.push("");
  for (const n of names) {
    lines.push(
      `- ${label[n]}: ` +
        p[n]!.streams
          .map((s) => `${s.level} → ${fmt(s.delivered_ratio * 100, 2)} %, ${s.stalled_streams}, ${fmt(s.max_gap_ms, 1)}, ${fmt(s.ttft_ms.p99, 1)}${s.rss_peak_mb ? `, ${fmt(s.rss_peak_mb, 1)}` : ""}${s.passed ? "" : " ✗"}`)
          .join("; "),
    );
  }
  return lines.join("\n");
}

const BEGIN = "<!-- bench:begin (written by `bun run bench`) -->";
const END = "<!-- bench:end -->";

/** Replaces the text between the markers (appends them when missing), keeping the prose around. */
export function writeMarkdown(path: string, table: string): void {
  const current = existsSync(path) ? readFileSync(path, "utf8") : "# Benchmarks\n\n";
  const block = `${BEGIN}\n${table}\n${END}`;
  const i = current.indexOf(BEGIN);
  const j = current.indexOf(END);
  const next = i >= 0 && j > i ? current.slice(0, i) + block + current.slice(j + END.length) : `${current.trimEnd()}\n\n${block}\n`;
  writeFileSync(path, next);
}
