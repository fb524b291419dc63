// The benchmark's result shape, the figures derived from it (added = path − direct; ratios to the
// bare relay and to the required-work floor), issue 27's targets — set against the bare relay of the
// same run, since figures on this shared machine swing by up to 3× between runs — and the Markdown
// written between the markers of docs/benchmarks.md.
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import type { LoadResult, Percentiles, StreamResult } from "./driver.ts";

export type PathName = "direct" | "relay" | "floor" | "full";
/** The paths measured against direct. */
type Hop = Exclude<PathName, "direct">;

export interface PathResult {
  latency_c1: LoadResult;
  load: (LoadResult & { concurrency: number; passed: boolean; loop_delay_ms?: Percentiles | null })[];
  stream_c1: { ttft_ms: Percentiles; gap_ms: Percentiles; transit_ms: Percentiles; ttft_run: StreamResult; gap_run: StreamResult };
  /** The median of `stream_throughput_runs` (deltas/s of each run). */
  stream_throughput: StreamResult;
  stream_throughput_runs?: number[];
  streams: (StreamResult & {
    level: number;
    passed: boolean;
    rss_peak_mb: number | null;
    per_stream_kb: number | null;
    provider_rss_peak_mb: number | null;
    /** The server's event-loop delay while the level's streams lived (loop-delay-preload.ts). */
    loop_delay_ms?: Percentiles | null;
  })[];
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
  /** Issue 27's targets: the full stack's figure, the relay's, the target it sets, met or missed. */
  targets: TargetRow[];
}

export interface TargetRow {
  name: string;
  full: string;
  relay: string;
  target: string;
  met: boolean | null;
  note: string;
}

/** RSS budget of issue 27: 150 MB + 50 KB × N live streams (MiB, as /proc reports kB). */
export const rssBudgetMb = (n: number): number => 150 + (50 * n) / 1024;

export interface BenchResult {
  meta: Record<string, unknown>;
  paths: Results;
  derived: Derived;
  /** Issue 22's cluster figures (test/bench/cluster-hop.ts), or why they were not taken. */
  cluster?: ClusterFigures;
  /** The RSS budget's figures with N streams held live at once (test/bench/memory.ts), or why not taken. */
  held?: HeldStreamFigures;
}

/** What test/bench/memory.ts measures per level: a fresh gateway's idle VmRSS, then with N slow streams all live. */
/** `holder`: how the held streams stood while RSS was sampled (test/bench/memory.ts's LevelResult). */
export type HeldStreamFigures =
  | { skipped: string }
  | {
      levels: {
        streams: number;
        idle_mb: number;
        live_mb: number | null;
        per_stream_kb: number | null;
        holder?: { delta_ms: number; connect_retries: number; lag_ms: { p99: number }; keeps_pace: boolean };
      }[];
    };

interface ThroughputFigures {
  req_per_s: number;
  failed: number;
  latency_p50_ms: number;
  latency_p99_ms: number;
  cpu_cores: Record<string, number>;
}

/** What test/bench/cluster-hop.ts prints (the fields the report reads). */
export type ClusterFigures =
  | { skipped: string }
  | {
      load_average_before: number[];
      load_average_after: number[];
      hop: {
        streams_per_path: number;
        same_node: { ttft_p99_ms: number; transit_p99_ms: number };
        cross_node: { ttft_p99_ms: number; transit_p99_ms: number };
        added_ttft_p50_ms: number;
        added_ttft_p99_ms: number;
        added_transit_p50_ms: number;
        added_transit_p99_ms: number;
        /** Bootstrap 95 % interval of the TTFT p99 difference, and the difference within each block of the run. */
        added_ttft_p99_ci95_ms?: [number, number];
        blocks?: { added_ttft_p99_ms: number }[];
        /** The same hop over Redis pub/sub (a node with links off), same run. */
        pubsub?: { added_ttft_p50_ms: number; added_ttft_p99_ms: number; added_transit_p50_ms: number; added_transit_p99_ms: number };
      };
      throughput: {
        concurrency: number;
        window_ms: number;
        embedded: ThroughputFigures;
        cluster_one_node: ThroughputFigures;
        cluster_two_nodes: ThroughputFigures;
        one_node_vs_embedded: number;
        two_nodes_vs_one: number;
      };
    };

