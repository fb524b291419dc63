// `bun test/bench/wal-pages.ts [N]` (STREAM=1: a 4-delta stream instead of a JSON answer): what one
// request at a time writes to the WAL, by B-tree. Runs the full stack (one provider runtime), warms it
// with 2,000 requests, truncates the WAL from a second connection, runs N (default 30) more — few
// enough that no automatic checkpoint runs — and maps every WAL frame's page to its table or index
// with SQLite's `dbstat`. Each modified page is one 4 KB frame (two `pwrite`s) of the commit, so this
// is the ledger layout's share of a request's durable-write cost (tenth pass, docs/benchmarks-archive.md).
import { Database } from "bun:sqlite";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { Processes, startGatewayStack, startMock } from "./stack.ts";

const N = Number(process.argv[2] ?? 30);
const procs = new Processes();
try {
  const mock = await startMock(procs);
  const gw = await startGatewayStack(procs, { mockUrl: mock.url, providers: 1, logLevel: "info" });
  const headers = { "content-type": "application/json", authorization: `Bearer ${gw.apiKey}` };
  const stream = process.env.STREAM === "1";
  const body = JSON.stringify({ model: stream ? "bench-sse-n4-i0" : "bench-json", stream, max_tokens: 16, messages: [{ role: "user", content: "x".repeat(256) }] });
  const one = async () => void (await (await fetch(`${gw.url}/v1/chat/completions`, { method: "POST", headers, body })).text());
  for (let i = 0; i < 2000; i++) await one();
  await Bun.sleep(500);
  const file = join(procs.dataDir, "gateway.db");
  const side = new Database(file);
  side.exec("PRAGMA busy_timeout = 5000");
  side.query("PRAGMA wal_checkpoint(TRUNCATE)").get();
  for (let i = 0; i < N; i++) await one();
  await Bun.sleep(500); // the last settlement's commit
  const wal = readFileSync(`${file}-wal`);
  const pageSize = wal.readUInt32BE(8);
  const frames: { page: number; commit: boolean }[] = [];
  for (let at = 32; at + 24 + pageSize <= wal.length; at += 24 + pageSize) frames.push({ page: wal.readUInt32BE(at), commit: wal.readUInt32BE(at + 4) !== 0 });
  const names = new Map<number, string>();
  for (const r of side.query("SELECT name, pageno FROM dbstat").all() as { name: string; pageno: number }[]) names.set(r.pageno, r.name);
  side.close();
  const byTree = new Map<string, number>();
  for (const f of frames) {
    const name = names.get(f.page) ?? `page ${f.page}`;
    byTree.set(name, (byTree.get(name) ?? 0) + 1);
  }
  const commits = frames.filter((f) => f.commit).length;
  console.log(`${frames.length} frames of ${pageSize} bytes in ${commits} commits for ${N} requests: ${(frames.length / N).toFixed(1)} a request`);
  for (const [name, count] of [...byTree].sort((a, b) => b[1] - a[1])) console.log(`${(count / N).toFixed(2).padStart(6)}  ${name}`);
} finally {
  await procs.stop();
}
