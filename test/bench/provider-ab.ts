// `bun test/bench/provider-ab.ts REV_A REV_B [REV_C …] [--rounds N] [--rate R] [--seconds S]`:
// provider-only.ts on several revisions' provider runtimes, interleaved (A, B, C, then B, C, A, …) so
// that the drift of a shared machine falls on all alike. Each revision is checked out into a temporary git
// worktree (this checkout's node_modules linked in); the scripted gateway and the mock are this
// checkout's. Prints µs CPU a request per run, then each revision's mean and its ratio to the one
// before it and to the first. Defaults: 6 rounds at 600 jobs a second, 8 s each.
import { mkdtempSync, rmSync, symlinkSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";

const ROOT = join(import.meta.dir, "../..");
const { values, positionals: revs } = parseArgs({
  allowPositionals: true,
  options: { rounds: { type: "string", default: "6" }, rate: { type: "string", default: "600" }, seconds: { type: "string", default: "8" } },
});
if (revs.length < 2) {
  console.error("usage: bun test/bench/provider-ab.ts REV_A REV_B [REV_C …] [--rounds N] [--rate R] [--seconds S]");
  process.exit(64);
}
const git = (...args: string[]) => {
  const r = Bun.spawnSync(["git", ...args], { cwd: ROOT, stderr: "pipe" });
  if (r.exitCode !== 0) throw new Error(`git ${args.join(" ")}: ${r.stderr.toString().trim()}`);
  return r.stdout.toString().trim();
};
const sides = revs.map((rev) => {
  const sha = git("rev-parse", "--verify", `${rev}^{commit}`);
  const dir = join(mkdtempSync(join(tmpdir(), "gw-pab-")), "tree");
  git("worktree", "add", "--detach", dir, sha);
  symlinkSync(join(ROOT, "node_modules"), join(dir, "node_modules"));
  return { rev, sha: sha.slice(0, 7), dir, runs: [] as { rps: number; us: number; main: number }[] };
});
const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
try {
  for (let round = 1; round <= Number(values.rounds); round++) {
    // Each round starts one revision later, so that no revision always runs first or last.
    for (let i = 0; i < sides.length; i++) {
      const side = sides[(round - 1 + i) % sides.length]!;
      const run = Bun.spawnSync(["bun", join(import.meta.dir, "provider-only.ts"), values.rate!, values.seconds!, "--json"], {
        cwd: ROOT,
        env: { ...process.env, PROVIDER_MAIN: join(side.dir, "src/main.ts") },
        stderr: "inherit",
      });
      const r = JSON.parse(run.stdout.toString().trim().split("\n").at(-1)!) as { rps: number; us_per_request: number; main_us_per_request: number };
      side.runs.push({ rps: r.rps, us: r.us_per_request, main: r.main_us_per_request });
      console.log(`${`${side.rev} (${side.sha})`.padEnd(24)} round ${round}: ${r.rps} req/s, provider ${r.us_per_request} µs CPU a request (main thread ${r.main_us_per_request})`);
    }
  }
  const means = sides.map((s) => ({ rps: mean(s.runs.map((r) => r.rps)), us: mean(s.runs.map((r) => r.us)), main: mean(s.runs.map((r) => r.main)) }));
  means.forEach((m, i) => {
    const s = sides[i]!;
    const vs = (j: number) => `${(m.us / means[j]!.us).toFixed(3)} (main ${(m.main / means[j]!.main).toFixed(3)})`;
    const ratios = i === 0 ? "" : `; ÷ previous ${vs(i - 1)}${i > 1 ? `, ÷ first ${vs(0)}` : ""}`;
    console.log(`${s.rev} (${s.sha}) mean: ${Math.round(m.rps)} req/s, ${Math.round(m.us)} µs a request (main thread ${Math.round(m.main)})${ratios}`);
  });
} finally {
  for (const side of sides) {
    Bun.spawnSync(["git", "worktree", "remove", "--force", side.dir], { cwd: ROOT });
    rmSync(join(side.dir, ".."), { recursive: true, force: true });
  }
}
