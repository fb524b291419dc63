// `bun test/bench/ws-send-batch.ts [streams] [seconds] [rounds]`: what a Bun client WebSocket's `send` costs
// when each frame goes out in its own I/O callback ("direct", as a provider runtime sends its frames) against
// the same frames queued and sent together from one `setImmediate` ("deferred"), on loopback.
//
// Three processes: the bench mock (upstream SSE streams, as a provider runtime reads them), a sink (a
// `Bun.serve` WebSocket, the gateway's side) and the measured client, which opens `streams` paced
// streams (64 deltas × 20 ms each, restarted as they end) and sends one 120-byte binary frame a read.
// Modes alternate per round, each in a fresh client process. Per mode: frames a second, the client's CPU
// a frame (whole process, main thread, the main thread's kernel time; /proc), its timeslices a frame (schedstat),
// frames a flush, the sink's CPU a frame; then one frame at a time (the sink echoes it back, the next is
// sent from the echo's callback): the round trip p50 / p99, which shows what the deferral adds when idle.
// WS_STRACE=DIR runs each client under `strace -c -f` (syscall counts in DIR; its CPU figures then mean
// nothing). `… tight [frames]`: no load, N sends in one turn against one send a `setImmediate` turn, the
// sender's CPU a frame. Not part of `bun run bench`; what it found: docs/benchmarks.md, "Send queue pass".
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { FETCH_ENV, Processes, startMock } from "./stack.ts";

const FRAME_BYTES = 120;

/** CPU seconds (user + system) of a /proc stat file. */
const statCpu = (path: string) => {
  const f = readFileSync(path, "utf8").split(") ")[1]!.split(" ");
  return (Number(f[11]) + Number(f[12])) / 100;
};
/** CPU seconds in the kernel (system) of a /proc stat file. */
const statSys = (path: string) => Number(readFileSync(path, "utf8").split(") ")[1]!.split(" ")[12]) / 100;
/** [run ns, timeslices] of this process's main thread. */
const schedstat = () => {
  const [run, , slices] = readFileSync(`/proc/self/task/${process.pid}/schedstat`, "utf8").trim().split(" ").map(Number);
  return [run!, slices!] as const;
};
const ctxSwitches = () => {
  const s = readFileSync("/proc/self/status", "utf8");
  return Number(/^voluntary_ctxt_switches:\s+(\d+)/m.exec(s)![1]) + Number(/^nonvoluntary_ctxt_switches:\s+(\d+)/m.exec(s)![1]);
};
const pct = (sorted: number[], p: number) => sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]!;

const role = process.argv[2];

