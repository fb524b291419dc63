// One buyer request through the gateway's real request edge on a SimulatedClock: the runner
// (src/gateway/requests.ts, dispatch.ts, routing) and the provider endpoint (providerEndpoint.ts) with
// admitted provider sessions, whose sockets are stand-ins that encode and decode real frames. Only the
// settlements edge and the buyer's responder are recorders; the end of an event-loop turn (group commit,
// slot counts) runs when the harness says, so every step is synchronous and deterministic.
import type { WebSocketHandler } from "bun";
import { SimulatedClock, type ActorRefFrom, type ActorRefLike, type InspectionEvent } from "xstate";
import type { AdmissionVerdict } from "../../actors/providerSession.ts";
import type { RequestLogic, RequestSnapshot } from "../../actors/request.ts";
import type { ChatResponder, NormalizedChat, RequestFailure } from "../../src/chat/contract.ts";
import type { ChunkMeter } from "../../src/gateway/chunkMeter.ts";
import { providerWebSocketHandler, type EndpointCluster, type SocketData } from "../../src/gateway/providerEndpoint.ts";
import { attemptKey, Registry } from "../../src/gateway/registry.ts";
import { createRequestRunner, type RequestRunnerDeps } from "../../src/gateway/requests.ts";
import type { Settlements } from "../../src/gateway/settlements.ts";
import { silentLog } from "../../src/log.ts";
import { decodeGatewayFrame, encodeFrame } from "../../src/wire/codec.ts";
import type { DeclineCode, GatewayFrame, JobRoute, ProviderFrame, TerminalState } from "../../src/wire/frames.ts";

export const EDGE_MODEL = "edge-model";
const MODEL_HASH = "a".repeat(64);
const REQUEST_ID = "req_edge";
/** The job's route as settlements would build it (its digests are not checked here). */
const ROUTE: JobRoute = {
  account_scope: "acct",
  catalog_id: "catalog",
  catalog_body_digest: "d",
  expected_catalog_model_hash: MODEL_HASH,
  route_snapshot_digest: "d",
  route_snapshot_mode: "observe",
  route_snapshot_policy_version: "1",
  prompt_hash: "d",
};
const MODELS = [{ model_id: EDGE_MODEL, model_hash: MODEL_HASH, max_context_tokens: 8192 }];

/** What the request's edge did, in order: frames the providers got, and calls to settlements and the buyer. */
export type EdgeEffect =
  | { kind: "job"; attemptN: number; providerId: string }
  | { kind: "cancel"; attemptN: number; providerId: string; reason: string; deliveredOutputBytes: number }
  | { kind: "open"; attemptN: number; providerId: string }
  | { kind: "released"; attemptN: number }
  | { kind: "discarded"; attemptN: number }
  | { kind: "cancelSent"; attemptN: number; reason: string }
  | { kind: "relay"; attemptN: number; seq: number; content: string | undefined }
  | { kind: "discard" }
  | { kind: "succeed"; finishReason: string; promptTokens: number; completionTokens: number }
  | { kind: "fail"; failure: RequestFailure }
  | { kind: "failMidStream"; failure: RequestFailure };

type EffectOf<K extends EdgeEffect["kind"]> = Extract<EdgeEffect, { kind: K }>;

export interface EdgeOptions {
  /** Admitted provider ids, all serving EDGE_MODEL; routing prefers them in id order when all are alike. */
  providers: string[];
  model?: string;
  streaming?: boolean;
  maxTokens?: number;
  maxAttempts?: number;
  firstByteTimeoutMs?: number;
  streamIdleTimeoutMs?: number;
  requestDeadlineMs?: number;
  /** The request's messages (a dispatch encodes them into the job). */
  messages?: unknown[];
  /** Providers that report, before the request, that they are asleep: known, but not routable. */
  asleep?: string[];
  /** Ends of turns wait for `commit()`: the first attempt's route snapshot is not durable yet. */
  holdCommits?: boolean;
  /** The request actor's logic (the statechart variant runs through the same edge). */
  requestLogic?: RequestRunnerDeps["requestLogic"];
  /** A cluster node's side: the endpoint asks whether the node stalled past its lease before each frame (true: it fences). */
  stalled?: () => boolean;
}

/** A provider's side of its socket to the gateway's real endpoint handler. */
interface ProviderSocket {
  ws: { data: SocketData; send(bytes: Uint8Array): number; close(code?: number, reason?: string): void };
  open: boolean;
}