/** How sure one run's TTFT p99 difference is: its bootstrap interval and the range over the run's blocks. */
function spread(hop: { added_ttft_p99_ci95_ms?: [number, number]; blocks?: { added_ttft_p99_ms: number }[] }): string {
  const parts: string[] = [];
  if (hop.added_ttft_p99_ci95_ms) parts.push(`95 % interval ${hop.added_ttft_p99_ci95_ms[0]} … ${hop.added_ttft_p99_ci95_ms[1]}`);
  if (hop.blocks && hop.blocks.length > 1) {
    const b = hop.blocks.map((x) => x.added_ttft_p99_ms);
    parts.push(`${b.length} blocks ${Math.min(...b)} … ${Math.max(...b)}`);
  }
  return parts.map((p) => `; ${p}`).join("");
}

/** The cluster section of the report: issue 22's three figures against their targets, CPU per process. */
function renderCluster(c: ClusterFigures): string[] {
  if ("skipped" in c) return ["", `**Cluster mode (issue 22):** not measured — ${c.skipped}.`];
  const row = (cells: (string | number)[]) => `| ${cells.join(" | ")} |`;
  const yes = (ok: boolean) => (ok ? "yes" : "**no**");
  const t = c.throughput;
  const cpu = (f: ThroughputFigures) => Object.entries(f.cpu_cores).map(([k, v]) => `${k} ${v}`).join(", ");
  return [
    "",
    `**Cluster mode (issue 22)** — test/bench/cluster-hop.ts after the paths above; load average before ${c.load_average_before.join(" / ")}, after ${c.load_average_after.join(" / ")}. Nodes on one PostgreSQL and one Redis; ${c.hop.streams_per_path} streams a path asked of the provider's own node and of another node (over a node link), interleaved; then closed-loop non-streaming requests at c=${t.concurrency} for ${t.window_ms} ms (mock answering at once).`,
    "",
    row(["figure", "measured", "target", "met"]),
    row(["---", "---", "---", "---"]),
    row(["added TTFT p99, cross-node − same-node", `${c.hop.added_ttft_p99_ms} ms (p50 ${c.hop.added_ttft_p50_ms}${spread(c.hop)})`, "≤ 1 ms", yes(c.hop.added_ttft_p99_ms <= 1)]),
    row(["added per-chunk transit p99, cross-node − same-node", `${c.hop.added_transit_p99_ms} ms (p50 ${c.hop.added_transit_p50_ms})`, "≤ 0.3 ms", yes(c.hop.added_transit_p99_ms <= 0.3)]),
    ...(c.hop.pubsub
      ? [row(["same hop over Redis pub/sub (node links off), added TTFT p99 / transit p99", `${c.hop.pubsub.added_ttft_p99_ms} ms / ${c.hop.pubsub.added_transit_p99_ms} ms (p50 ${c.hop.pubsub.added_ttft_p50_ms} / ${c.hop.pubsub.added_transit_p50_ms})`, "reported", "–"])]
      : []),
    row(["one cluster node ÷ embedded, req/s", `${t.cluster_one_node.req_per_s} ÷ ${t.embedded.req_per_s} = ${Math.round(t.one_node_vs_embedded * 100)} %`, "≥ 70 %", yes(t.one_node_vs_embedded >= 0.7)]),
    row(["two nodes ÷ one node, req/s", `${t.cluster_two_nodes.req_per_s} ÷ ${t.cluster_one_node.req_per_s} = ${t.two_nodes_vs_one}`, "reported", "–"]),
    "",
    `CPU cores used per process (CPU seconds ÷ window): embedded — ${cpu(t.embedded)}; one node — ${cpu(t.cluster_one_node)}; two nodes — ${cpu(t.cluster_two_nodes)}. Latency p50 / p99: embedded ${t.embedded.latency_p50_ms} / ${t.embedded.latency_p99_ms} ms, one node ${t.cluster_one_node.latency_p50_ms} / ${t.cluster_one_node.latency_p99_ms} ms, two nodes ${t.cluster_two_nodes.latency_p50_ms} / ${t.cluster_two_nodes.latency_p99_ms} ms.`,
  ];
}

