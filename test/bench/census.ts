// `bun test/bench/census.ts [json|sse|ladder|chunks] [N]`: what the gateway and the provider runtime allocate per
// request (sse: a stream of 256 unthrottled deltas; ladder: the stream ladder's 64 deltas every 20 ms,
// after 20 warm-up streams, the N measured ones all at once as the ladder opens them), by object type —
// the garbage included; `chunks`: per streamed chunk instead — N streams of 16 deltas (every 5 ms)
// then N of 64 (every 20 ms: each delta a frame of its own), 8 at a time, the difference divided by the
// difference in content events the buyer received. Both run
// with the JSC collector off (BUN_JSC_disableGC=1, BUN_GC_TIMER_DISABLE=1) and census-preload.ts; after 300 warm-up requests a
// census is taken, N (default 1,000) requests run one at a time (instant mock), and a second census
// is taken: the difference per request is printed (heap capacity in KB, then object counts by type).
// A type whose count grows by several per request is worth a look: e.g. `Structure` (new hidden
// classes), `Set` (XState's machine interpreter allocates several per step).
import { existsSync, mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Processes, startGatewayStack, startMock } from "./stack.ts";

const [kind = "json", nArg = "1000"] = process.argv.slice(2);
const N = Number(nArg);
const dir = mkdtempSync(join(tmpdir(), "gw-census-"));
process.env.BENCH_CENSUS_DIR = dir; // read by stack.ts: the preload, the env, and the collector off

const procs = new Processes();
try {
  const mock = await startMock(procs);
  const gw = await startGatewayStack(procs, { mockUrl: mock.url, providers: 1, logLevel: "info" });
  if (kind === "chunks") await perChunk(gw, { gateway: gw.gateway.pid, provider: gw.providers[0]!.pid });
  else await perRequest(gw);
} finally {
  await procs.stop();
}

type Census = { capacity: number; types: Record<string, number> };

async function takeCensus(pids: Record<string, number>, n: number): Promise<Record<string, Census>> {
  for (const pid of Object.values(pids)) process.kill(pid, "SIGUSR2");
  const deadline = performance.now() + 5_000;
  while (!Object.values(pids).every((pid) => existsSync(join(dir, `census-${pid}-${n}.json`)))) {
    if (performance.now() > deadline) throw new Error("no census written");
    await Bun.sleep(20);
  }
  await Bun.sleep(50); // written whole
  return Object.fromEntries(Object.entries(pids).map(([name, pid]) => [name, JSON.parse(readFileSync(join(dir, `census-${pid}-${n}.json`), "utf8")) as Census]));
}

/** Allocations per chunk: N short streams, then N long ones; the difference over the extra content events. */
async function perChunk(gw: { url: string; apiKey: string }, pids: Record<string, number>): Promise<void> {
  const headers = { "content-type": "application/json", authorization: `Bearer ${gw.apiKey}` };
  let events = 0;
  const one = async (model: string) => {
    const body = JSON.stringify({ model, stream: true, max_tokens: 64, messages: [{ role: "user", content: "x".repeat(256) }] });
    const text = await (await fetch(`${gw.url}/v1/chat/completions`, { method: "POST", headers, body })).text();
    events += text.split('"content":"').length - 1;
  };
  const run = async (model: string) => {
    const before = events;
    for (let i = 0; i < N; i += 8) await Promise.all(Array.from({ length: Math.min(8, N - i) }, () => one(model)));
    return events - before;
  };
  const [short, long] = ["bench-sse-n16-i5", "bench-sse"];
  await run(short);
  await run(long);
  const c0 = await takeCensus(pids, 0);
  const shortEvents = await run(short);
  const c1 = await takeCensus(pids, 1);
  const longEvents = await run(long);
  const c2 = await takeCensus(pids, 2);
  const chunks = longEvents - shortEvents;
  console.log(`${N} streams of 16 deltas: ${shortEvents} content events; of 64: ${longEvents}; per chunk below (${chunks} chunks)`);
  for (const name of Object.keys(pids)) {
    const [a, b, c] = [c0[name]!, c1[name]!, c2[name]!];
    const perType = (type: string) => ((c.types[type] ?? 0) - (b.types[type] ?? 0) - ((b.types[type] ?? 0) - (a.types[type] ?? 0))) / chunks;
    const rows = [...new Set([...Object.keys(c.types), ...Object.keys(b.types)])]
      .map((type) => [type, perType(type)] as const)
      .filter(([, d]) => d >= 0.05)
      .sort((x, y) => y[1] - x[1]);
    const bytes = (c.capacity - b.capacity - (b.capacity - a.capacity)) / chunks;
    console.log(`${name}: ${bytes.toFixed(0)} B of heap a chunk; objects a chunk: ${rows.map(([type, d]) => `${type} ${d.toFixed(2)}`).join(" · ")}`);
  }
}

/** Allocations per request (json, sse, ladder). */
async function perRequest(gw: Awaited<ReturnType<typeof startGatewayStack>>): Promise<void> {
  const stream = kind === "sse" || kind === "ladder";
  const ladder = kind === "ladder";
  const headers = { "content-type": "application/json", authorization: `Bearer ${gw.apiKey}` };
  const model = ladder ? "bench-sse" : stream ? "bench-sse-n256-i0" : "bench-json";
  const body = JSON.stringify({ model, stream, max_tokens: ladder ? 64 : stream ? 256 : 16, messages: [{ role: "user", content: "x".repeat(256) }] });
  const one = async () => void (await (await fetch(`${gw.url}/v1/chat/completions`, { method: "POST", headers, body })).text());
  const pids = { gateway: gw.gateway.pid, provider: gw.providers[0]!.pid };
  for (let i = 0; i < (ladder ? 20 : 300); i++) await one();
  const c0 = await takeCensus(pids, 0);
  if (ladder) await Promise.all(Array.from({ length: N }, one));
  else for (let i = 0; i < N; i++) await one();
  const after = await takeCensus(pids, 1);
  for (const name of Object.keys(pids)) {
    const [a, b] = [c0[name], after[name]];
    const rows = Object.keys(b!.types)
      .map((type) => [type, ((b!.types[type] ?? 0) - (a!.types[type] ?? 0)) / N] as const)
      .filter(([, d]) => d >= 0.5)
      .sort((x, y) => y[1] - x[1]);
    console.log(`${name}: +${((b!.capacity - a!.capacity) / N / 1024).toFixed(1)} KB of heap a request (${kind}${ladder ? `, ${N} at once` : ", one at a time"})`);
    console.log(`  ${rows.map(([type, d]) => `${type} ${d.toFixed(1)}`).join(" · ")}`);
  }
}
