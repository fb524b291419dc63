// Benchmark (a script, not a timed test): time to first token through the gateway with a synthetic
// provider, and gateway RSS idle and with 100 open streams. Everything on loopback, bounded in time.
//   bun test/bench/streaming-core.ts [--requests 300] [--streams 100]
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createHash } from "node:crypto";
import { pct, rssKb, spawnBenchGateway } from "./children.ts";

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



try {
  const created = Bun.spawnSync(["bun", MAIN, "accounts", "create", "--data-dir", dataDir]);
  const { api_key } = JSON.parse(created.stdout.toString());

  const hash = (model: string) => createHash("sha256").update(model).digest("hex");
  const { gateway, port } = await spawnBenchGateway(MAIN, dataDir, { "bench-fast": hash("bench-fast"), "bench-slow": hash("bench-slow") });
  children.push(gateway);
  const base = `http://127.0.0.1:${port}`;
  const provider = (id: string, model: string, tps: number) =>
    Bun.spawn(
      ["bun", MAIN, "provider", "--gateway", `ws://127.0.0.1:${port}/v1/provider/connect`, "--id", id,
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