export async function startRequestEdge(o: EdgeOptions) {
  const clock = new SimulatedClock();
  const effects: EdgeEffect[] = [];
  /** The end of the event-loop turn: group commits and the registry's slot counts. */
  const endOfTurn: (() => void)[] = [];
  let held = o.holdCommits ?? false;
  const drain = () => {
    while (!held && endOfTurn.length > 0) endOfTurn.shift()!();
  };
  const registry = new Registry((run) => void endOfTurn.push(run));
  const meters = new Map<number, ChunkMeter>();

  const settlements = {
    expectedHash: () => MODEL_HASH,
    openAttempt: (input: { attemptN: number; providerId: string }) => {
      effects.push({ kind: "open", attemptN: input.attemptN, providerId: input.providerId });
      return ROUTE;
    },
    relayerFor: () => () => {},
    released: (_r: string, attemptN: number) => void effects.push({ kind: "released", attemptN }),
    discarded: (_r: string, attemptN: number) => void effects.push({ kind: "discarded", attemptN }),
    cancelSent: (_r: string, attemptN: number, reason: string) => void effects.push({ kind: "cancelSent", attemptN, reason }),
    requestEnded: () => {},
    afterCommit: (effect: (committed: boolean) => void) => void endOfTurn.push(() => effect(true)),
    // The turn's output leaves with its end, before the commits queued after this.
    afterOutputSent: (run: () => void) => void endOfTurn.push(run),
    accepted: () => true,
    endReceived: () => false,
    receiptArrived: () => "unknown_attempt" as const,
  } as unknown as Settlements;

  /** The runner's fence, once it exists: a stalled node ends every request in flight. */
  let fence = () => {};
  let fenced = false;
  const cluster: EndpointCluster | undefined = o.stalled
    ? {
        noticeStall: () => {
          if (fenced || !o.stalled!()) return;
          fenced = true;
          fence();
        },
        forwardedFrame: () => false,
        receipt: () => false,
        sessionLost() {},
        sessionChanged() {},
      }
    : undefined;
  const handler: WebSocketHandler<SocketData> = providerWebSocketHandler({
    ...(cluster ? { cluster } : {}),
    registry,
    admit: async (): Promise<AdmissionVerdict> => ({ admitted: true, tier: "pinned" }),
    newSessionId: (() => {
      let n = 0;
      return () => `sess-${++n}`;
    })(),
    randomBytes: (n) => new Uint8Array(n),
    // Far beyond any test's simulated time: no heartbeat is due.
    heartbeatIntervalMs: 1e9,
    handshakeTimeoutMs: 10_000,
    catalogId: () => "catalog",
    onAdmitted: () => {},
    onClosed: () => {},
    log: silentLog,
    settlements,
    now: () => clock.now(),
    receiptFrames: { perSecond: 10, burst: 10 },
    maxChunkBytesPerToken: 1024,
    clock,
  });

  const sockets = new Map<string, ProviderSocket>();
  const connect = async (providerId: string) => {
    const socket: ProviderSocket = {
      open: true,
      ws: {
        data: {},
        send: (bytes) => {
          const decoded = decodeGatewayFrame(bytes);
          if (!decoded.ok) throw new Error(`the gateway sent a malformed frame: ${decoded.reason}`);
          const f: GatewayFrame = decoded.frame;
          if (f.type === "job") {
            effects.push({ kind: "job", attemptN: f.attempt_n, providerId });
            meters.set(f.attempt_n, registry.attempts.get(attemptKey(REQUEST_ID, f.attempt_n))!.meter);
          }
          if (f.type === "cancel") {
            effects.push({ kind: "cancel", attemptN: f.attempt_n, providerId, reason: f.reason, deliveredOutputBytes: f.delivered_output_bytes });
          }
          return bytes.byteLength;
        },
        close: (code = 1000) => {
          if (!socket.open) return;
          socket.open = false;
          handler.close?.(socket.ws as never, code, "");
        },
      },
    };
    sockets.set(providerId, socket);
    handler.open?.(socket.ws as never);
    send(providerId, { type: "hello", protocol: 1, provider_id: providerId, receipt_public_key: new Uint8Array(32), runtime: { name: "edge-test", version: "1" }, hardware: { ram_gb: 1 }, max_concurrency: 4, models: MODELS });
    send(providerId, { type: "auth", signature: new Uint8Array(64) });
    // Admission is a promise actor: it settles within a few microtasks.
    for (let i = 0; i < 100 && !registry.admittedByProvider.has(providerId); i++) await Promise.resolve();
    if (!registry.admittedByProvider.has(providerId)) throw new Error(`${providerId} was not admitted`);
  };
  /** A frame from a provider, through the endpoint's decoder and router. */
  const send = (providerId: string, frame: ProviderFrame) => {
    const socket = sockets.get(providerId)!;
    if (socket.open) handler.message?.(socket.ws as never, Buffer.from(encodeFrame(frame)));
  };
  for (const p of o.providers) await connect(p);
  for (const p of o.asleep ?? []) send(p, { type: "heartbeat", state: "asleep", slots_free: 0, models: MODELS });
  drain();

  let request: ActorRefLike | null = null;
  /** Events the request actor received (its own timers' included), with the simulated time. */
  const events: { type: string; at: number }[] = [];
  const runner = createRequestRunner({
    registry,
    now: () => clock.now(),
    monotonicNow: () => clock.now(),
    actorClock: clock,
    maxAttempts: o.maxAttempts ?? 3,
    firstByteTimeoutMs: o.firstByteTimeoutMs ?? 5_000,
    streamIdleTimeoutMs: o.streamIdleTimeoutMs ?? 120_000,
    requestDeadlineMs: o.requestDeadlineMs ?? 60_000,
    inspect: (e: InspectionEvent) => {
      if (e.type === "@xstate.actor" && !request) request = e.actorRef;
      if (e.type === "@xstate.event" && e.actorRef === request) events.push({ type: e.event.type, at: clock.now() });
    },
    onClosed: () => {},
    log: silentLog,
    settlements,
    failureStatus: () => 503,
    ...(o.requestLogic ? { requestLogic: o.requestLogic } : {}),
  });
  fence = () => void runner.fence();

  const responder: ChatResponder = {
    response: new Promise(() => {}),
    relay: (frame) => void effects.push({ kind: "relay", attemptN: frame.attempt_n, seq: frame.seq, content: frame.content }),
    discard: () => void effects.push({ kind: "discard" }),
    succeed: (outcome) =>
      void effects.push({ kind: "succeed", finishReason: outcome.finishReason, promptTokens: outcome.usage.prompt_tokens, completionTokens: outcome.usage.completion_tokens }),
    fail: (failure) => void effects.push({ kind: "fail", failure }),
    failMidStream: (failure) => void effects.push({ kind: "failMidStream", failure }),
  };
  const chat = {
    model: o.model ?? EDGE_MODEL,
    stream: o.streaming ?? true,
    messages: o.messages ?? [{ role: "user", content: "hi" }],
    params: { max_tokens: o.maxTokens ?? 100 },
  } as unknown as NormalizedChat;
  const { abort } = runner.start({ requestId: REQUEST_ID, chat, promptBound: 10, responder });
  drain();

  const snapshot = () => (request as ActorRefFrom<RequestLogic>).getSnapshot() as RequestSnapshot;
  const of = <K extends EdgeEffect["kind"]>(kind: K) => effects.filter((e): e is EffectOf<K> => e.kind === kind);
  /** The provider of the attempt frames go to: the current one, else the last that got a job. */
  const currentProvider = () => snapshot().context.current?.providerId ?? of("job").at(-1)?.providerId ?? o.providers[0]!;
  const currentAttempt = () => snapshot().context.current?.attemptN ?? of("job").at(-1)?.attemptN ?? 0;
  const step = (run: () => void) => {
    run();
    drain();
  };

  return {
    clock,
    registry,
    runner,
    effects,
    events,
    snapshot,
    of,
    /** Effect kinds in order, for order checks. */
    kinds: () => effects.map((e) => e.kind),
    /** Jobs sent, as [attempt, provider]. */
    jobs: () => of("job").map((j) => [j.attemptN, j.providerId]),
    /** Cancels sent to providers, as [attempt, reason]. */
    cancels: () => of("cancel").map((c) => [c.attemptN, c.reason]),
    released: () => of("released").map((r) => r.attemptN),
    /** Chunks relayed to the buyer, as [attempt, seq]. */
    relayed: () => of("relay").map((r) => [r.attemptN, r.seq]),
    /** Attempt n's ChunkMeter as the edge registered it (its delivered counts). */
    meter: (attemptN = currentAttempt()) => meters.get(attemptN)!,
    chunk: (seq: number, tokens: number, content?: string) =>
      step(() => send(currentProvider(), { type: "chunk", request_id: REQUEST_ID, attempt_n: currentAttempt(), seq, tokens, ...(content === undefined ? {} : { content }) })),
    end: (terminal_state: TerminalState = "normal_done", finish_reason: string | null = "stop") =>
      step(() => send(currentProvider(), { type: "end", request_id: REQUEST_ID, attempt_n: currentAttempt(), terminal_state, finish_reason, usage: { input_tokens: 3, output_tokens: 3 } })),
    decline: (code: DeclineCode) => step(() => send(currentProvider(), { type: "declined", request_id: REQUEST_ID, attempt_n: currentAttempt(), code })),
    /** The current provider's socket drops. */
    lose: () => step(() => sockets.get(currentProvider())!.ws.close(1006)),
    abort: () => step(abort),
    /** Moves the simulated clock in one increment, then ends the turn. */
    increment: (ms: number) => step(() => clock.increment(ms)),
    /**
     * Moves time 1 ms at a time: SimulatedClock re-arms a timer from the time of the whole increment,
     * so one big increment would stretch the watchdog's periodic windows.
     */
    advance: (ms: number) => {
      for (let i = 0; i < ms; i++) step(() => clock.increment(1));
    },
    /** Ends of turns wait until `commit()` (a route snapshot not yet durable). */
    holdCommits: () => void (held = true),
    commit: () => {
      held = false;
      drain();
    },
  };
}

export type RequestEdge = Awaited<ReturnType<typeof startRequestEdge>>;
