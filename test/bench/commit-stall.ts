// `bun test/bench/commit-stall.ts [concurrency] [seconds]`: does a commit still block the gateway's
// event loop on the buyer's path (issue 27's writer-thread question, docs/decisions.md)? Runs the full
// stack (4 provider runtimes) with sql-timing-preload.ts and loop-delay-preload.ts, warms it, then
// measures two windows: one request at a time (instant mock) and a closed loop at `concurrency`
// (default 256) with the mock answering after 20 ms — settlements under load. For each: req/s, the
// gateway's event-loop delay, and every SQL statement's time on the main thread by synchronous level
// (`[FULL auto]` = an autocommit write paying its own fsync on the event loop).
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { LoadResult, LoadSpec } from "./driver.ts";
import { loopDelay } from "./loopDelay.ts";
import { FETCH_ENV, Processes, startGatewayStack, startMock } from "./stack.ts";

const concurrency = Number(process.argv[2] ?? 256);
const seconds = Number(process.argv[3] ?? 8);
const dir = mkdtempSync(join(tmpdir(), "commit-stall-"));
process.env.BENCH_PRELOAD = join(import.meta.dir, "sql-timing-preload.ts");
process.env.BENCH_SQL_DIR = dir;
process.env.BENCH_LOOP_DIR = dir;

const drive = async (spec: LoadSpec): Promise<LoadResult> => {
  const proc = Bun.spawn(["bun", join(import.meta.dir, "driver.ts"), JSON.stringify(spec)], { env: { ...process.env, ...FETCH_ENV }, stdout: "pipe", stderr: "inherit" });
  return JSON.parse(await new Response(proc.stdout).text()) as LoadResult;
};

const procs = new Processes();
try {
  const mock = await startMock(procs);
  const gw = await startGatewayStack(procs, { mockUrl: mock.url, providers: 4, logLevel: "info" });
  const headers = { "content-type": "application/json", authorization: `Bearer ${gw.apiKey}` };
  const url = `${gw.url}/v1/chat/completions`;
  const body = (model: string) => JSON.stringify({ model, stream: false, max_tokens: 16, messages: [{ role: "user", content: "x".repeat(256) }] });
  await drive({ mode: "load", url, headers, body: body("bench-json"), concurrency: 32, warmupMs: 0, durationMs: 4000 });
  const pid = gw.gateway.pid;
  for (const [name, model, c] of [["c=1, instant mock", "bench-json", 1], [`c=${concurrency}, mock at 20 ms`, "bench-json-d20", concurrency]] as const) {
    await Bun.sleep(500);
    process.kill(pid, "SIGUSR2"); // opens the SQL window (drops the tallies so far)
    const from = Date.now();
    const r = await drive({ mode: "load", url, headers, body: body(model), concurrency: c, warmupMs: 0, durationMs: seconds * 1000 });
    const to = Date.now();
    process.kill(pid, "SIGUSR2");
    await Bun.sleep(400);
    const delay = loopDelay(dir, pid, from, to);
    console.log(`\n## ${name}: ${r.rps} req/s, p50 ${r.latency_ms.p50} ms, p99 ${r.latency_ms.p99} ms, errors ${r.errors}`);
    console.log(`gateway event-loop delay (ms): p50 ${delay?.p50} p90 ${delay?.p90} p99 ${delay?.p99} max ${delay?.max} (n=${delay?.n})`);
    console.log(`main-thread SQL over ${seconds} s (total ms, calls, µs a call, slowest):`);
    const rows = readFileSync(join(dir, `sql-${pid}.txt`), "utf8").split("\n").filter(Boolean);
    const total = rows.reduce((sum, row) => sum + Number(row.trim().split(" ")[0]), 0);
    // Every statement, with its calls a request: requests admitted in the window (one reservation each),
    // so that requests in flight at its edges do not skew the figure at high concurrency.
    const admitted = rows.find((row) => row.includes("INSERT INTO reservations"));
    const requests = admitted ? Number(admitted.trim().split(/\s+/)[2]) : r.ok + r.errors;
    const calls = rows.reduce((sum, row) => sum + Number(row.trim().split(/\s+/)[2]), 0);
    console.log(rows.map((row) => `${(Number(row.trim().split(/\s+/)[2]) / requests).toFixed(2).padStart(6)} /req ${row}`).join("\n"));
    console.log(`… all SQL: ${total.toFixed(1)} ms (${((total / (seconds * 1000)) * 100).toFixed(1)} % of the window); per request: ${(calls / requests).toFixed(1)} statements, ${((total * 1000) / requests).toFixed(0)} µs`);
    console.log("writes at FULL (each its own fsync on the event loop):");
    console.log(rows.filter((row) => row.includes("[FULL") && !row.includes("PRAGMA") && /INSERT|UPDATE|DELETE|COMMIT/.test(row)).join("\n") || "  none");
  }
} finally {
  await procs.stop();
  rmSync(dir, { recursive: true, force: true });
}
