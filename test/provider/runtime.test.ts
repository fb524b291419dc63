// The provider runtime against a scripted fake gateway over real loopback WebSockets.
import { afterEach, describe, expect, test } from "bun:test";
import { loadOrCreateProviderKey, type ProviderKey } from "../../src/provider/keys.ts";
import { startProviderRuntime, type ProviderRuntime, type ProviderRuntimeOptions } from "../../src/provider/runtime.ts";
import { createSyntheticEngine, estimateInputTokens, syntheticText, type SyntheticOptions } from "../../src/provider/synthetic.ts";
import type { EngineChunk } from "../../src/provider/engine.ts";
import type { ChunkFrame, EndFrame, HeartbeatFrame, ProviderFrame } from "../../src/wire/frames.ts";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { makeJob, startFakeGateway, withTimeout, type FakeGateway, type FakeSession } from "./fake-gateway.ts";

const HASH = "ab".repeat(32);
const models = [{ model_id: "demo-model", model_hash: HASH, max_context_tokens: 8192 }];
const dir = await mkdtemp(join(tmpdir(), "provider-runtime-"));
const key: ProviderKey = await loadOrCreateProviderKey(join(dir, "provider.pem"));
await rm(dir, { recursive: true, force: true });

let cleanups: Array<() => unknown> = [];
afterEach(async () => {
  for (const cleanup of cleanups.reverse()) await cleanup();
  cleanups = [];
});

interface Harness {
  gateway: FakeGateway;
  runtime: ProviderRuntime;
  logs: Array<{ event: string } & Record<string, unknown>>;
  welcomed(n?: number): Promise<FakeSession>;
}

function start(engine: SyntheticOptions = { tokensPerSecond: 0 }, overrides: Partial<ProviderRuntimeOptions> = {}): Harness {
  const gateway = startFakeGateway({ heartbeatIntervalMs: 40 });
  const logs: Harness["logs"] = [];
  const runtime = startProviderRuntime({
    gatewayUrl: gateway.url,
    providerId: "prov-test.1",
    key,
    engine: createSyntheticEngine(engine),
    models,
    maxConcurrency: 2,
    hardware: { ram_gb: 16 },
    backoff: { minMs: 5, maxMs: 20 },
    log: (event, fields) => logs.push({ event, ...fields }),
    ...overrides,
  });
  cleanups.push(() => gateway.stop(), () => runtime.stop());
  const runtimeWelcomes = new Set<string>();
  const wakeups = new Set<() => void>();
  runtime.on("welcome", (frame) => {
    runtimeWelcomes.add(frame.session_id);
    for (const wake of [...wakeups]) wake();
  });
  return {
    gateway,
    runtime,
    logs,
    /** The n-th session, once the gateway sent welcome *and* the runtime processed it. */
    async welcomed(n = 0) {
      const session = await gateway.session(n);
      const processed = new Promise<void>((resolve) => {
        const check = () => runtimeWelcomes.has(session.sessionId) && (wakeups.delete(check), resolve(), true);
        if (!check()) wakeups.add(check);
      });
      await withTimeout(processed, 1500, `the runtime's welcome of session ${n}`);
      return session;
    },
  };
}

const isType =
  <T extends ProviderFrame["type"]>(type: T, requestId?: string) =>
  (f: ProviderFrame) =>
    f.type === type && (requestId === undefined || (f as { request_id?: string }).request_id === requestId);

const tokensOf = (chunks: ChunkFrame[]) => chunks.reduce((n, c) => n + c.tokens, 0);

/** Collects an attempt's chunks up to and including its end. */
async function untilEnd(session: FakeSession, requestId: string) {
  const end = await session.take<EndFrame>(isType("end", requestId));
  const chunks = session.frames.filter((f): f is ChunkFrame => f.type === "chunk" && f.request_id === requestId);
  return { end, chunks };
}

