// `bun test/bench/ab.ts REV_A REV_B [rounds] [mode] [concurrency] [seconds]`: compares two revisions
// on one full-stack load level, alternating A, B, A, B, … so that drift of a shared machine falls on
// both alike — single runs here move ±15 %, more than most single optimisations change.
//
// Each revision is checked out into a temporary git worktree (this checkout's node_modules linked in)
// and measured by *this* checkout's cpu-split.ts, copied in, so both sides are measured the same way.
// Defaults: 4 rounds of `load 128 12` with one provider runtime (BENCH_PROVIDERS, as in cpu-split.ts).
// Per run it prints req/s and CPU µs per request (gateway process, its main thread, provider
// runtimes); at the end, each side's mean and B ÷ A. Worktrees are removed at the end.
import { copyFileSync, mkdtempSync, rmSync, symlinkSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const ROOT = join(import.meta.dir, "../..");
const [revA, revB, roundsArg = "4", mode = "load", c = "128", seconds = "12"] = process.argv.slice(2);
if (!revA || !revB) {
  console.error("usage: bun test/bench/ab.ts REV_A REV_B [rounds] [load|instant|streams|frames] [concurrency] [seconds]");
  process.exit(64);
}
const rounds = Number(roundsArg);

interface Split {
  wall: number;
  rps: number;
  p99: number;
  errors: number;
  frames_per_s?: number;
  stalled?: number;
  max_gap?: number;
  ttft_p99?: number;
  gap_p99?: number;
  transit_p99?: number;
  transit_last_p50?: number;
  transit_last_p99?: number;
  cpu_s: { gateway: number; gateway_main: number | null; providers: number; mock: number; driver: number };
}
interface Row {
  rps: number;
  p99: number;
  gateway: number;
  main: number | null;
  providers: number;
}

const git = (...args: string[]) => {
  const r = Bun.spawnSync(["git", ...args], { cwd: ROOT, stderr: "pipe" });
  if (r.exitCode !== 0) throw new Error(`git ${args.join(" ")}: ${r.stderr.toString().trim()}`);
  return r.stdout.toString().trim();
};

const sides = [revA, revB].map((rev) => {
  const sha = git("rev-parse", "--verify", `${rev}^{commit}`);
  const dir = join(mkdtempSync(join(tmpdir(), "gw-ab-")), "tree");
  git("worktree", "add", "--detach", dir, sha);
  symlinkSync(join(ROOT, "node_modules"), join(dir, "node_modules"));
  copyFileSync(join(import.meta.dir, "cpu-split.ts"), join(dir, "test/bench/cpu-split.ts"));
  return { rev, sha: sha.slice(0, 7), dir, rows: [] as Row[] };
});

const perRequest = (s: Split, cpu: number) => Math.round((cpu * 1e6) / (s.rps * s.wall));

try {
  for (let round = 1; round <= rounds; round++) {
    for (const side of sides) {
      const run = Bun.spawnSync(["bun", "test/bench/cpu-split.ts", mode, c, seconds, "--json"], {
        cwd: side.dir,
        env: { ...process.env, BENCH_PROVIDERS: process.env.BENCH_PROVIDERS ?? "1" },
        stderr: "ignore",
      });
      const s = JSON.parse(run.stdout.toString().trim().split("\n").at(-1)!) as Split;
      // Streams and frames runs report no req/s: per-request CPU is then per run.
      const perReq = mode === "load" || mode === "instant";
      const rate = perReq ? s : { ...s, rps: 1 / s.wall };
      const row: Row = {
        rps: s.rps ?? s.frames_per_s ?? 0,
        p99: s.p99,
        gateway: perRequest(rate, s.cpu_s.gateway),
        main: s.cpu_s.gateway_main === null ? null : perRequest(rate, s.cpu_s.gateway_main),
        providers: perRequest(rate, s.cpu_s.providers),
      };
      side.rows.push(row);
      console.log(
        `${`${side.rev} (${side.sha})`.padEnd(24)} round ${round}: ${perReq ? "req/s" : "deltas/s"} ${row.rps}, p99 ${row.p99} ms, errors ${s.errors}${perReq ? "" : `, stalled ${s.stalled}, max gap ${s.max_gap} ms, TTFT p99 ${s.ttft_p99} ms, gap p99 ${s.gap_p99} ms, transit p99 ${s.transit_p99} ms, last delta's transit p50 / p99 ${s.transit_last_p50} / ${s.transit_last_p99} ms`}, CPU µs per ${perReq ? "request" : "run"}: gateway ${row.gateway} (main thread ${row.main}), providers ${row.providers}`,
      );
    }
  }
  const mean = (rows: Row[], k: keyof Row) => rows.reduce((sum, r) => sum + (r[k] ?? 0), 0) / rows.length;
  console.log("\nmeans (B ÷ A):");
  for (const k of ["rps", "gateway", "main", "providers"] as const) {
    const [a, b] = sides.map((side) => mean(side.rows, k));
    console.log(`  ${k.padEnd(10)} ${a!.toFixed(0).padStart(7)} → ${b!.toFixed(0).padStart(7)}  (${((b! / a!) * 100).toFixed(1)} %)`);
  }
} finally {
  for (const side of sides) {
    git("worktree", "remove", "--force", side.dir);
    rmSync(join(side.dir, ".."), { recursive: true, force: true });
  }
}
