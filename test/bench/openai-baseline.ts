// Benchmark baseline (a script, not a timed test): a mock OpenAI-compatible server called directly vs
// the same mock behind the whole stack (gateway → WebSocket → provider runtime with the openai engine →
// mock). Time to first token p50/p99, tokens/s relayed (one stream, and many at once), and gateway RSS
// with 100 open streams. Everything on loopback, each process on its own; prints one JSON object.
//   bun test/bench/openai-baseline.ts [--requests 300] [--streams 100] [--long-tokens 2000]
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createHash } from "node:crypto";
import { firstJsonLine, pct, rssKb, spawnBenchGateway } from "./children.ts";

// Bun's fetch caps concurrent requests per process (default 256); the driver opens hundreds at once.
// The variable is read at startup, so the script re-runs itself with it set.
if (!process.env.BUN_CONFIG_MAX_HTTP_REQUESTS) {
  const child = Bun.spawn(["bun", ...process.argv.slice(1)], {
    env: { ...process.env, BUN_CONFIG_MAX_HTTP_REQUESTS: "4096" },
    stdio: ["inherit", "inherit", "inherit"],
  });
  process.exit(await child.exited);
}

const MAIN = join(import.meta.dir, "../../src/main.ts");
const MOCK = join(import.meta.dir, "../support/mockUpstream.ts");
const arg = (name: string, def: number) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : def;
};
const REQUESTS = arg("requests", 300);
const STREAMS = arg("streams", 100);
const LONG_TOKENS = arg("long-tokens", 2000);
const PARALLEL = 20;

// Upstream behaviours, chosen by model name (test/support/mockUpstream.ts parseScenario).
const SHORT = "happy?tokens=4"; // TTFT: answers at once
const LONG = `happy?tokens=${LONG_TOKENS}`; // throughput: unthrottled tokens
const SLOW = "happy?tokens=200&intervalMs=200"; // open streams: 5 tokens/s, stays open for the measurement

const dataDir = mkdtempSync(join(tmpdir(), "gw-bench-openai-"));
const children: ReturnType<typeof Bun.spawn>[] = [];
const cleanup = () => {
  for (const c of children) c.kill("SIGKILL");
  rmSync(dataDir, { recursive: true, force: true });
};


const rssMb = (pid: number) => rssKb(pid) / 1024;
const round = (n: number, digits = 3) => +n.toFixed(digits);

interface Target {
  url: string;
  headers: Record<string, string>;
  model: (scenario: string) => string;
}

/** One streaming request; resolves at its first content delta with the elapsed ms and the open reader. */
async function firstToken(target: Target, scenario: string, signal?: AbortSignal) {
  const t0 = performance.now();
  const res = await fetch(target.url, {
    method: "POST",
    headers: target.headers,
    body: JSON.stringify({ model: target.model(scenario), stream: true, messages: [{ role: "user", content: "x".repeat(256) }] }),
    signal,
  });
  if (!res.ok) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
  const reader = res.body!.getReader();
  const decoder = new TextDecoder();
  let text = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) throw new Error("stream ended before a content delta");
    text += decoder.decode(value, { stream: true });
    if (/"content":"[^"]/.test(text)) return { ms: performance.now() - t0, reader, t0 };
  }
}

/** Streams a whole answer; counts content deltas (one token each) and the time from the first to the end. */
async function streamAll(target: Target, scenario: string) {
  const res = await fetch(target.url, {
    method: "POST",
    headers: target.headers,
    body: JSON.stringify({ model: target.model(scenario), stream: true, messages: [{ role: "user", content: "x".repeat(256) }] }),
  });
  if (!res.ok) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
  const reader = res.body!.getReader();
  const decoder = new TextDecoder();
  let tokens = 0;
  let start = 0;
  let tail = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    const text = tail + decoder.decode(value, { stream: true });
    const cut = text.lastIndexOf("\n\n");
    const found = (text.slice(0, cut + 1).match(/"content":"[^"]/g) ?? []).length;
    if (tokens === 0 && found > 0) start = performance.now();
    tokens += found;
    tail = text.slice(cut + 1);
  }
  return { tokens, seconds: (performance.now() - start) / 1000 };
}

async function ttft(target: Target) {
  for (let i = 0; i < 20; i++) await (await firstToken(target, SHORT)).reader.cancel(); // warm-up, discarded
  const samples: number[] = [];
  for (let i = 0; i < REQUESTS; i++) {
    const { ms, reader } = await firstToken(target, SHORT);
    samples.push(ms);
    while (!(await reader.read()).done);
  }
  samples.sort((a, b) => a - b);
  return { p50: round(pct(samples, 50)), p99: round(pct(samples, 99)), n: samples.length };
}

