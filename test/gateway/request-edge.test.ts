// The request actor's real edge (src/gateway/requests.ts and dispatch.ts) on an injected SimulatedClock:
// the runner's own chunk path (the first chunk an actor event, later ones checked, counted and relayed
// by the attempt's ChunkMeter, `stream.progress` at most once per idle-check window), the job, cancel
// frames sent to the provider session, failover on the first-byte timeout, the idle watchdog, the
// max_tokens cap and a bad seq — with admitted provider-session actors in a real Registry. Only the
// settlements edge and the buyer's responder are stand-ins (recorders).
import { describe, expect, test } from "bun:test";
import { createActor, fromPromise, SimulatedClock, type InspectionEvent } from "xstate";
import { providerSessionMachine, type AdmissionVerdict } from "../../actors/providerSession.ts";
import { streamIdleCheckMs } from "../../actors/request.ts";
import type { ChatResponder, NormalizedChat, RequestFailure } from "../../src/chat/contract.ts";
import { Registry, type SessionHandle } from "../../src/gateway/registry.ts";
import { createRequestRunner } from "../../src/gateway/requests.ts";
import type { Settlements } from "../../src/gateway/settlements.ts";
import { silentLog } from "../../src/log.ts";
import { unpack } from "msgpackr";
import type { ChunkFrame, EndFrame, HelloFrame } from "../../src/wire/frames.ts";

const FIRST_BYTE_MS = 5_000;
const STALL_MS = 10_000;
const MODEL = "edge-model";

type Sent = { type: string; [k: string]: unknown };

/** An admitted provider session in the registry; what the gateway sends it is decoded into `sent`. */
async function admit(registry: Registry, providerId: string, sent: Sent[]): Promise<SessionHandle> {
  const actor = createActor(
    providerSessionMachine.provide({ actors: { admitProvider: fromPromise(async (): Promise<AdmissionVerdict> => ({ admitted: true, tier: "pinned" })) } }),
    { input: { sessionId: `sess-${providerId}`, nonce: new Uint8Array(32), heartbeatIntervalMs: 600_000 } },
  ).start();
  const hello = {
    type: "hello",
    protocol: 1,
    provider_id: providerId,
    receipt_public_key: new Uint8Array(32),
    runtime: { name: "edge-test", version: "1" },
    hardware: { ram_gb: 1 },
    max_concurrency: 4,
    models: [{ model_id: MODEL, model_hash: `sha256:${"a".repeat(64)}`, max_context_tokens: 8192 }],
  } as unknown as HelloFrame;
  actor.send({ type: "provider.hello", frame: hello });
  actor.send({ type: "provider.auth", signature: new Uint8Array(64) });
  for (let i = 0; i < 100 && !actor.getSnapshot().matches({ admitted: "ready" }); i++) await Bun.sleep(1);
  const session: SessionHandle = {
    sessionId: `sess-${providerId}`,
    actor,
    // Unpacked without the schema check: the stand-in settlements give the job a dummy route.
    send: (bytes) => void sent.push(unpack(bytes) as Sent),
    close: () => {},
    attempts: new Set(),
    refusedModels: new Set(),
  };
  registry.sessions.set(session.sessionId, session);
  registry.admittedByProvider.set(providerId, session);
  return session;
}

/** The settlements edge as a recorder: every write "commits" at the end of the microtask. */
function settlementsStandIn(calls: string[]): Settlements {
  return {
    expectedHash: () => null,
    openAttempt: (input: { requestId: string; attemptN: number }) => {
      calls.push(`open ${input.attemptN}`);
      return { route: "snapshot" };
    },
    relayerFor: () => () => {},
    released: (_r: string, n: number) => void calls.push(`released ${n}`),
    discarded: (_r: string, n: number) => void calls.push(`discarded ${n}`),
    cancelSent: (_r: string, n: number, reason: string) => void calls.push(`cancel ${n} ${reason}`),
    requestEnded: () => void calls.push("ended"),
    afterCommit: (effect: (committed: boolean) => void) => queueMicrotask(() => effect(true)),
  } as unknown as Settlements;
}

