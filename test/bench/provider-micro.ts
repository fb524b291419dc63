// `bun test/bench/provider-micro.ts [blocks]`: pieces of the provider runtime's per-request work, each
// timed in isolation in one process (CPU of the whole process: the fetch client's thread and GC
// included), variants alternating in blocks so a shared machine's drift falls on all. It shows the
// size of each piece (a few µs) against a runtime's whole CPU a request (~700 µs, provider-only.ts),
// which moves ±10 % between runs here: what no whole-runtime A/B can resolve (docs/benchmarks.md,
// "Provider runtime pass").
import { generateKeyPairSync } from "node:crypto";
import { issueReceipt } from "../../src/provider/receipts.ts";
import { createReceiptSigner } from "../../src/receipts/index.ts";
import { decodeGatewayFrame, encodeFrame } from "../../src/wire/codec.ts";
import type { JobFrame } from "../../src/wire/frames.ts";
import { Processes, startMock } from "./stack.ts";

const blocks = Number(process.argv[2] ?? "6");
const cpuUs = () => {
  const u = process.cpuUsage();
  return u.user + u.system;
};

/** µs of CPU a call of each variant: `blocks` alternating blocks of `n` calls each (after one warm-up block), means. */
async function compare(name: string, n: number, variants: Record<string, () => unknown>): Promise<void> {
  const totals = Object.fromEntries(Object.keys(variants).map((k) => [k, 0]));
  for (let b = 0; b <= blocks; b++) {
    for (const [label, fn] of Object.entries(variants)) {
      const start = cpuUs();
      for (let i = 0; i < n; i++) await fn();
      if (b > 0) totals[label]! += (cpuUs() - start) / n;
    }
  }
  console.log(`${name}: ${Object.entries(totals).map(([k, v]) => `${k} ${(v / blocks).toFixed(2)} µs`).join(", ")}`);
}

const procs = new Processes();
try {
  const mock = await startMock(procs, ["bench-json"]);
  const url = `${mock.url}/v1/chat/completions`;
  const messages = [{ role: "user", content: "x".repeat(256) }];
  const body = JSON.stringify({ model: "bench-json", messages, max_tokens: 16, stream: true, stream_options: { include_usage: true } });
  const plainHeaders = () => ({ "content-type": "application/json", accept: "text/event-stream" });
  const headers = new Headers(plainHeaders());
  const readLoop = async (response: Response) => {
    const reader = response.body!.getReader();
    const parts: Uint8Array[] = [];
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      parts.push(value);
    }
    return Buffer.concat(parts).toString("utf8");
  };
  const readWhole = async (response: Response) => Buffer.from(await response.arrayBuffer()).toString("utf8");
  const call = async (h: Headers | Record<string, string>, read: (r: Response) => Promise<string>) => {
    const controller = new AbortController();
    const response = await fetch(url, { method: "POST", headers: h, body, signal: controller.signal });
    await read(response);
    controller.abort("finished");
  };
  // 16 upstream calls at a time, as a loaded runtime has several in flight; µs a batch of 16.
  const batch = (h: () => Headers | Record<string, string>, read: (r: Response) => Promise<string>) => () => Promise.all(Array.from({ length: 16 }, () => call(h(), read)));
  await compare("16 upstream calls (the openai engine's fetch, mock answering JSON at once)", 150, {
    "headers per call, stream reader (as shipped)": batch(plainHeaders, readLoop),
    "headers made once": batch(() => headers, readLoop),
    "body by arrayBuffer()": batch(plainHeaders, readWhole),
  });

  const h = (s: string) => s.repeat(64).slice(0, 64);
  const job: JobFrame = {
    type: "job",
    request_id: "req_019acb1e2f3a4b5c6d7e8f90",
    attempt_n: 0,
    model_id: "bench-json-d20",
    messages,
    params: { max_tokens: 16 },
    route: {
      account_scope: h("a"),
      catalog_id: "cat-bench",
      catalog_body_digest: h("b"),
      expected_catalog_model_hash: h("c"),
      route_snapshot_digest: h("d"),
      route_snapshot_mode: "enforce",
      route_snapshot_policy_version: "v1",
      prompt_hash: h("e"),
    },
    deadline_ms: 1_800_000_000_000,
  };
  const jobBytes = new Uint8Array(encodeFrame(job)).buffer;
  const signer = createReceiptSigner(generateKeyPairSync("ed25519").privateKey, "bench-provider");
  const sent = [{ content: "hello world ".repeat(8), tokens: 16 }];
  const issue = () =>
    issueReceipt(signer, { job, modelHash: h("c"), sent, terminal_state: "normal_done", finish_reason: "stop", cancelDeliveredBytes: null, engineInputTokens: 70, terminalAtMs: Date.now(), issuedAtMs: Date.now() });
  const envelope = issue().envelope;
  const fields = { request_id: job.request_id, attempt_n: 0, terminal_state: "normal_done", finish_reason: "stop", chunks: 1, input_tokens: 70, output_tokens: 16, receipt: true };
  await compare("one request's pieces", 5_000, {
    "job frame decode + schema check": () => decodeGatewayFrame(jobBytes),
    "receipt (prefix hash, JCS, Ed25519, base64)": issue,
    "receipt frame encode": () => encodeFrame({ type: "receipt", request_id: job.request_id, attempt_n: 0, receipt: envelope }),
    "outbox entry JSON": () => JSON.stringify({ request_id: job.request_id, attempt_n: 0, receipt: envelope, deadline_ms: 1_800_000_300_000 }),
    "log line (the CLI's JSON of the merged object)": () => JSON.stringify({ ts: new Date().toISOString(), level: "info", event: "job_ended", ...fields }),
  });
} finally {
  await procs.stop();
}