async function throughput(target: Target) {
  await streamAll(target, LONG); // warm-up
  const single: number[] = [];
  for (let i = 0; i < 5; i++) {
    const { tokens, seconds } = await streamAll(target, LONG);
    if (tokens !== LONG_TOKENS) throw new Error(`expected ${LONG_TOKENS} tokens, got ${tokens}`);
    single.push(tokens / seconds);
  }
  single.sort((a, b) => a - b);
  const t0 = performance.now();
  const runs = await Promise.all(Array.from({ length: PARALLEL }, () => streamAll(target, LONG)));
  const aggregate = runs.reduce((sum, r) => sum + r.tokens, 0) / ((performance.now() - t0) / 1000);
  return { single_stream_median: Math.round(pct(single, 50)), aggregate_parallel: Math.round(aggregate), parallel_streams: PARALLEL };
}

try {
  const mock = Bun.spawn(["bun", MOCK], { stdout: "pipe", stderr: "inherit" });
  children.push(mock);
  const { url: mockUrl } = await firstJsonLine(mock, (o) => o.event === "mock_listening");

  const created = Bun.spawnSync(["bun", MAIN, "accounts", "create", "--data-dir", dataDir]);
  const { api_key } = JSON.parse(created.stdout.toString());
  // One provider serving three models, each mapped to an upstream behaviour.
  const models = { "bench-short": SHORT, "bench-long": LONG, "bench-slow": SLOW };
  const hash = (m: string) => createHash("sha256").update(m).digest("hex");
  const { gateway, port } = await spawnBenchGateway(MAIN, dataDir, Object.fromEntries(Object.keys(models).map((m) => [m, hash(m)])));
  children.push(gateway);
  const base = `http://127.0.0.1:${port}`;

  const provider = Bun.spawn(
    ["bun", MAIN, "provider", "--gateway", `ws://127.0.0.1:${port}/v1/provider/connect`, "--id", "bench-openai",
      "--key-file", join(dataDir, "bench-openai.key"), "--engine", "openai", "--upstream", String(mockUrl),
      "--max-concurrency", "256",
      ...Object.entries(models).flatMap(([id, name]) => ["--model", `${id}=${hash(id)}`, "--upstream-model", `${id}=${name}`])],
    { stdout: "ignore", stderr: "inherit" },
  );
  children.push(provider);
  for (let i = 0; i < 200; i++) {
    const status = (await (await fetch(`${base}/v1/status`)).json()) as { pool: { providers_admitted: number } };
    if (status.pool.providers_admitted === 1) break;
    await Bun.sleep(25);
  }

  const direct: Target = { url: `${mockUrl}/v1/chat/completions`, headers: { "content-type": "application/json" }, model: (s) => s };
  const byScenario = Object.fromEntries(Object.entries(models).map(([id, name]) => [name, id]));
  const stack: Target = {
    url: `${base}/v1/chat/completions`,
    headers: { authorization: `Bearer ${api_key}`, "content-type": "application/json" },
    model: (s) => byScenario[s]!,
  };

  // Open streams first, while the gateway's heap holds nothing but startup state.
  const idleRss = rssMb(gateway.pid);
  const controller = new AbortController();
  const open = await Promise.all(Array.from({ length: STREAMS }, () => firstToken(stack, SLOW, controller.signal)));
  await Bun.sleep(500);
  const streamsRss = rssMb(gateway.pid);
  const providerRss = rssMb(provider.pid);
  const inFlight = async () => ((await (await fetch(`${base}/v1/status`)).json()) as { capacity: { in_flight: number } }).capacity.in_flight;
  const inFlightSeen = await inFlight();
  controller.abort();
  void open;
  for (let i = 0; i < 200 && (await inFlight()) > 0; i++) await Bun.sleep(25);

  const ttftDirect = await ttft(direct);
  const ttftStack = await ttft(stack);
  const tputDirect = await throughput(direct);
  const tputStack = await throughput(stack);
  const afterLoadRss = rssMb(gateway.pid);

  const result = {
    ttft_ms: {
      direct: ttftDirect,
      through_stack: ttftStack,
      ratio_p50: round(ttftStack.p50 / ttftDirect.p50, 2),
      ratio_p99: round(ttftStack.p99 / ttftDirect.p99, 2),
      added_p50_ms: round(ttftStack.p50 - ttftDirect.p50),
    },
    tokens_per_second: {
      answer_tokens: LONG_TOKENS,
      direct: tputDirect,
      through_stack: tputStack,
      ratio_single: round(tputStack.single_stream_median / tputDirect.single_stream_median, 2),
      ratio_aggregate: round(tputStack.aggregate_parallel / tputDirect.aggregate_parallel, 2),
    },
    gateway_rss_mb: {
      idle: round(idleRss, 1),
      with_open_streams: round(streamsRss, 1),
      open_streams: STREAMS,
      per_stream_kb: round(((streamsRss - idleRss) * 1024) / STREAMS, 1),
      in_flight_seen: inFlightSeen,
      after_all_load: round(afterLoadRss, 1),
    },
    provider_rss_mb_with_open_streams: round(providerRss, 1),
    bun: Bun.version,
    cores: navigator.hardwareConcurrency,
  };
  console.log(JSON.stringify(result, null, 2));
} finally {
  cleanup();
}