const r3 = (x: number) => Math.round(x * 1000) / 1000;
const sub = (a: Percentiles | undefined, b: Percentiles | undefined) => (a && b ? { p50: r3(a.p50 - b.p50), p99: r3(a.p99 - b.p99) } : undefined);
const ratio = (a: number | null | undefined, b: number | null | undefined) => (a == null || b == null || b === 0 ? null : Math.round((a / b) * 100) / 100);

const fmt = (x: number | null | undefined, digits = 3) => (x == null || Number.isNaN(x) ? "–" : String(Math.round(x * 10 ** digits) / 10 ** digits));

export function derive(p: Results): Derived {
  const d = p.direct;
  const hops = (["relay", "floor", "full"] as const).filter((n) => p[n]);
  const added = (pick: (x: PathResult) => Percentiles) => (d ? Object.fromEntries(hops.map((n) => [n, sub(pick(p[n]!), pick(d))])) : {});
  const sustained = (x: PathResult | undefined) => {
    const ok = (x?.load ?? []).filter((l) => l.passed).sort((a, b) => b.rps - a.rps)[0];
    return ok ? { rps: ok.rps, concurrency: ok.concurrency, p99_ms: ok.latency_ms.p99 } : null;
  };
  /** The highest level reached with every level up to it passed (the ladder runs on past a failure). */
  const stallFree = (x: PathResult | undefined) => {
    let level = 0;
    for (const s of x?.streams ?? []) {
      if (!s.passed) break;
      level = s.level;
    }
    return level;
  };
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
  const rel = p.relay;
  const t = (name: string, full: string, relay: string, target: string, met: boolean | null, note = "") => out.targets.push({ name, full, relay, target, met, note });
  const plus = (name: string, pick: (x: Derived) => Partial<Record<Hop, { p99: number }>>, margin: number) => {
    const full = pick(f).full?.p99;
    const relay = pick(f).relay?.p99;
    const limit = relay === undefined ? undefined : r3(relay + margin);
    t(name, full === undefined ? "n/a" : `${r3(full)} ms`, relay === undefined ? "n/a" : `${r3(relay)} ms`, limit === undefined ? `≤ relay + ${margin} ms` : `≤ ${limit} ms (relay + ${margin})`, full === undefined || limit === undefined ? null : full <= limit);
  };
  plus("added p99 at concurrency 1", (x) => x.added_latency_c1_ms, 0.5);
  plus("added TTFT p99", (x) => x.added_ttft_ms, 0.5);
  plus("added inter-frame gap p99", (x) => x.added_gap_ms, 0.1);
  const share = (name: string, full: number | null | undefined, relay: number | null | undefined, min: number, unit: string, note = "") =>
    t(
      name,
      full == null ? "none" : `${full} ${unit} (${relay ? Math.round((full / relay) * 100) : "–"} %)`,
      relay == null ? "n/a" : `${relay} ${unit}`,
      relay == null ? `≥ ${min * 100} % of relay` : `≥ ${Math.round(relay * min)} ${unit} (${min * 100} %)`,
      relay == null ? null : (full ?? 0) >= relay * min,
      note,
    );
  const relayPeak = f.sustained_rps.relay;
  share("sustained req/s, mock at 20 ms", f.sustained_rps.full?.rps ?? (p.full ? 0 : null), relayPeak?.rps, 0.5, "req/s", relayPeak ? `at c=${relayPeak.concurrency}, where the relay peaked` : "");
  const eventsPerStream = (x: PathResult | undefined) => (x?.stream_throughput.events === undefined ? "–" : (x.stream_throughput.events / x.stream_throughput.streams).toFixed(1));
  share("streaming deltas/s, unthrottled", f.stream_frames_per_s.full, f.stream_frames_per_s.relay, 0.6, "", `32 streams × 256 deltas; SSE events per stream: full ${eventsPerStream(p.full)}, relay ${eventsPerStream(rel)}`);
  const relayLevel = rel ? (f.stall_free_streams.relay ?? 0) : null;
  const needLevel = Math.max(1024, relayLevel ?? 0);
  t("stall-free concurrent streams", p.full ? String(f.stall_free_streams.full) : "n/a", relayLevel === null ? "n/a" : String(relayLevel), `≥ ${needLevel} (the relay's, ≥ 1,024)`, p.full ? f.stall_free_streams.full! >= needLevel : null);
  const levelOf = (x: PathResult | undefined, n: number) => x?.streams.find((s) => s.level === n);
  const describe = (s: PathResult["streams"][number] | undefined) =>
    s === undefined
      ? "not run"
      : `${s.passed ? "stall-free" : "stalled"}: ${fmt(s.delivered_ratio * 100, 2)} % delivered, ${s.stalled_streams} stalled, max gap ${fmt(s.max_gap_ms, 1)} ms, loop delay p99 ${fmt(s.loop_delay_ms?.p99, 1)} / max ${fmt(s.loop_delay_ms?.max, 1)} ms`;
  const full4096 = levelOf(p.full, 4096);
  t("stall-free at 4,096 streams", describe(full4096), describe(levelOf(rel, 4096)), "stall-free (delivered ≥ 99.9 %, no gap or event-loop delay above 10 intervals)", full4096 === undefined ? null : full4096.passed);
  for (const n of [1024, 4096]) {
    const s = levelOf(p.full, n);
    const r = levelOf(rel, n);
    const budget = rssBudgetMb(n);
    t(
      `RSS at ${n.toLocaleString("en")} live streams`,
      s?.rss_peak_mb == null ? "n/a" : `${fmt(s.rss_peak_mb, 1)} MB (${fmt(s.per_stream_kb, 1)} KB a stream over idle; ${s.peak_live ?? "?"} streams live at once)`,
      r?.rss_peak_mb == null ? "n/a" : `${fmt(r.rss_peak_mb, 1)} MB`,
      `≤ ${budget} MB (150 MB + 50 KB × ${n})`,
      // Judged only when the level's N streams were all live at once (under load they may not overlap).
      s?.rss_peak_mb == null || (s.peak_live ?? 0) < n ? null : s.rss_peak_mb <= budget,
      "server's peak VmRSS while the level's streams lived; judged only with all N live at once",
    );
  }
  return out;
}

