// `bun test/bench/wal-frames.ts [requests ≤ 35]`: the SQLite pages one request writes, by table and index.
// Starts the full stack (one provider runtime, the instant mock), serves 200 requests, truncates both
// WALs (gateway.db, replays.db) once idle, serves N requests one at a time (distinct bodies, as a
// buyer's are), then reads the WAL frames written since — each frame one 4 KB page write — and names
// each frame's page by SQLite's `dbstat`. Frames a request is the c=1 commits' write cost
// (docs/benchmarks.md, "The floor on the durability tiers").
import { Database } from "bun:sqlite";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { Processes, startGatewayStack, startMock } from "./stack.ts";

// SQLite's automatic checkpoint starts the WAL over at 1,000 frames (~40 requests here): more
// requests would count only those after it.
const requests = Math.min(Number(process.argv[2] ?? 35), 35);
const WARM_UP = 200;

/** The page number of each frame of the WAL's current generation (frames whose salts match its header). */
function walFrames(path: string): { pages: number[]; commits: number } {
  const wal = readFileSync(path);
  const pageSize = wal.readUInt32BE(8);
  const [salt1, salt2] = [wal.readUInt32BE(16), wal.readUInt32BE(20)];
  const pages: number[] = [];
  let commits = 0;
  for (let at = 32; at + 24 + pageSize <= wal.length; at += 24 + pageSize) {
    if (wal.readUInt32BE(at + 8) !== salt1 || wal.readUInt32BE(at + 12) !== salt2) break;
    pages.push(wal.readUInt32BE(at));
    if (wal.readUInt32BE(at + 4) !== 0) commits++;
  }
  return { pages, commits };
}

const procs = new Processes();
try {
  const mock = await startMock(procs);
  const gw = await startGatewayStack(procs, { mockUrl: mock.url, providers: 1, logLevel: "info" });
  const headers = { "content-type": "application/json", authorization: `Bearer ${gw.apiKey}` };
  const ask = async (n: string) => {
    const body = JSON.stringify({ model: "bench-json", stream: false, max_tokens: 16, messages: [{ role: "user", content: `${n} ${"x".repeat(250)}` }] });
    const response = await fetch(`${gw.url}/v1/chat/completions`, { method: "POST", headers, body });
    await response.text();
    if (response.status !== 200) throw new Error(`request ${n}: ${response.status}`);
  };
  for (let i = 0; i < WARM_UP; i++) await ask(`w${i}`);
  // Settlements land after the responses; give them time to commit before the WALs start over.
  await Bun.sleep(1500);
  const files = ["gateway.db", "replays.db"];
  for (const file of files) {
    const db = new Database(join(procs.dataDir, file));
    db.query("PRAGMA wal_checkpoint(TRUNCATE)").get();
    db.close();
  }
  for (let i = 0; i < requests; i++) await ask(`m${i}`);
  await Bun.sleep(1500);
  for (const file of files) {
    const path = join(procs.dataDir, `${file}-wal`);
    if (!existsSync(path)) continue;
    const { pages, commits } = walFrames(path);
    const db = new Database(join(procs.dataDir, file), { readonly: true });
    const names = new Map((db.query("SELECT pageno, name FROM dbstat").all() as { pageno: number; name: string }[]).map((r) => [r.pageno, r.name]));
    db.close();
    const byName = new Map<string, number>();
    for (const page of pages) {
      const name = names.get(page) ?? "(a page no table holds now)";
      byName.set(name, (byName.get(name) ?? 0) + 1);
    }
    console.log(`${file}: ${(pages.length / requests).toFixed(1)} frames and ${(commits / requests).toFixed(2)} commits a request (${pages.length} frames, ${requests} requests)`);
    for (const [name, n] of [...byName].sort((a, b) => b[1] - a[1])) console.log(`  ${(n / requests).toFixed(2)}  ${name}`);
  }
} finally {
  await procs.stop();
}
