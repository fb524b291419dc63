// Benchmark (a script, not a timed test): time to first token through the gateway with a synthetic
// provider, and gateway RSS idle and with 100 open streams. Everything on loopback, bounded in time.
//   bun test/bench/streaming-core.ts [--requests 300] [--streams 100]
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createHash } from "node:crypto";

const MAIN = join(import.meta.dir, "../../src/main.ts");
const arg = (name: string, def: number) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : def;
};
const REQUESTS = arg("requests", 300);
const STREAMS = arg("streams", 100);

const dataDir = mkdtempSync(join(tmpdir(), "gw-bench-"));
const children: ReturnType<typeof Bun.spawn>[] = [];
const cleanup = () => {
  for (const c of children) c.kill("SIGKILL");
  rmSync(dataDir, { recursive: true, force: true });
};

async function firstJsonLine(proc: ReturnType<typeof Bun.spawn>, predicate: (o: Record<string, unknown>) => boolean) {
  const decoder = new TextDecoder();
  let buffered = "";
  const reader = (proc.stdout as ReadableStream<Uint8Array>).getReader();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) throw new Error("process ended before the expected line");
    buffered += decoder.decode(value, { stream: true });
    for (const line of buffered.split("\n")) {
      try {
        const o = JSON.parse(line);
        if (predicate(o)) {
          // Keep draining: a child whose stdout pipe fills holds its unsent log lines in memory
          // (inflating the RSS this script measures) and retries the write on every turn.
          void (async () => {
            while (!(await reader.read()).done);
          })();
          return o;
        }
      } catch {}
    }
  }
}

const rssKb = (pid: number) => Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, "utf8"))![1]);
const pct = (sorted: number[], p: number) => sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]!;

try {
  const created = Bun.spawnSync(["bun", MAIN, "accounts", "create", "--data-dir", dataDir]);
  const { api_key } = JSON.parse(created.stdout.toString());

  const hash = (model: string) => createHash("sha256").update(model).digest("hex");
  const BENCH_MODELS = ["bench-fast", "bench-slow"];
  // Enforce mode (the default) routes only catalog models; limits are raised by configuration only.
  Bun.spawnSync(["bun", MAIN, "catalog", "init", "--data-dir", dataDir]);
  for (const model of BENCH_MODELS) {
    const added = Bun.spawnSync(["bun", MAIN, "catalog", "add", "--model-id", model, "--model-hash", hash(model), "--data-dir", dataDir]);
    if (added.exitCode !== 0) throw new Error(`catalog add ${model}: ${added.stderr.toString()}`);
  }
  const gateway = Bun.spawn(
    ["bun", MAIN, "serve", "--port", "0", "--data-dir", dataDir, "--log-level", "info",
      "--free-concurrent-requests", "4096", "--free-daily-tokens", "1000000000"],
    { stdout: "pipe", stderr: "inherit" },
  );
  children.push(gateway);
  const listening = await firstJsonLine(gateway, (o) => o.event === "gateway_listening");
  const base = `http://127.0.0.1:${listening.port}`;
  const provider = (id: string, model: string, tps: number) =>
    Bun.spawn(
      ["bun", MAIN, "provider", "--gateway", `ws://127.0.0.1:${listening.port}/v1/provider/connect`, "--id", id,
        "--key-file", join(dataDir, `${id}.key`), "--engine", "synthetic", "--model", `${model}=${hash(model)}`,
        "--max-concurrency", "256", "--synthetic-tokens-per-second", String(tps)],
      { stdout: "ignore", stderr: "inherit" },
    );
  children.push(provider("bench-fast", "bench-fast", 0), provider("bench-slow", "bench-slow", 5));
  // Wait until both are admitted.
  for (let i = 0; i < 200; i++) {
    const status = (await (await fetch(`${base}/v1/status`)).json()) as { pool: { providers_admitted: number }; capacity: { in_flight: number } };
    if (status.pool.providers_admitted === 2) break;
    await Bun.sleep(25);
  }

  const body = (model: string, maxTokens: number) =>
    JSON.stringify({ model, stream: true, max_tokens: maxTokens, messages: [{ role: "user", content: "x".repeat(256) }] });
  const headers = { authorization: `Bearer ${api_key}`, "content-type": "application/json" };

  /** Sends one streaming request; resolves at its first content delta with the elapsed ms. */
  async function firstToken(model: string, maxTokens: number, signal?: AbortSignal) {
    const t0 = performance.now();
    const res = await fetch(`${base}/v1/chat/completions`, { method: "POST", headers, body: body(model, maxTokens), signal });
    const reader = res.body!.getReader();
    const decoder = new TextDecoder();
    let text = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) throw new Error("stream ended before a content delta");
      text += decoder.decode(value, { stream: true });
      if (text.includes('"content"')) return { ms: performance.now() - t0, reader };
    }
  }

  const idleRss = rssKb(gateway.pid);
  // TTFT at concurrency 1 against a provider that answers at once (ttft 0, unthrottled).
  for (let i = 0; i < 20; i++) await (await firstToken("bench-fast", 4)).reader.cancel(); // warm-up, discarded
  const samples: number[] = [];
  for (let i = 0; i < REQUESTS; i++) {
    const { ms, reader } = await firstToken("bench-fast", 4);
    samples.push(ms);
    while (!(await reader.read()).done);
  }
  samples.sort((a, b) => a - b);

  // 100 open streams on the slow provider (5 tokens/s, 200 tokens: they stay open for the measurement).
  const controller = new AbortController();
  const open = await Promise.all(Array.from({ length: STREAMS }, () => firstToken("bench-slow", 200, controller.signal)));
  await Bun.sleep(500);
  const streamsRss = rssKb(gateway.pid);
  const status = (await (await fetch(`${base}/v1/status`)).json()) as { pool: { providers_admitted: number }; capacity: { in_flight: number } };
  controller.abort();
  void open;

  const result = {
    ttft_ms: { p50: +pct(samples, 50).toFixed(3), p99: +pct(samples, 99).toFixed(3), n: samples.length },
    gateway_rss_mb: { idle: +(idleRss / 1024).toFixed(1), with_open_streams: +(streamsRss / 1024).toFixed(1), open_streams: STREAMS },
    per_stream_kb: +((streamsRss - idleRss) / STREAMS).toFixed(1),
    in_flight_seen: status.capacity.in_flight,
    bun: Bun.version,
    cores: navigator.hardwareConcurrency,
  };
  console.log(JSON.stringify(result, null, 2));
} finally {
  cleanup();
}