/** The RSS budget judged with N streams held live at once (the ladder's rows above may not get all N live). */
function heldTargets(held: HeldStreamFigures | undefined): TargetRow[] {
  if (held === undefined) return [];
  const name = (n: number) => `RSS at ${n.toLocaleString("en")} live streams, held`;
  if ("skipped" in held) return [{ name: name(4096), full: `not measured: ${held.skipped}`, relay: "–", target: "–", met: null, note: "" }];
  return held.levels.map((l) => {
    const budget = rssBudgetMb(l.streams);
    const h = l.holder;
    // Judged only while every stream keeps pace: otherwise RSS counts output queued behind the machine.
    const pace = h ? `; a delta every ${h.delta_ms} ms, latest delta p99 ${fmt(h.lag_ms.p99, 0)} ms old${h.keeps_pace ? "" : ", not keeping pace"}; ${h.connect_retries} connects retried` : "";
    return {
      name: name(l.streams),
      full: l.live_mb === null ? "n/a" : `${fmt(l.live_mb, 1)} MB (idle ${fmt(l.idle_mb, 1)} MB; ${fmt(l.per_stream_kb, 1)} KB a stream${pace})`,
      relay: "–",
      target: `≤ ${budget} MB (150 MB + 50 KB × ${l.streams})`,
      met: l.live_mb === null || (h !== undefined && !h.keeps_pace) ? null : l.live_mb <= budget,
      note: "test/bench/memory.ts after the paths: a fresh gateway, warmed up, then N slow streams all live at once; VmRSS median",
    };
  });
}