describe("provider runtime", () => {
  test("handshake: hello → challenge → signed auth → welcome, then heartbeats", async () => {
    const h = start();
    const welcome = new Promise((resolve) => h.runtime.on("welcome", resolve));
    const session = await h.welcomed();
    expect(session.authOk).toBe(true);
    expect(session.hello).toMatchObject({
      protocol: 1,
      provider_id: "prov-test.1",
      max_concurrency: 2,
      hardware: { ram_gb: 16 },
      models,
    });
    expect(Buffer.from(session.hello!.receipt_public_key).equals(Buffer.from(key.publicKeyRaw))).toBe(true);
    expect(await welcome).toMatchObject({ session_id: session.sessionId, heartbeat_interval_ms: 40 });
    expect(h.runtime.connected).toBe(true);
    expect(h.runtime.sessionId).toBe(session.sessionId);

    const beat = await session.take<HeartbeatFrame>(isType("heartbeat"));
    expect(beat).toEqual({ type: "heartbeat", state: "ready", slots_free: 2, models, load: { queued_jobs: 0, decode_tokens_per_s: 0, outstanding_output_tokens: 0 } });
    await session.take(isType("heartbeat"));
    expect(h.logs.find((l) => l.event === "welcome")).toMatchObject({ session_id: session.sessionId, tier: "provisional" });
    expect(session.textFrames).toBe(0);
    expect(session.badFrames).toEqual([]);
  });

  test("a job yields accepted, chunks with seq 0.., and end; nothing of the prompt or output is logged", async () => {
    // Tokens a millisecond apart: each leaves in its own chunk frame.
    const h = start({ tokensPerSecond: 1000 });
    const session = await h.welcomed();
    const job = makeJob({ request_id: "req-ok", messages: [{ role: "user", content: "secret prompt words" }] });
    const seen = new Promise((resolve) => h.runtime.on("job", (...args) => resolve(args)));
    session.send(job);
    expect(await seen).toEqual(["req-ok", 0]);
    expect(await session.take(isType("accepted", "req-ok"))).toEqual({ type: "accepted", request_id: "req-ok", attempt_n: 0, model_hash: HASH });
    const { end, chunks } = await untilEnd(session, "req-ok");
    const expected = syntheticText(job.messages, 100);
    expect(chunks.map((c) => c.seq)).toEqual(expected.map((_, i) => i));
    expect(chunks.map((c) => c.content).join("")).toBe(expected.join(""));
    expect(end).toEqual({
      type: "end",
      request_id: "req-ok",
      attempt_n: 0,
      terminal_state: "normal_done",
      finish_reason: "stop",
      usage: { input_tokens: estimateInputTokens(job.messages), output_tokens: expected.length },
    });
    // Its receipt follows `end` in a `receipt` frame (contents: test/provider/receipts.test.ts).
    expect(await session.take(isType("receipt", "req-ok"))).toMatchObject({ type: "receipt", attempt_n: 0, receipt: expect.any(String) });
    // accepted precedes every chunk, end comes after the last, and the receipt last
    const order = session.frames.filter((f) => f.type !== "heartbeat").map((f) => f.type);
    expect(order[0]).toBe("accepted");
    expect(order.slice(-2)).toEqual(["end", "receipt"]);

    const logged = JSON.stringify(h.logs);
    expect(logged).not.toContain("secret");
    expect(logged).not.toContain(expected[1]!.trim());
    expect(h.logs.find((l) => l.event === "job_received")).toMatchObject({ request_id: "req-ok", attempt_n: 0 });
  });

  test("max_tokens truncates with finish_reason length", async () => {
    const h = start();
    const session = await h.welcomed();
    session.send(makeJob({ request_id: "req-len", params: { max_tokens: 3 } }));
    const { end, chunks } = await untilEnd(session, "req-len");
    expect(tokensOf(chunks)).toBe(3);
    expect(end.finish_reason).toBe("length");
    expect(end.usage.output_tokens).toBe(3);
  });

  /** An engine emitting `bursts` of deltas, each burst at once, with a macrotask between bursts. */
  const bursts = (...groups: EngineChunk[][]): ProviderRuntimeOptions["engine"] => ({
    name: "bursts",
    async run({ emit }) {
      for (const [i, group] of groups.entries()) {
        if (i > 0) await new Promise((resolve) => setImmediate(resolve));
        for (const chunk of group) emit(chunk);
      }
      return { kind: "ended", result: { terminal_state: "normal_done", finish_reason: "stop", usage: { input_tokens: 1, output_tokens: 0 } } };
    },
  });
  const text = (content: string): EngineChunk => ({ content, tokens: 1 });
  const shape = (chunks: ChunkFrame[]) => chunks.map(({ seq, content, tool_calls, tokens }) => ({ seq, content, tool_calls, tokens }));

  test("deltas emitted together leave as one chunk frame; tool-call deltas and later bursts leave on their own", async () => {
    const call = { index: 0, id: "call_1", name: "lookup", arguments: "{}" };
    const h = start({}, { engine: bursts([text("a"), text("b"), { tool_calls: [call], tokens: 1 }, text("c")], [text("d"), text("e")]) });
    const session = await h.welcomed();
    session.send(makeJob({ request_id: "req-m" }));
    const { end, chunks } = await untilEnd(session, "req-m");
    expect(shape(chunks)).toEqual([
      { seq: 0, content: "ab", tool_calls: undefined, tokens: 2 },
      { seq: 1, content: undefined, tool_calls: [call], tokens: 1 },
      { seq: 2, content: "c", tool_calls: undefined, tokens: 1 },
      { seq: 3, content: "de", tool_calls: undefined, tokens: 2 },
    ]);
    expect(end.usage.output_tokens).toBe(6);
  });

  test("merging never takes a chunk past max_tokens: the gateway cuts at the same delta as without it", async () => {
    const h = start({}, { engine: bursts(["a", "b", "c", "d", "e"].map(text)) });
    const session = await h.welcomed();
    session.send(makeJob({ request_id: "req-cap", params: { max_tokens: 3 } }));
    const { chunks } = await untilEnd(session, "req-cap");
    expect(shape(chunks).map((c) => [c.content, c.tokens])).toEqual([["abc", 3], ["d", 1], ["e", 1]]);
  });

  test.each(["buyer_cancel", "gateway_timeout"] as const)("cancel (%s) ends the attempt with that state and the usage sent", async (reason) => {
    const h = start({ tokensPerSecond: 100 });
    const session = await h.welcomed();
    const cancelled = new Promise((resolve) => h.runtime.on("cancel", (...args) => resolve(args)));
    session.send(makeJob({ request_id: "req-c", attempt_n: 1 }));
    await session.take(isType("chunk", "req-c"));
    await session.take(isType("chunk", "req-c"));
    session.send({ type: "cancel", request_id: "req-c", attempt_n: 1, reason, delivered_output_bytes: 10 });
    expect(await cancelled).toEqual(["req-c", 1, reason]);
    const { end, chunks } = await untilEnd(session, "req-c");
    expect(end.terminal_state).toBe(reason);
    expect(end.finish_reason).toBeNull();
    expect(end.usage.output_tokens).toBe(chunks.length);
    expect(chunks.length).toBeLessThan(syntheticText(makeJob().messages, 100).length);
    expect(session.frames.slice(session.frames.indexOf(end)).some((f) => f.type === "chunk")).toBe(false);
    expect(h.logs.find((l) => l.event === "cancel_received")).toEqual({ event: "cancel_received", request_id: "req-c", attempt_n: 1, reason });
  });

  test("declines unknown models and work beyond max_concurrency; reports busy", async () => {
    const h = start({ fault: { kind: "stall" } }, { maxConcurrency: 1 });
    const session = await h.welcomed();
    session.send(makeJob({ request_id: "req-unknown", model_id: "other" }));
    expect(await session.take(isType("declined", "req-unknown"))).toMatchObject({ code: "model_not_loaded" });
    session.send(makeJob({ request_id: "req-a" }));
    await session.take(isType("accepted", "req-a"));
    session.send(makeJob({ request_id: "req-b" }));
    expect(await session.take(isType("declined", "req-b"))).toMatchObject({ code: "queue_full" });
    expect(await session.take(isType("heartbeat"))).toMatchObject({ state: "busy", slots_free: 0 });
    session.send({ type: "cancel", request_id: "req-a", attempt_n: 0, reason: "buyer_cancel", delivered_output_bytes: 0 });
    const { end } = await untilEnd(session, "req-a");
    expect(end).toMatchObject({ terminal_state: "buyer_cancel", usage: { output_tokens: 0 } });
  });

  test("heartbeats report load: jobs without output yet, the decode rate, output tokens still to come", async () => {
    let clock = 1_000_000;
    const h = start({ fault: { kind: "stall" } }, { maxConcurrency: 3, now: () => clock });
    const session = await h.welcomed();
    session.send(makeJob({ request_id: "req-q1", params: { max_tokens: 50 } }));
    session.send(makeJob({ request_id: "req-q2", params: { max_tokens: 70 } }));
    await session.take(isType("accepted", "req-q2"));
    clock += 2_000;
    const beat = await session.take<HeartbeatFrame>((f) => f.type === "heartbeat" && (f as HeartbeatFrame).load?.queued_jobs === 2);
    expect(beat.load).toEqual({ queued_jobs: 2, decode_tokens_per_s: 0, outstanding_output_tokens: 120 });
    for (const id of ["req-q1", "req-q2"]) session.send({ type: "cancel", request_id: id, attempt_n: 0, reason: "buyer_cancel", delivered_output_bytes: 0 });
  });

  test("the decode rate is the output tokens sent per second between reports", async () => {
    let clock = 1_000_000;
    const h = start({ tokensPerSecond: 1000 }, { now: () => clock });
    const session = await h.welcomed();
    // A first report starts the rate's clock.
    await session.take(isType("heartbeat"));
    session.send(makeJob({ request_id: "req-r" }));
    const { chunks } = await untilEnd(session, "req-r");
    clock += 4_000;
    const beat = await session.take<HeartbeatFrame>((f) => f.type === "heartbeat" && ((f as HeartbeatFrame).load?.decode_tokens_per_s ?? 0) > 0);
    expect(beat.load!.decode_tokens_per_s).toBe(Math.round((tokensOf(chunks) / 4) * 10) / 10);
    expect(beat.load!.outstanding_output_tokens).toBe(0);
  });

  test("an engine decline is sent as declined (internal), never after accepted", async () => {
    const h = start({ fault: { kind: "decline" } });
    const session = await h.welcomed();
    session.send(makeJob({ request_id: "req-d" }));
    expect(await session.take(isType("declined", "req-d"))).toMatchObject({ code: "internal" });
    expect(session.frames.some((f) => f.type === "accepted")).toBe(false);
  });

  test("drain: in-flight jobs finish, new ones are declined, heartbeat says draining", async () => {
    const h = start({ tokensPerSecond: 200 });
    const session = await h.welcomed();
    const drained = new Promise((resolve) => h.runtime.on("drain", () => resolve(true)));
    session.send(makeJob({ request_id: "req-inflight" }));
    await session.take(isType("chunk", "req-inflight"));
    session.send({ type: "drain" });
    expect(await drained).toBe(true);
    expect(await session.take(isType("heartbeat"))).toMatchObject({ state: "draining" });
    session.send(makeJob({ request_id: "req-late" }));
    expect(await session.take(isType("declined", "req-late"))).toMatchObject({ code: "queue_full" });
    const { end } = await untilEnd(session, "req-inflight");
    expect(end.terminal_state).toBe("normal_done");
  });

  test("error-after fault ends with provider_error after N chunks", async () => {
    const h = start({ tokensPerSecond: 0, fault: { kind: "error-after", n: 2 } });
    const session = await h.welcomed();
    session.send(makeJob({ request_id: "req-e" }));
    const { end, chunks } = await untilEnd(session, "req-e");
    expect(tokensOf(chunks)).toBe(2);
    expect(end).toMatchObject({ terminal_state: "provider_error", finish_reason: null, usage: { output_tokens: 2 } });
  });

  test("an engine that throws ends the attempt as provider_error; tool-call deltas pass through", async () => {
    const h = start({}, {
      engine: {
        name: "broken",
        async run({ emit }) {
          emit({ tool_calls: [{ index: 0, id: "call_1", name: "lookup", arguments: "{" }], tokens: 2 });
          throw new Error("upstream said: secret prompt words");
        },
      },
    });
    const session = await h.welcomed();
    session.send(makeJob({ request_id: "req-t" }));
    const { end, chunks } = await untilEnd(session, "req-t");
    expect(chunks).toEqual([
      { type: "chunk", request_id: "req-t", attempt_n: 0, seq: 0, tool_calls: [{ index: 0, id: "call_1", name: "lookup", arguments: "{" }], tokens: 2 },
    ]);
    expect(end).toMatchObject({ terminal_state: "provider_error", finish_reason: null, usage: { output_tokens: 2 } });
    expect(h.logs.find((l) => l.event === "engine_error")).toMatchObject({ request_id: "req-t", error: "Error" });
    expect(JSON.stringify(h.logs)).not.toContain("secret");
  });

  test("exit fault in-process drops the socket mid-stream, then the runtime reconnects", async () => {
    const h = start({ tokensPerSecond: 0, fault: { kind: "exit-after", n: 2 } });
    const first = await h.welcomed(0);
    first.send(makeJob({ request_id: "req-x" }));
    const closed = await first.closed;
    expect(closed.code).toBe(1006);
    // Both tokens went out before the drop (in one frame: they were emitted together).
    expect(tokensOf(first.frames.filter((f): f is ChunkFrame => f.type === "chunk"))).toBe(2);
    expect(first.frames.some((f) => f.type === "end")).toBe(false);
    await h.welcomed(1);
    expect(h.runtime.connected).toBe(true);
  });

  test("reconnects after the gateway closes the socket, with backoff reset by the welcome", async () => {
    const h = start({}, { random: () => 0.5 });
    const closedEvent = new Promise((resolve) => h.runtime.on("closed", (...args) => resolve(args)));
    const first = await h.welcomed(0);
    first.close(4012, "heartbeat_timeout");
    expect(await closedEvent).toEqual([4012, "heartbeat_timeout"]);
    const second = await h.welcomed(1);
    expect(second.authOk).toBe(true);
    expect(h.runtime.sessionId).toBe(second.sessionId);
    expect(h.logs.find((l) => l.event === "reconnect_scheduled")).toMatchObject({ delay_ms: 2, attempt: 1 });
  });

  test("backoff grows exponentially with full jitter up to maxMs while the gateway is down", async () => {
    const gone = startFakeGateway();
    const url = gone.url;
    await gone.stop();
    const logs: Array<Record<string, unknown>> = [];
    const delays = new Promise<unknown[]>((resolve) => {
      const runtime = startProviderRuntime({
        gatewayUrl: url,
        providerId: "prov-down",
        key,
        engine: createSyntheticEngine(),
        models,
        backoff: { minMs: 2, maxMs: 8 },
        random: () => 0.5,
        log: (event, fields) => {
          if (event === "reconnect_scheduled") logs.push(fields);
          if (logs.length === 5) resolve(logs.map((l) => l.delay_ms));
        },
      });
      cleanups.push(() => runtime.stop());
    });
    expect(await delays).toEqual([1, 2, 4, 4, 4]);
  });

  test("invalid frames from the gateway close the socket with the protocol's code", async () => {
    const h = start();
    const first = await h.welcomed(0);
    first.sendRaw("not binary");
    expect((await first.closed).code).toBe(1003);
    const second = await h.welcomed(1);
    second.sendRaw(new Uint8Array([0x82])); // a map header with no entries following
    expect((await second.closed).code).toBe(1007);
    const third = await h.welcomed(2);
    third.send({ type: "challenge", session_id: "again", nonce: new Uint8Array(32) });
    expect((await third.closed).code).toBe(1008);
    expect(h.logs.filter((l) => l.event === "invalid_frame").map((l) => l.reason)).toEqual(["not_binary", "undecodable", "out_of_turn"]);
  });

  test("cancel of an unknown job and settled frames are logged and ignored", async () => {
    const h = start();
    const session = await h.welcomed();
    const settled = new Promise((resolve) => h.runtime.on("settled", resolve));
    session.send({ type: "cancel", request_id: "nope", attempt_n: 0, reason: "buyer_cancel", delivered_output_bytes: 0 });
    session.send({ type: "settled", request_id: "req-old", attempt_n: 0, label: "verified", reason: null, provider_credits: 90 });
    expect(await settled).toMatchObject({ request_id: "req-old", label: "verified" });
    expect(h.logs.find((l) => l.event === "frame_ignored")).toMatchObject({ type: "cancel", request_id: "nope" });
    expect(h.runtime.connected).toBe(true);
  });

  test("stop() closes with 1000 and does not reconnect", async () => {
    const h = start();
    const session = await h.welcomed();
    await h.runtime.stop();
    expect(await session.closed).toEqual({ code: 1000, reason: "provider stopping" });
    expect(h.runtime.connected).toBe(false);
    expect(h.logs.some((l) => l.event === "reconnect_scheduled")).toBe(false);
  });
});
