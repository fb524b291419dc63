// The provider runtime signs a v0.4 receipt for every attempt that ends with `end` (sent in a `receipt`
// frame right after it), and the gateway's
// verifier (src/receipts' verifyReceipt, fed a snapshot and a delivered record computed independently
// in trust-support.ts) settles it `verified`: normal end, cancel mid-stream (exactly the delivered
// prefix), provider error, tool calls, and a prompt count capped at the gateway's bound.
import { afterEach, describe, expect, test } from "bun:test";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseEnvelope, promptTokenBound } from "../../src/receipts/index.ts";
import { loadOrCreateProviderKey } from "../../src/provider/keys.ts";
import { startProviderRuntime, type ProviderRuntimeOptions } from "../../src/provider/runtime.ts";
import { createSyntheticEngine, estimateInputTokens, type SyntheticOptions } from "../../src/provider/synthetic.ts";
import type { AcceptedFrame, ChunkFrame, EndFrame, ProviderFrame, ReceiptFrame } from "../../src/wire/frames.ts";
import { startFakeGateway, type FakeSession } from "./fake-gateway.ts";
import { CLOCK_MS, deliveredRecord, judge, routedJob } from "./trust-support.ts";

const HASH = "ab".repeat(32);
const PROVIDER = "prov-receipts";
const models = [{ model_id: "demo-model", model_hash: HASH, max_context_tokens: 8192 }];
const dir = await mkdtemp(join(tmpdir(), "provider-receipts-"));
const key = await loadOrCreateProviderKey(join(dir, "provider.pem"));
await rm(dir, { recursive: true, force: true });

let cleanups: Array<() => unknown> = [];
afterEach(async () => {
  for (const cleanup of cleanups.reverse()) await cleanup();
  cleanups = [];
});

async function start(engine: SyntheticOptions | ProviderRuntimeOptions["engine"] = { tokensPerSecond: 0 }) {
  const gateway = startFakeGateway({ heartbeatIntervalMs: 10_000 });
  const runtime = startProviderRuntime({
    gatewayUrl: gateway.url,
    providerId: PROVIDER,
    key,
    engine: "run" in engine ? engine : createSyntheticEngine(engine),
    models,
    backoff: { minMs: 5, maxMs: 20 },
    now: () => CLOCK_MS, // the receipts' timestamps come from the injected clock
  });
  cleanups.push(() => gateway.stop(), () => runtime.stop());
  const session = await gateway.session(0);
  await session.welcomed;
  return { gateway, runtime, session };
}

const of =
  <T extends ProviderFrame["type"]>(type: T, requestId: string) =>
  (f: ProviderFrame) =>
    f.type === type && (f as { request_id?: string }).request_id === requestId;

const tokensOf = (chunks: ChunkFrame[]) => chunks.reduce((n, c) => n + c.tokens, 0);

function chunksOf(session: FakeSession, requestId: string): ChunkFrame[] {
  return session.frames.filter((f): f is ChunkFrame => f.type === "chunk" && f.request_id === requestId);
}