function responder() {
  const calls: { kind: string; detail?: unknown }[] = [];
  const r: ChatResponder = {
    response: new Promise(() => {}),
    relay: (frame) => void calls.push({ kind: "relay", detail: frame.seq }),
    discard: () => void calls.push({ kind: "discard" }),
    succeed: (outcome) => void calls.push({ kind: "succeed", detail: outcome }),
    fail: (failure: RequestFailure) => void calls.push({ kind: "fail", detail: failure.code }),
    failMidStream: (failure: RequestFailure) => void calls.push({ kind: "failMidStream", detail: failure.code }),
  };
  return { r, calls };
}

async function setup(providers: string[], maxTokens = 100) {
  const clock = new SimulatedClock();
  const registry = new Registry((run) => queueMicrotask(run));
  const sent = new Map<string, Sent[]>();
  for (const p of providers) {
    sent.set(p, []);
    await admit(registry, p, sent.get(p)!);
  }
  const settlementCalls: string[] = [];
  const actorEvents: string[] = [];
  const runner = createRequestRunner({
    registry,
    now: () => clock.now(),
    monotonicNow: () => clock.now(),
    actorClock: clock,
    maxAttempts: 3,
    firstByteTimeoutMs: FIRST_BYTE_MS,
    streamIdleTimeoutMs: STALL_MS,
    requestDeadlineMs: 600_000,
    inspect: (e: InspectionEvent) => {
      const logic = (e.actorRef as { logic?: { config?: { id?: string } } }).logic;
      if (e.type === "@xstate.event" && logic?.config?.id === "request") actorEvents.push(e.event.type);
    },
    onClosed: () => {},
    log: silentLog,
    settlements: settlementsStandIn(settlementCalls),
    failureStatus: () => 503,
  });
  const buyer = responder();
  const chat = { model: MODEL, stream: true, messages: [{ role: "user", content: "hi" }], params: { max_tokens: maxTokens } } as unknown as NormalizedChat;
  runner.start({ requestId: "req_edge", chat, promptBound: 10, responder: buyer.r });
  await Bun.sleep(0);
  const attempt = (n: number) => registry.attempts.get(`req_edge#${n}`);
  const chunk = (n: number, seq: number, tokens = 1, content = "x") =>
    attempt(n)!.chunk({ type: "chunk", request_id: "req_edge", attempt_n: n, seq, tokens, content } as ChunkFrame);
  const end = (n: number) =>
    attempt(n)!.request.send({
      type: "provider.ended",
      frame: { type: "end", request_id: "req_edge", attempt_n: n, terminal_state: "normal_done", finish_reason: "stop", usage: { input_tokens: 3, output_tokens: 9 } } as EndFrame,
    });
  /** 1 ms at a time (SimulatedClock re-arms a timer from the end of the whole increment). */
  const advance = (ms: number) => {
    for (let i = 0; i < ms; i++) clock.increment(1);
  };
  /** Lets the stand-in's commits run: success waits for the delivered record's commit (docs/receipts.md). */
  const flush = () => new Promise<void>((resolve) => setImmediate(resolve));
  return { clock, registry, sent, settlementCalls, actorEvents, buyer, runner, attempt, chunk, end, advance, flush };
}

