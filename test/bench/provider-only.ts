// `bun test/bench/provider-only.ts [rate] [seconds] [--json]`: one `gateway provider` process (openai
// engine, the mock upstream at 20 ms, its outbox and earnings files on disk, logs to a file) sent
// `rate` jobs a second by a scripted gateway in this process, which answers each `receipt` with
// `settled` — so the provider runtime's CPU per request is measured without the real gateway's load
// on the same two cores (cpu-split.ts measures it inside the whole stack), and at a fixed rate, so
// that both sides of an A/B spread their fixed costs (timers, heartbeats, JIT) over as many requests.
// PROVIDER_MAIN=PATH runs another checkout's src/main.ts (provider-ab.ts uses it); BENCH_CPU_PROF=DIR
// profiles the provider (test/bench/profile-split.ts reads the .cpuprofile).
import { randomBytes } from "node:crypto";
import { createHash } from "node:crypto";
import { join } from "node:path";
import type { ServerWebSocket } from "bun";
import { decodeProviderFrame, encodeFrame } from "../../src/wire/codec.ts";
import type { JobFrame } from "../../src/wire/frames.ts";
import { cpuSeconds, threadCpuByName } from "./children.ts";
import { FETCH_ENV, MAIN, Processes, startMock } from "./stack.ts";

const json = process.argv.includes("--json");
const [rArg = "600", sArg = "8"] = process.argv.slice(2).filter((a) => a !== "--json");
const rate = Number(rArg);
/** Jobs in flight beyond which no more are sent: below the provider's --max-concurrency 1024. */
const MAX_IN_FLIGHT = 1000;
const seconds = Number(sArg);
const MODEL = "bench-json-d20";
/** BENCH_CPU_PROF=DIR: the provider runs under Bun's CPU profiler (Markdown + .cpuprofile in DIR). */
const PROFILE_DIR = process.env.BENCH_CPU_PROF;
const hex = (s: string) => createHash("sha256").update(s).digest("hex");


let served = 0;
let declined = 0;
let next = 0;
let sent = 0;
let socket = null as ServerWebSocket<unknown> | null; // set by the handshake (a callback: not narrowed)
let welcomed!: () => void;
const ready = new Promise<void>((resolve) => (welcomed = resolve));
const route = {
  account_scope: hex("account"),
  catalog_id: "cat-bench",
  catalog_body_digest: hex("catalog"),
  expected_catalog_model_hash: hex(`bench-weights:${MODEL}`),
  route_snapshot_digest: hex("snapshot"),
  route_snapshot_mode: "enforce" as const,
  route_snapshot_policy_version: "v1",
  prompt_hash: hex("prompt"),
};
const messages = [{ role: "user", content: "x".repeat(256) }];

function sendJob(ws: ServerWebSocket<unknown>): void {
  sent++;
  const job: JobFrame = {
    type: "job",
    request_id: `req_${(next++).toString(16).padStart(24, "0")}`,
    attempt_n: 0,
    model_id: MODEL,
    messages,
    params: { max_tokens: 16 },
    route: { ...route, route_snapshot_digest: hex(`snapshot${next}`) },
    deadline_ms: Date.now() + 60_000,
  };
  ws.send(encodeFrame(job));
}

const server = Bun.serve({
  port: 0,
  hostname: "127.0.0.1",
  fetch(req, srv) {
    if (new URL(req.url).pathname.startsWith("/v1/catalog")) return new Response("no catalog", { status: 404 });
    return srv.upgrade(req) ? undefined : new Response("upgrade required", { status: 426 });
  },
  websocket: {
    message(ws, data) {
      const decoded = decodeProviderFrame(typeof data === "string" ? data : new Uint8Array(data));
      if (!decoded.ok) throw new Error(`bad frame from the provider: ${decoded.reason}`);
      const frame = decoded.frame;
      if (frame.type === "hello") return void ws.send(encodeFrame({ type: "challenge", session_id: "bench", nonce: new Uint8Array(randomBytes(32)) }));
      if (frame.type === "auth") {
        ws.send(encodeFrame({ type: "welcome", session_id: "bench", tier: "provisional", heartbeat_interval_ms: 10_000, catalog_id: "" }));
        socket = ws;
        return welcomed();
      }
      if (frame.type === "receipt") {
        served++;
        const { request_id, attempt_n } = frame;
        return void ws.send(encodeFrame({ type: "settled", request_id, attempt_n, label: "verified", reason: null, provider_credits: 90 }));
      }
      if (frame.type === "declined") declined++;
    },
  },
});

const procs = new Processes();
try {
  const mock = await startMock(procs, [MODEL]);
  const provider = procs.spawn(
    [
      ...(PROFILE_DIR ? ["bun", "--cpu-prof", "--cpu-prof-md", `--cpu-prof-dir=${PROFILE_DIR}`] : ["bun"]),
      process.env.PROVIDER_MAIN ?? MAIN, "provider",
      "--gateway", `ws://127.0.0.1:${server.port}/v1/provider/connect`,
      "--id", "bench-provider",
      "--key-file", join(procs.dataDir, "provider.key"),
      "--engine", "openai",
      "--upstream", mock.url,
      "--max-concurrency", "1024",
      "--advertise-uncatalogued",
      "--model", `${MODEL}=${hex(`bench-weights:${MODEL}`)}`,
    ],
    { env: FETCH_ENV, log: "provider.log" },
  );
  if (PROFILE_DIR) procs.graceful.push(provider);
  await ready;
  // Open loop: every 5 ms, the jobs due since the start.
  const start = performance.now();
  const pacer = setInterval(() => {
    const due = Math.floor(((performance.now() - start) / 1000) * rate);
    while (sent < due && sent - served < MAX_IN_FLIGHT) sendJob(socket!);
  }, 5);
  await Bun.sleep(2000); // warm-up
  const cpu0 = cpuSeconds(provider.pid);
  const threads0 = threadCpuByName(provider.pid);
  const served0 = served;
  const t0 = performance.now();
  await Bun.sleep(seconds * 1000);
  const cpu = cpuSeconds(provider.pid) - cpu0;
  // The main (JS) thread is the one named after the executable.
  const threads = [...threadCpuByName(provider.pid)].map(([name, s]) => ({ name, s: s - (threads0.get(name) ?? 0) })).filter((t) => t.s >= 0.01);
  const requests = served - served0;
  const wall = (performance.now() - t0) / 1000;
  clearInterval(pacer);
  const perRequest = (s: number) => Math.round((s * 1e6) / requests);
  const result = {
    rate,
    wall: +wall.toFixed(2),
    rps: Math.round(requests / wall),
    provider_cpu_s: +cpu.toFixed(2),
    us_per_request: perRequest(cpu),
    main_us_per_request: perRequest(threads.find((t) => t.name === "bun")?.s ?? 0),
    threads_us_per_request: Object.fromEntries(threads.map((t) => [t.name, perRequest(t.s)])),
    declined,
  };
  console.log(
    json
      ? JSON.stringify(result)
      : `provider runtime: ${result.rps} req/s, ${result.us_per_request} µs CPU a request (${result.provider_cpu_s} s over ${result.wall} s); by thread: ${JSON.stringify(result.threads_us_per_request)}`,
  );
} finally {
  socket?.close();
  server.stop(true);
  await procs.stop();
}