describe("receipts after end", () => {
  test("normal_done: binds every chunk sent, billable = observed, route echoed, clock timestamps → verified", async () => {
    const { session } = await start();
    const routed = routedJob({ key, providerId: PROVIDER, modelHash: HASH, overrides: { request_id: "req-done" } });
    session.send(routed.job);
    const accepted = await session.take<AcceptedFrame>(of("accepted", "req-done"));
    const end = await session.take<EndFrame>(of("end", "req-done"));
    const receipt = (await session.take<ReceiptFrame>(of("receipt", "req-done"))).receipt;
    const chunks = chunksOf(session, "req-done");
    const tokens = tokensOf(chunks);
    // The synthetic engine at tokensPerSecond 0 emits every token at once: they leave as one frame.
    expect(chunks).toHaveLength(1);
    expect(tokens).toBeGreaterThan(1);
    expect(end.terminal_state).toBe("normal_done");
    expect(typeof receipt).toBe("string");

    const verdict = judge(routed, receipt, key, accepted.model_hash, deliveredRecord(chunks, "normal_done", end.finish_reason));
    expect(verdict).toMatchObject({ label: "verified" });
    const body = verdict.receipt!;
    const input = estimateInputTokens(routed.job.messages);
    expect(body).toMatchObject({
      provider_id: PROVIDER,
      model_hash: HASH,
      ...routed.job.route,
      terminal_state: "normal_done",
      terminal_state_ts_unix_ms: CLOCK_MS,
      issued_at_unix_ms: CLOCK_MS,
      usage: {
        observed_input_tokens: input,
        billable_input_tokens: input,
        observed_output_tokens: tokens,
        billable_output_tokens: tokens,
        delivered_output_bytes: Buffer.byteLength(chunks.map((c) => c.content).join(""), "utf8"),
      },
    });
    expect(end.usage).toEqual({ input_tokens: input, output_tokens: tokens });
  });

  test("cancel mid-stream: binds exactly the delivered prefix, not the chunks sent after it", async () => {
    const { session } = await start({ tokensPerSecond: 200 });
    const routed = routedJob({ key, providerId: PROVIDER, modelHash: HASH, overrides: { request_id: "req-cancel" } });
    session.send(routed.job);
    const accepted = await session.take<AcceptedFrame>(of("accepted", "req-cancel"));
    const relayed: ChunkFrame[] = [];
    for (let i = 0; i < 3; i++) relayed.push(await session.take<ChunkFrame>(of("chunk", "req-cancel")));
    // Let more chunks reach the gateway than it relayed: the receipt must not bind them.
    await session.take<ChunkFrame>(of("chunk", "req-cancel"));
    const deliveredBytes = Buffer.byteLength(relayed.map((c) => c.content).join(""), "utf8");
    session.send({ type: "cancel", request_id: "req-cancel", attempt_n: 0, reason: "buyer_cancel", delivered_output_bytes: deliveredBytes });
    const end = await session.take<EndFrame>(of("end", "req-cancel"));
    const receipt = (await session.take<ReceiptFrame>(of("receipt", "req-cancel"))).receipt;
    expect(chunksOf(session, "req-cancel").length).toBeGreaterThan(relayed.length);
    expect(end).toMatchObject({ terminal_state: "buyer_cancel", finish_reason: null });

    const verdict = judge(routed, receipt, key, accepted.model_hash, deliveredRecord(relayed, "buyer_cancel", null));
    expect(verdict).toMatchObject({ label: "verified" });
    expect(verdict.receipt!.usage).toMatchObject({
      delivered_output_bytes: deliveredBytes,
      observed_output_tokens: 3,
      billable_output_tokens: 3,
    });
    expect(verdict.receipt!.output_prefix_end_byte).toBe(deliveredBytes);
    // Against everything sent, the same receipt does not verify: it binds only the prefix.
    const all = chunksOf(session, "req-cancel");
    expect(judge(routed, receipt, key, accepted.model_hash, deliveredRecord(all, "buyer_cancel", null)).label).toBe("quarantined");
  });

  test("gateway_timeout with nothing delivered: a receipt binding an empty prefix", async () => {
    const { session } = await start({ fault: { kind: "stall" } });
    const routed = routedJob({ key, providerId: PROVIDER, modelHash: HASH, overrides: { request_id: "req-timeout" } });
    session.send(routed.job);
    await session.take(of("accepted", "req-timeout"));
    session.send({ type: "cancel", request_id: "req-timeout", attempt_n: 0, reason: "gateway_timeout", delivered_output_bytes: 0 });
    const end = await session.take<EndFrame>(of("end", "req-timeout"));
    const receipt = (await session.take<ReceiptFrame>(of("receipt", "req-timeout"))).receipt;
    const parsed = parseEnvelope(receipt);
    expect(parsed.ok && parsed.envelope.body).toMatchObject({
      terminal_state: "gateway_timeout",
      output_prefix_end_byte: 0,
      usage: { observed_output_tokens: 0, billable_output_tokens: 0, delivered_output_bytes: 0 },
    });
  });

  test("provider_error: binds every chunk sent → verified", async () => {
    const { session } = await start({ tokensPerSecond: 0, fault: { kind: "error-after", n: 2 } });
    const routed = routedJob({ key, providerId: PROVIDER, modelHash: HASH, overrides: { request_id: "req-err" } });
    session.send(routed.job);
    const accepted = await session.take<AcceptedFrame>(of("accepted", "req-err"));
    const end = await session.take<EndFrame>(of("end", "req-err"));
    const receipt = (await session.take<ReceiptFrame>(of("receipt", "req-err"))).receipt;
    const chunks = chunksOf(session, "req-err");
    expect(tokensOf(chunks)).toBe(2);
    const verdict = judge(routed, receipt, key, accepted.model_hash, deliveredRecord(chunks, "provider_error", null));
    expect(verdict).toMatchObject({ label: "verified", receipt: { terminal_state: "provider_error", usage: { billable_output_tokens: 2 } } });
  });

  test("tool-call deltas and an inflated engine prompt count: calls bound, input capped at the gateway's bound", async () => {
    const { session } = await start({
      name: "tools",
      async run({ emit }) {
        emit({ content: "Let me look. ", tokens: 3 });
        emit({ tool_calls: [{ index: 0, id: "call_1", name: "lookup", arguments: '{"q":' }], tokens: 4 });
        emit({ tool_calls: [{ index: 0, arguments: '"rivers"}' }], tokens: 2 });
        // A tokenizer counting far more than the prompt's bytes: the receipt must not claim it.
        return { kind: "ended", result: { terminal_state: "normal_done", finish_reason: "tool_calls", usage: { input_tokens: 1_000_000, output_tokens: 9 } } };
      },
    });
    const routed = routedJob({ key, providerId: PROVIDER, modelHash: HASH, overrides: { request_id: "req-tools" } });
    session.send(routed.job);
    const accepted = await session.take<AcceptedFrame>(of("accepted", "req-tools"));
    const end = await session.take<EndFrame>(of("end", "req-tools"));
    const receipt = (await session.take<ReceiptFrame>(of("receipt", "req-tools"))).receipt;
    const verdict = judge(routed, receipt, key, accepted.model_hash, deliveredRecord(chunksOf(session, "req-tools"), "normal_done", "tool_calls"));
    expect(verdict).toMatchObject({ label: "verified" });
    const bound = promptTokenBound(routed.job.messages, routed.job.params.tools);
    expect(verdict.receipt!.usage).toMatchObject({ observed_input_tokens: bound, billable_input_tokens: bound, observed_output_tokens: 9 });
    expect(end.usage.input_tokens).toBe(bound);
  });

  test("signed with the hello key: another session key does not verify it", async () => {
    const { session } = await start();
    expect(Buffer.from(session.hello!.receipt_public_key).equals(Buffer.from(key.publicKeyRaw))).toBe(true);
    const routed = routedJob({ key, providerId: PROVIDER, modelHash: HASH, overrides: { request_id: "req-key" } });
    session.send(routed.job);
    const accepted = await session.take<AcceptedFrame>(of("accepted", "req-key"));
    const end = await session.take<EndFrame>(of("end", "req-key"));
    const receipt = (await session.take<ReceiptFrame>(of("receipt", "req-key"))).receipt;
    const otherDir = await mkdtemp(join(tmpdir(), "provider-other-"));
    cleanups.push(() => rm(otherDir, { recursive: true, force: true }));
    const other = await loadOrCreateProviderKey(join(otherDir, "k.pem"));
    const delivered = deliveredRecord(chunksOf(session, "req-key"), "normal_done", end.finish_reason);
    expect(judge(routed, receipt, other, accepted.model_hash, delivered)).toMatchObject({ label: "quarantined", reason: "wrong_key" });
  });
});
