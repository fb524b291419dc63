// `bun run bench --quick` end to end, so that the benchmark cannot rot unseen (issue 27): every path
// starts (mock, bare relay, floor, gateway with a provider runtime), every phase runs and serves every
// request it sends, and the targets table has every row of issue 27. Its figures mean nothing (tiny
// durations, a loaded machine); only their presence is checked. Docs are not written in quick mode.
import { expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { LoadResult } from "./driver.ts";
import type { BenchResult } from "./report.ts";

const ROWS = [
  "added p99 at concurrency 1",
  "added TTFT p99",
  "added inter-frame gap p99",
  "sustained req/s, mock at 20 ms",
  "streaming deltas/s, unthrottled",
  "stall-free concurrent streams",
  "stall-free at 4,096 streams",
  "RSS at 1,024 live streams",
  "RSS at 4,096 live streams",
];

test("bun run bench --quick measures every path and prints issue 27's targets table", async () => {
  const dir = mkdtempSync(join(tmpdir(), "bench-quick-"));
  try {
    const json = join(dir, "bench.json");
    const proc = Bun.spawn(["bun", join(import.meta.dir, "run.ts"), "--quick"], {
      env: { ...process.env, BENCH_JSON: json },
      stdout: "pipe",
      stderr: "pipe",
    });
    const [out, err, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited]);
    if (code !== 0) console.error(err);
    expect(code).toBe(0);
    const r = JSON.parse(readFileSync(json, "utf8")) as BenchResult;
    expect(r.meta.quick).toBe(true);
    expect(Object.keys(r.paths).sort()).toEqual(["direct", "floor", "full", "relay"]);
    for (const [name, p] of Object.entries(r.paths)) {
      // Every request of every phase was answered with a 2xx and every stream delivered in full. The
      // answers that ended past a phase's 300–500 ms window count too: under load none may end inside it.
      const served = (l: LoadResult) => ({ name, errors: l.errors + l.outside_window.errors, ok: l.ok + l.outside_window.ok > 0 });
      expect(served(p.latency_c1)).toEqual({ name, errors: 0, ok: true });
      expect(p.load.length).toBeGreaterThan(0);
      for (const l of p.load) expect(served(l)).toEqual({ name, errors: 0, ok: true });
      for (const s of [p.stream_c1.ttft_run, p.stream_c1.gap_run, p.stream_throughput, ...p.streams]) {
        expect({ name, delivered: s.delivered_ratio, errors: s.errors }).toEqual({ name, delivered: 1, errors: 0 });
        expect(s.peak_live).toBeGreaterThan(0);
        expect(s.peak_live).toBeLessThanOrEqual(s.streams + 1);
      }
      // Servers under test report their event-loop delay and RSS; direct has no server of ours.
      if (name !== "direct") {
        expect(p.streams[0]!.loop_delay_ms?.n).toBeGreaterThan(0);
        expect(p.streams[0]!.rss_peak_mb).toBeGreaterThan(0);
      }
    }
    // The other paths ran at the concurrency where the relay peaked.
    const relayPeak = r.derived.sustained_rps.relay!.concurrency;
    for (const name of ["direct", "floor", "full"] as const) expect(r.paths[name]!.load.map((l) => l.concurrency)).toEqual([relayPeak]);
    expect(r.derived.targets.map((t) => t.name)).toEqual(ROWS);
    // Rows the quick ladder reaches are judged; the 1,024 and 4,096 levels are not run.
    for (const t of r.derived.targets.slice(0, 6)) expect({ row: t.name, judged: t.met !== null }).toEqual({ row: t.name, judged: true });
    expect(out).toContain("**Targets (issue 27)");
    expect(out).toContain("| full ÷ relay | full ÷ floor |");
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}, 120_000);