if (role === "sink") {
  // The gateway's side: counts frames; "mark" starts/ends a window and answers the sink's CPU in it;
  // "echo" makes it send every binary frame back.
  let frames = 0;
  let echo = false;
  let mark = { cpu: 0, frames: 0 };
  const cpu = () => {
    const u = process.cpuUsage();
    return (u.user + u.system) / 1e6;
  };
  const server = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    fetch(req, srv) {
      return srv.upgrade(req) ? undefined : new Response("no", { status: 400 });
    },
    websocket: {
      message(ws, data) {
        if (typeof data === "string") {
          if (data === "echo") echo = true;
          else if (data === "mark") {
            const now = { cpu: cpu(), frames };
            ws.send(JSON.stringify({ cpu_s: now.cpu - mark.cpu, frames: now.frames - mark.frames }));
            mark = now;
          }
          return;
        }
        frames++;
        if (echo) ws.send(data);
      },
    },
  });
  console.log(JSON.stringify({ port: server.port }));
} else if (role === "tight-client") {
  const [, , , mode, sinkPort, framesArg] = process.argv;
  const n = Number(framesArg);
  const ws = new WebSocket(`ws://127.0.0.1:${sinkPort}`);
  await new Promise((resolve) => (ws.onopen = resolve));
  const frame = new Uint8Array(FRAME_BYTES);
  const u0 = process.cpuUsage();
  if (mode === "oneturn") for (let i = 0; i < n; i++) ws.send(frame);
  else {
    await new Promise<void>((resolve) => {
      let i = 0;
      const step = () => (ws.send(frame), ++i < n ? setImmediate(step) : resolve());
      step();
    });
  }
  const u = process.cpuUsage(u0);
  console.log(JSON.stringify({ mode, sender_us: (u.user + u.system) / n }));
  process.exit(0);
} else if (role === "client") {
  const [, , , mode, sinkPort, mockUrl, streamsArg, secondsArg] = process.argv;
  const streams = Number(streamsArg);
  const seconds = Number(secondsArg);
  const ws = new WebSocket(`ws://127.0.0.1:${sinkPort}`);
  ws.binaryType = "arraybuffer";
  await new Promise((resolve) => (ws.onopen = resolve));
  let answer: (text: string) => void = () => {};
  let echoed: () => void = () => {};
  ws.onmessage = (e) => (typeof e.data === "string" ? answer(e.data) : echoed());
  const ask = (text: string) => new Promise<string>((resolve) => ((answer = resolve), ws.send(text)));

  let queue: Uint8Array[] = [];
  let flushes = 0;
  const flush = () => {
    flushes++;
    const q = queue;
    queue = [];
    for (const f of q) ws.send(f);
  };
  const send =
    mode === "direct"
      ? (f: Uint8Array) => ws.send(f)
      : (f: Uint8Array) => {
          if (queue.push(f) === 1) setImmediate(flush);
        };

  let sent = 0;
  let running = true;
  const body = JSON.stringify({ model: "bench-sse", messages: [{ role: "user", content: "x" }], stream: true });
  const stream = async () => {
    while (running) {
      const res = await fetch(`${mockUrl}/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" }, body });
      const reader = res.body!.getReader();
      for (;;) {
        const { done } = await reader.read();
        if (done) break;
        sent++;
        send(new Uint8Array(FRAME_BYTES));
      }
    }
  };
  const workers = Array.from({ length: streams }, stream);
  await Bun.sleep(3000); // warm-up: every stream started, the JIT past its first compiles
  const t0 = performance.now();
  const mainStat = `/proc/self/task/${process.pid}/stat`;
  const [cpu0, main0, sys0, [run0, slices0], ctx0, sent0, flushes0] = [statCpu("/proc/self/stat"), statCpu(mainStat), statSys(mainStat), schedstat(), ctxSwitches(), sent, flushes];
  await ask("mark");
  await Bun.sleep(seconds * 1000);
  const sink = JSON.parse(await ask("mark")) as { cpu_s: number; frames: number };
  const [cpu1, main1, sys1, [run1, slices1], ctx1, sent1, flushes1] = [statCpu("/proc/self/stat"), statCpu(mainStat), statSys(mainStat), schedstat(), ctxSwitches(), sent, flushes];
  const wall = (performance.now() - t0) / 1000;
  running = false;
  await Promise.all(workers);
  const n = sent1 - sent0;

  // One frame at a time: the sink echoes, the next frame is sent from the echo's callback.
  await Bun.sleep(200); // the load's last queued frames out (in flight they would pair with later echoes)
  ws.send("echo");
  const rtts: number[] = [];
  let start = 0;
  await new Promise<void>((resolve) => {
    echoed = () => {
      rtts.push(performance.now() - start);
      if (rtts.length === 5500) return resolve();
      start = performance.now();
      send(new Uint8Array(FRAME_BYTES));
    };
    start = performance.now();
    send(new Uint8Array(FRAME_BYTES));
  });
  const sorted = rtts.slice(500).sort((a, b) => a - b);
  console.log(
    JSON.stringify({
      mode,
      frames_per_s: Math.round(n / wall),
      client_us: ((cpu1 - cpu0) * 1e6) / n,
      main_us: ((main1 - main0) * 1e6) / n,
      main_sys_us: ((sys1 - sys0) * 1e6) / n,
      main_run_us: (run1 - run0) / 1e3 / n,
      slices_per_frame: (slices1 - slices0) / n,
      ctx_per_frame: (ctx1 - ctx0) / n,
      frames_per_flush: mode === "direct" ? 1 : n / (flushes1 - flushes0),
      sink_us: (sink.cpu_s * 1e6) / sink.frames,
      rtt_p50_us: sorted[Math.floor(sorted.length / 2)]! * 1000,
      rtt_p99_us: pct(sorted, 99) * 1000,
    }),
  );
  process.exit(0);
} else if (role === "tight") {
  const frames = process.argv[3] ?? "20000";
  const straceDir = process.env.WS_STRACE;
  const sink = Bun.spawn(["bun", import.meta.path, "sink"], { stdout: "pipe", stderr: "inherit" });
  try {
    const { value } = await sink.stdout.getReader().read();
    const sinkPort = (JSON.parse(new TextDecoder().decode(value).split("\n")[0]!) as { port: number }).port;
    for (let round = 1; round <= 4; round++) {
      for (const mode of ["oneturn", "perturn"]) {
        const strace = straceDir ? ["strace", "-c", "-f", "-o", join(straceDir, `strace-${mode}-${round}.txt`)] : [];
        const run = Bun.spawnSync([...strace, "bun", import.meta.path, "tight-client", mode, String(sinkPort), frames], { stderr: "inherit" });
        console.log(`round ${round} ${run.stdout.toString().trim()}`);
      }
    }
  } finally {
    sink.kill();
  }
} else {
  const streams = Number(process.argv[2] ?? "256");
  const seconds = Number(process.argv[3] ?? "8");
  const rounds = Number(process.argv[4] ?? "3");
  const straceDir = process.env.WS_STRACE;
  const procs = new Processes();
  try {
    const mock = await startMock(procs, ["bench-sse"]);
    const sink = Bun.spawn(["bun", import.meta.path, "sink"], { stdout: "pipe", stderr: "inherit" });
    procs.all.push(sink);
    const reader = sink.stdout.getReader();
    const { value } = await reader.read();
    const sinkPort = (JSON.parse(new TextDecoder().decode(value).split("\n")[0]!) as { port: number }).port;
    const rows: Record<string, Record<string, number>[]> = { direct: [], deferred: [] };
    for (let round = 1; round <= rounds; round++) {
      for (const mode of round % 2 ? ["direct", "deferred"] : ["deferred", "direct"]) {
        const cmd = ["bun", import.meta.path, "client", mode, String(sinkPort), mock.url, String(streams), String(seconds)];
        const strace = straceDir ? ["strace", "-c", "-f", "-o", join(straceDir, `strace-${mode}-${round}.txt`)] : [];
        const run = Bun.spawnSync([...strace, ...cmd], { env: { ...process.env, ...FETCH_ENV }, stderr: "inherit" });
        const row = JSON.parse(run.stdout.toString().trim().split("\n").at(-1)!) as Record<string, number>;
        rows[mode]!.push(row);
        const fmt = Object.entries(row)
          .filter(([k]) => k !== "mode")
          .map(([k, v]) => `${k} ${typeof v === "number" ? Math.round(v * 100) / 100 : v}`)
          .join(", ");
        console.log(`round ${round} ${mode.padEnd(8)} ${fmt}`);
      }
    }
    console.log("\nmeans:");
    for (const [mode, rs] of Object.entries(rows)) {
      const keys = Object.keys(rs[0]!).filter((k) => k !== "mode");
      console.log(`  ${mode.padEnd(8)} ${keys.map((k) => `${k} ${Math.round((rs.reduce((s, r) => s + r[k]!, 0) / rs.length) * 100) / 100}`).join(", ")}`);
    }
  } finally {
    await procs.stop();
  }
}
