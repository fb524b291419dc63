// `bun test/bench/ledger-path.ts REV_A REV_B [rounds] [requests]`: the embedded store's per-request
// ledger writes alone, A/B between two revisions — the SQL of the buyer's and settlement's paths
// without the HTTP, WebSocket and provider work around it, so a change of a few statements shows
// above the noise that full-stack runs have here (docs/benchmarks.md, "SQL per request pass").
//
// Each revision is checked out into a temporary git worktree and its store opened in this process
// (a fresh database file each round, with group commit and the WAL sync answered at once); rounds
// alternate A, B, A, B. A request is what the gateway's request runs: reserve, route snapshot,
// accepted measurement, receipt arrival, delivered record, request end, and a verified settlement with
// its posting, committed in groups of `GROUP` requests (a c=256 load's groups hold ~60). Prints each
// side's µs a request (wall time of the loop on one thread) and statements a request.
import { createHash } from "node:crypto";
import { existsSync, mkdtempSync, readFileSync, rmSync, symlinkSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const ROOT = join(import.meta.dir, "../..");
const [revA, revB, roundsArg = "6", requestsArg = "4000"] = process.argv.slice(2);
if (!revA || !revB) {
  console.error("usage: bun test/bench/ledger-path.ts REV_A REV_B [rounds] [requests]");
  process.exit(64);
}
const rounds = Number(roundsArg);
const requests = Number(requestsArg);
const GROUP = 32;

const git = (...args: string[]) => {
  const r = Bun.spawnSync(["git", ...args], { cwd: ROOT, stderr: "pipe" });
  if (r.exitCode !== 0) throw new Error(`git ${args.join(" ")}: ${r.stderr.toString().trim()}`);
  return r.stdout.toString().trim();
};

interface Side {
  rev: string;
  dir: string;
  /** Whether the revision writes the accepted measurement with the delivered record. */
  folds: boolean;
  openStore: (path: string, options: object) => Record<string, (...args: unknown[]) => unknown>;
  us: number[];
  statements: number[];
}

const sides: Side[] = [];
for (const rev of [revA, revB]) {
  const sha = git("rev-parse", "--verify", `${rev}^{commit}`);
  const dir = join(mkdtempSync(join(tmpdir(), "gw-ledger-ab-")), "tree");
  git("worktree", "add", "--detach", dir, sha);
  symlinkSync(join(ROOT, "node_modules"), join(dir, "node_modules"));
  const folds = readFileSync(join(dir, "src/store/ledgerTypes.ts"), "utf8").includes("accepted_model_hash?: string | null;");
  const { openStore } = (await import(join(dir, "src/store/index.ts"))) as { openStore: Side["openStore"] };
  sides.push({ rev: `${rev} (${sha.slice(0, 7)})`, dir, folds, openStore, us: [], statements: [] });
}

const snapshot = (request_id: string) => JSON.stringify({ request_id, attempt_n: 0, pad: "x".repeat(600) });
const digest = (text: string) => createHash("sha256").update(text).digest("hex");
const modelHash = "a".repeat(64);
const envelope = `${"e".repeat(1800)}.sig`;
const delivered = {
  output_hash: "2".repeat(64),
  start_byte: 0,
  end_byte: 64,
  tokens: 16,
  terminal_state: "normal_done",
  finish_reason: "stop",
  tool_calls_delivered: false,
  tool_call_bytes: 0,
  reported_input_tokens: 70,
};

/** Counts statements run on every Database of this process (prepared statements' run/get/all). */
let statementCount = 0;
const { Database } = await import("bun:sqlite");
for (const method of ["query", "prepare"] as const) {
  const original = Database.prototype[method] as unknown as (this: unknown, sql: string, ...rest: unknown[]) => Record<string, unknown>;
  const seen = new WeakSet<object>();
  (Database.prototype as unknown as Record<string, unknown>)[method] = function (this: unknown, sql: string, ...rest: unknown[]) {
    const statement = original.call(this, sql, ...rest);
    if (!seen.has(statement)) {
      seen.add(statement);
      for (const run of ["run", "get", "all"]) {
        const f = statement[run] as (...args: unknown[]) => unknown;
        statement[run] = (...args: unknown[]) => {
          statementCount++;
          return f.apply(statement, args);
        };
      }
    }
    return statement;
  };
}

function round(side: Side, n: number): void {
  const dir = mkdtempSync(join(tmpdir(), "gw-ledger-path-"));
  const store = side.openStore(join(dir, "gateway.db"), { now: () => 1_700_000_000_000, groupCommit: true, lazyCommitTimer: () => {}, endOfTurn: () => {}, syncWal: (done: (ok: boolean) => void) => done(true) });
  const { account_id } = store.createAccount!({ tier: "paid" }) as { account_id: string };
  store.grantCredits!(account_id, 1_000_000_000);
  const rates = { prompt_credits_per_million: 200_000, completion_credits_per_million: 600_000, provider_share_bps: 9000 };
  // Warm the statements once.
  const one = (i: number) => {
    const request_id = `req_${n}_${i}`;
    const text = snapshot(request_id);
    store.reserve!({ request_id, account_id, payer: "buyer", day: "2026-11-27", tokens: 300, credits: 5_000 });
    store.recordRouteSnapshot!({ request_id, attempt_n: 0, provider_id: `p${i % 4}`, account_id, payer: "buyer", mode: "enforce", snapshot_json: text, digest: digest(text), rates });
    if (!side.folds) store.recordAcceptedMeasurement!(request_id, 0, modelHash);
    const arrival_id = store.recordReceiptArrival!({ request_id, attempt_n: 0, provider_id: `p${i % 4}`, envelope, disposition: "judged" }) as number;
    store.recordAttemptEnd!(request_id, 0, delivered, 1_700_000_300_000, 1_700_000_000_000, ...(side.folds ? [modelHash] : []));
    store.markRequestEnded!(request_id);
    const settled = store.settleAttempt!({
      request_id,
      attempt_n: 0,
      label: "verified",
      reason: null,
      receipt: { envelope, received_at_ms: 1_700_000_000_000, arrival_id },
      billed: { prompt_tokens: 70, completion_tokens: 16 },
      ...(side.folds ? { accepted_model_hash: modelHash } : {}),
    }) as { ok: boolean };
    if (!settled.ok) throw new Error(`${side.rev}: settlement refused`);
    if (i % GROUP === GROUP - 1) store.flushCommits!();
  };
  for (let i = 0; i < 200; i++) one(-i - 1);
  store.flushCommits!();
  const before = statementCount;
  const start = performance.now();
  for (let i = 0; i < requests; i++) one(i);
  store.flushCommits!();
  side.us.push(((performance.now() - start) * 1000) / requests);
  side.statements.push((statementCount - before) / requests);
  store.close!();
  rmSync(dir, { recursive: true, force: true });
}

try {
  for (let r = 0; r < rounds; r++) {
    for (const side of sides) {
      round(side, r);
      console.log(`round ${r + 1} ${side.rev}: ${side.us.at(-1)!.toFixed(1)} µs a request, ${side.statements.at(-1)!.toFixed(2)} statements`);
    }
  }
  const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
  const [a, b] = sides as [Side, Side];
  console.log(`\nA ${a.rev}: ${mean(a.us).toFixed(1)} µs a request, ${mean(a.statements).toFixed(2)} statements (prepared-statement runs; BEGIN/COMMIT not counted)`);
  console.log(`B ${b.rev}: ${mean(b.us).toFixed(1)} µs a request, ${mean(b.statements).toFixed(2)} statements`);
  console.log(`B ÷ A: ${((mean(b.us) / mean(a.us)) * 100).toFixed(1)} % of the µs; by round ${a.us.map((x, i) => `${((b.us[i]! / x) * 100).toFixed(0)} %`).join(", ")}`);
} finally {
  for (const side of sides) {
    git("worktree", "remove", "--force", side.dir);
    if (existsSync(side.dir)) rmSync(side.dir, { recursive: true, force: true });
  }
}