export function renderMarkdown(r: BenchResult): string {
  const { meta, paths: p, derived: d } = r;
  const names = (["direct", "relay", "floor", "full"] as const).filter((n) => p[n]);
  const label = { direct: "direct", relay: "bare relay", floor: "required-work floor", full: "full stack" };
  const floor = Boolean(p.floor);
  const row = (cells: (string | number)[]) => `| ${cells.join(" | ")} |`;
  const lines: string[] = [];
  const load = (x: unknown) => (Array.isArray(x) ? x.join(" / ") : "–");
  lines.push(
    `Run ${meta.date}${meta.quick ? " (--quick: a smoke run, figures meaningless)" : ""} · load average before ${load(meta.load_average_before)}, after ${load(meta.load_average_after)} · ${meta.cores} cores (${meta.cpu}) · Bun ${meta.bun} · scale ${meta.scale} · ${meta.providers} provider runtimes · gateway log level ${meta.gateway_log_level} · warm-up ${meta.warmup_ms ?? 0} ms a path · driver: ${meta.driver} · ${meta.wall_s} s`,
  );
  lines.push("");
  lines.push("**Targets (issue 27): full stack, every check on, embedded mode, against the bare relay of this run**");
  lines.push("");
  lines.push(row(["figure", "full stack", "bare relay", "target", "met"]));
  lines.push(row(["---", "---", "---", "---", "---"]));
  for (const t of [...d.targets, ...heldTargets(r.held)]) lines.push(row([t.name + (t.note ? ` (${t.note})` : ""), t.full, t.relay, t.target, t.met === null ? "–" : t.met ? "yes" : "**no**"]));
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
  perPath("server event-loop delay p99 / max, sustained-load level (ms)", (x) => {
    const l = [...x.load].sort((a, b) => b.rps - a.rps)[0]?.loop_delay_ms;
    return l ? `${fmt(l.p99, 1)} / ${fmt(l.max, 1)}` : "–";
  });
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
  lines.push("**Load levels** (closed loop, mock at 20 ms; the relay climbs the ladder, the others run at its peak): concurrency → req/s, p50 / p99 ms, errors, server event-loop delay p99 / max ms");
  lines.push("");
  for (const n of names) {
    lines.push(
      `- ${label[n]}: ` +
        p[n]!.load
          .map((l) => `c=${l.concurrency} → ${l.rps} (${fmt(l.latency_ms.p50, 1)} / ${fmt(l.latency_ms.p99, 1)}, ${l.errors}${l.loop_delay_ms ? `, loop ${fmt(l.loop_delay_ms.p99, 1)} / ${fmt(l.loop_delay_ms.max, 1)}` : ""})${l.passed ? "" : " ✗"}`)
          .join("; "),
    );
  }
  lines.push("");
  lines.push(`**Stream ladder** (${p.full?.streams[0]?.expected_frames ?? p.relay?.streams[0]?.expected_frames ?? "–"} paced 16-byte deltas a stream, all started at once; a level stalls above ${meta.stall_ms ?? "–"} ms): streams → delivered %, stalled streams, max gap ms, TTFT p99 ms, server RSS peak MB, server event-loop delay p99 / max ms`);
  lines.push("");
  for (const n of names) {
    lines.push(
      `- ${label[n]}: ` +
        p[n]!.streams
          .map(
            (s) =>
              `${s.level} → ${fmt(s.delivered_ratio * 100, 2)} %, ${s.stalled_streams}, ${fmt(s.max_gap_ms, 1)}, ${fmt(s.ttft_ms.p99, 1)}${s.rss_peak_mb ? `, ${fmt(s.rss_peak_mb, 1)}` : ""}${s.loop_delay_ms ? `, ${fmt(s.loop_delay_ms.p99, 1)} / ${fmt(s.loop_delay_ms.max, 1)}` : ""}${s.passed ? "" : " ✗"}`,
          )
          .join("; "),
    );
  }
  if (r.cluster) lines.push(...renderCluster(r.cluster));
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