describe("the request actor's edge on an injected clock", () => {
  test("the first chunk is the actor's; later ones are relayed by the edge, reporting progress once per window; end → success", async () => {
    const e = await setup(["p1"]);
    expect(e.sent.get("p1")!.map((f) => f.type)).toEqual(["job"]);
    const window = streamIdleCheckMs(STALL_MS);
    e.chunk(0, 0);
    for (let seq = 1; seq <= 12; seq++) {
      e.advance(1_000);
      e.chunk(0, seq);
    }
    e.end(0);
    await e.flush();
    expect(e.buyer.calls.filter((c) => c.kind === "relay").map((c) => c.detail)).toEqual([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
    expect(e.buyer.calls.at(-1)).toEqual({ kind: "succeed", detail: { finishReason: "stop", usage: { prompt_tokens: 3, completion_tokens: 13 } } });
    // One provider.chunk; progress at most once per idle-check window (12 s of chunks: 2–3 windows).
    expect(e.actorEvents.filter((t) => t === "provider.chunk")).toHaveLength(1);
    const progress = e.actorEvents.filter((t) => t === "stream.progress").length;
    expect(progress).toBeGreaterThanOrEqual(1);
    expect(progress).toBeLessThanOrEqual(Math.ceil(12_000 / window));
    expect(e.runner.liveRequests()).toBe(0);
  });

  test("first-byte timeout on the injected clock: cancel to the first provider, the job to the other", async () => {
    const e = await setup(["p1", "p2"]);
    const first = e.attempt(0)!.session.sessionId;
    const [firstId, secondId] = first === "sess-p1" ? ["p1", "p2"] : ["p2", "p1"];
    e.advance(FIRST_BYTE_MS - 1);
    expect(e.sent.get(firstId)!.map((f) => f.type)).toEqual(["job"]);
    e.advance(1);
    await Bun.sleep(0);
    expect(e.sent.get(firstId)!.map((f) => [f.type, f.reason ?? null])).toEqual([["job", null], ["cancel", "gateway_timeout"]]);
    expect(e.sent.get(secondId)!.map((f) => f.type)).toEqual(["job"]);
    expect(e.settlementCalls).toContain("released 0");
    e.chunk(1, 0);
    e.end(1);
    await e.flush();
    expect(e.buyer.calls.at(-1)?.kind).toBe("succeed");
  });

  test("silence after output: the watchdog on the injected clock cancels and the stream fails mid-stream within (T, 1.5 × T]", async () => {
    const e = await setup(["p1"]);
    e.chunk(0, 0);
    e.chunk(0, 1);
    let waited = 0;
    while (!e.buyer.calls.some((c) => c.kind === "failMidStream") && waited < 2 * STALL_MS) {
      e.advance(1);
      waited++;
    }
    expect(waited).toBeGreaterThan(STALL_MS);
    expect(waited).toBeLessThanOrEqual(1.5 * STALL_MS);
    const cancel = e.sent.get("p1")!.find((f) => f.type === "cancel")!;
    expect(cancel).toMatchObject({ reason: "gateway_timeout", delivered_output_bytes: 2 });
  });

  test("a bad seq after output: not relayed, the attempt cancelled, the stream failed mid-stream", async () => {
    const e = await setup(["p1"]);
    e.chunk(0, 0);
    e.chunk(0, 1);
    e.chunk(0, 3);
    expect(e.buyer.calls.filter((c) => c.kind === "relay").map((c) => c.detail)).toEqual([0, 1]);
    expect(e.actorEvents).toContain("stream.seqError");
    expect(e.sent.get("p1")!.find((f) => f.type === "cancel")).toMatchObject({ reason: "gateway_timeout" });
    expect(e.buyer.calls.at(-1)).toEqual({ kind: "failMidStream", detail: "provider_disconnected" });
  });

  test("max_tokens: the chunk past the cap is not relayed; the request succeeds with finish_reason length", async () => {
    const e = await setup(["p1"], 3);
    e.chunk(0, 0, 2);
    e.chunk(0, 1, 2);
    await e.flush();
    expect(e.buyer.calls.filter((c) => c.kind === "relay").map((c) => c.detail)).toEqual([0]);
    expect(e.buyer.calls.at(-1)).toMatchObject({ kind: "succeed", detail: { finishReason: "length", usage: { completion_tokens: 2 } } });
    expect(e.sent.get("p1")!.find((f) => f.type === "cancel")).toMatchObject({ reason: "gateway_timeout", delivered_output_bytes: 1 });
  });
});
