// The provider WebSocket endpoint (/v1/provider/connect): decodes frames, feeds the session actor the
// handshake and heartbeats, and hands job frames straight to the request that owns the attempt (chunks
// to its edge, which passes the actor only what changes its state).
import type { ServerWebSocket, WebSocketHandler } from "bun";
import { createActor, fromPromise, type ActorOptions, type AnyActorLogic, type InspectionEvent, type Observer } from "xstate";
import { providerSessionMachine, type AdmissionInput, type AdmissionVerdict } from "../../actors/providerSession.ts";
import { decodeProviderFrameGeneral, encodeFrame } from "../wire/codec.ts";
import { decodeChunkFrame } from "../wire/chunkFrame.ts";
import { CloseCode, MAX_FRAME_BYTES, type ChunkFrame, type ProviderFrame } from "../wire/frames.ts";
import { attemptKey, type Registry, type RemoteSession, type SessionHandle } from "./registry.ts";
import type { Log } from "../log.ts";
import type { Settlements } from "./settlements.ts";

export interface SocketData {
  session?: SessionHandle;
}

export interface ProviderEndpointDeps {
  registry: Registry;
  admit: (input: AdmissionInput) => Promise<AdmissionVerdict>;
  newSessionId: () => string;
  randomBytes: (n: number) => Uint8Array;
  heartbeatIntervalMs: number;
  handshakeTimeoutMs: number;
  catalogId: () => string;
  onAdmitted: (session: SessionHandle) => void;
  onClosed: (session: SessionHandle, wasAdmitted: boolean) => void;
  inspect?: Observer<InspectionEvent> | ((event: InspectionEvent) => void);
  log: Log;
  /** Measurements, `end` frames and receipts feed settlement. */
  settlements: Pick<Settlements, "accepted" | "endReceived" | "receiptArrived">;
  /** A cluster node's side (src/gateway/clusterBridge.ts): frames of attempts other nodes own. */
  cluster?: EndpointCluster;
  /** Wall clock (ms) for the receipt budget. */
  now: () => number;
  /** Receipt frames that settle nothing a session may send: per second on average, and at once. */
  receiptFrames: { perSecond: number; burst: number };
  /** Largest content and tool-call bytes a chunk may carry per token it claims (0 tokens count as 1). */
  maxChunkBytesPerToken: number;
  /** The clock of the session actors' timers (the simulation's, test/sim/); default the real one. */
  clock?: ActorOptions<AnyActorLogic>["clock"];
  /** Whether this process stood still within the last `withinMs` (src/gateway/stallWatch.ts); default never. */
  stoodStill?: (withinMs: number) => boolean;
}

/** What the endpoint asks of the cluster for frames that are not about this node's own attempts. */
export interface EndpointCluster {
  /** Checks this node's own lease before a provider frame is acted on: a stalled node fences itself first (docs/scale-out.md, "Fencing"). */
  noticeStall(): void;
  /** A frame about another node's attempt on this session: true when it was taken (forwarded or adopted). */
  forwardedFrame(session: SessionHandle, providerId: string, frame: ProviderFrame, raw: Uint8Array): boolean;
  /** A receipt for an attempt this node does not have open: true when the cluster takes it. */
  receipt(providerId: string, frame: Extract<ProviderFrame, { type: "receipt" }>, raw: Uint8Array): boolean;
  /** The session closed: the other nodes' attempts on it are lost. */
  sessionLost(session: SessionHandle): void;
  /** The session was admitted, changed (heartbeat) or closed: the other nodes hear of it. */
  sessionChanged(session: SessionHandle, gone: boolean): void;
}

/** The deps a job frame needs, wherever it came from (this node's socket or another node's). */
export type AttemptFrameDeps = Pick<ProviderEndpointDeps, "registry" | "settlements">;

/**
 * A job frame (`accepted`, `chunk`, `declined`, `end`) of a provider id, for an attempt of this
 * node, arriving on `session` (a local socket, or another node's session through the cluster).
 */
export function attemptFrame(deps: AttemptFrameDeps, providerId: string, session: SessionHandle | RemoteSession, frame: Exclude<ProviderFrame, { type: "hello" | "auth" | "heartbeat" | "receipt" }>): void {
  const { registry } = deps;
  // An `end` may come after the gateway let the attempt go (e.g. answering our cancel): it still
  // carries the receipt that settles the attempt.
  const settling = frame.type === "end" && deps.settlements.endReceived(providerId, frame) === true;
  const attempt = registry.attempts.get(attemptKey(frame.request_id, frame.attempt_n));
  if (!attempt || attempt.session !== session) {
    if (!settling) registry.ignoredFrames++;
    return;
  }
  switch (frame.type) {
    case "chunk":
      return attempt.chunk(frame);
    case "accepted":
      if (!deps.settlements.accepted(frame.request_id, frame.attempt_n, frame.model_hash)) {
        if (!("remote" in attempt.session)) attempt.session.refusedModels.add(attempt.model);
        return attempt.request.send({ type: "provider.rejected" });
      }
      // A measurement the catalog agrees with changes nothing in the request's state: the
      // actor is not told (an event per request it would only discard).
      return;
    case "declined":
      return attempt.request.send({ type: "provider.declined", code: frame.code });
    case "end":
      return attempt.request.send({ type: "provider.ended", frame });
  }
}

/** A token bucket: `burst` at once, refilled at `perSecond`. */
export class TokenBucket {
  private tokens: number;
  private at: number | null = null;

  constructor(private readonly perSecond: number, private readonly burst: number) {
    this.tokens = burst;
  }

  /** Takes one token; false when none is left. */
  take(nowMs: number): boolean {
    if (this.at !== null) this.tokens = Math.min(this.burst, this.tokens + ((nowMs - this.at) * this.perSecond) / 1000);
    this.at = nowMs;
    if (this.tokens < 1) return false;
    this.tokens -= 1;
    return true;
  }
}

/** Content and tool-call bytes of a chunk, or more than `bound` as soon as that is sure (cheap per token). */
export function chunkBytesExceed(frame: ChunkFrame, bound: number): boolean {
  const calls = frame.tool_calls;
  let units = frame.content?.length ?? 0;
  // No `?? []` for the absent list: this runs per token, and that is an array a chunk.
  if (calls !== undefined) for (const call of calls) units += (call.id?.length ?? 0) + (call.name?.length ?? 0) + (call.arguments?.length ?? 0);
  // A UTF-16 unit is at most 3 UTF-8 bytes and at least 1: most chunks are decided without encoding.
  if (units * 3 <= bound) return false;
  if (units > bound) return true;
  let bytes = frame.content === undefined ? 0 : Buffer.byteLength(frame.content, "utf8");
  if (calls !== undefined) {
    for (const call of calls) {
      bytes += Buffer.byteLength(call.id ?? "", "utf8") + Buffer.byteLength(call.name ?? "", "utf8") + Buffer.byteLength(call.arguments ?? "", "utf8");
    }
  }
  return bytes > bound;
}

/** Builds the Bun WebSocket handler for provider connections. */
export function providerWebSocketHandler(deps: ProviderEndpointDeps): WebSocketHandler<SocketData> {
  const { registry, log } = deps;

  const machine = providerSessionMachine.provide({
    actors: {
      admitProvider: fromPromise<AdmissionVerdict, AdmissionInput>(async ({ input }) => deps.admit(input)),
    },
    delays: { handshakeTimeout: deps.handshakeTimeoutMs },
  });

  function openSession(ws: ServerWebSocket<SocketData>): SessionHandle {
    const sessionId = deps.newSessionId();
    const nonce = deps.randomBytes(32);
    let wasAdmitted = false;
    const session: SessionHandle = {
      sessionId,
      attempts: new Set(),
      refusedModels: new Set(),
      send: (frame) => void ws.send(frame, false),
      close: (code, reason) => ws.close(code, reason),
      actor: undefined as unknown as SessionHandle["actor"],
    };
    session.actor = createActor(
      machine.provide({
        actions: {
          sendChallenge: () => session.send(encodeFrame({ type: "challenge", session_id: sessionId, nonce })),
          sendWelcome: ({ context }) =>
            session.send(
              encodeFrame({
                type: "welcome",
                session_id: sessionId,
                tier: context.tier!,
                heartbeat_interval_ms: deps.heartbeatIntervalMs,
                catalog_id: deps.catalogId(),
              }),
            ),
          sendDrain: () => session.send(encodeFrame({ type: "drain" })),
          closeSocket: (_, params) => session.close(params.code, params.reason),
          registerAdmitted: ({ context }) => {
            const providerId = context.hello!.provider_id;
            const previous = registry.admittedByProvider.get(providerId);
            registry.admittedByProvider.set(providerId, session);
            wasAdmitted = true;
            // The same id and key connecting again replaces the old socket (e.g. after a half-open link).
            if (previous && previous !== session) previous.actor.send({ type: "gateway.replaced" });
            log.info("provider_admitted", { session_id: sessionId, provider_id: providerId, tier: context.tier });
            deps.onAdmitted(session);
            registry.capacityChanged();
            deps.cluster?.sessionChanged(session, false);
          },
          unregister: ({ context }) => {
            registry.sessions.delete(sessionId);
            const providerId = context.hello?.provider_id;
            if (providerId && registry.admittedByProvider.get(providerId) === session) registry.admittedByProvider.delete(providerId);
            loseAttempts(session);
            if (wasAdmitted) {
              deps.cluster?.sessionLost(session);
              deps.cluster?.sessionChanged(session, true);
            }
            if (context.closeCode !== null) {
              log.info("provider_session_closed", { session_id: sessionId, provider_id: providerId ?? null, code: context.closeCode, reason: context.closeReason });
            }
            deps.onClosed(session, wasAdmitted);
          },
        },
        guards: { gatewayStoodStill: ({ context }) => deps.stoodStill?.(3 * context.heartbeatIntervalMs) ?? false },
        delays: { heartbeatTimeout: ({ context }) => 3 * context.heartbeatIntervalMs },
      }),
      { input: { sessionId, nonce, heartbeatIntervalMs: deps.heartbeatIntervalMs }, inspect: deps.inspect, ...(deps.clock ? { clock: deps.clock } : {}) },
    );
    registry.sessions.set(sessionId, session);
    session.actor.start();
    return session;
  }

  /** Every attempt in flight on a lost session fails as a lost socket. */
  function loseAttempts(session: SessionHandle): void {
    for (const key of [...session.attempts]) {
      const attempt = registry.attempts.get(key);
      registry.releaseAttempt(key);
      attempt?.request.send({ type: "provider.lost" });
    }
  }

  const receiptBudgets = new WeakMap<SessionHandle, TokenBucket>();
  const receiptBudget = (session: SessionHandle): TokenBucket => {
    let bucket = receiptBudgets.get(session);
    if (!bucket) receiptBudgets.set(session, (bucket = new TokenBucket(deps.receiptFrames.perSecond, deps.receiptFrames.burst)));
    return bucket;
  };

  function onFrame(session: SessionHandle, frame: ProviderFrame, raw: Uint8Array): void {
    if (frame.type === "chunk") {
      // A chunk may carry at most maxChunkBytesPerToken per token it claims: what a buyer is sent (and
      // a non-streaming response buffers) stays bounded by max_tokens. A bigger one is a protocol violation.
      if (chunkBytesExceed(frame, Math.max(1, frame.tokens) * deps.maxChunkBytesPerToken)) {
        log.warn("provider_chunk_too_large", { session_id: session.sessionId, request_id: frame.request_id, tokens: frame.tokens });
        session.close(CloseCode.policyViolation, "chunk_too_large");
        return;
      }
      // The per-token path: an attempt lives on a session only while that session is admitted (routing
      // picks admitted sessions; losing the session releases its attempts), so a chunk for one of this
      // session's attempts needs no session-state check. Anything else takes the full path below.
      const attempt = registry.attempts.get(attemptKey(frame.request_id, frame.attempt_n));
      if (attempt && attempt.session === session) return attempt.chunk(frame);
    }
    // Another node's attempt on this session: its frames go back to the node that owns it.
    if (deps.cluster && registry.forwarded.size > 0 && frame.type !== "hello" && frame.type !== "auth" && frame.type !== "heartbeat") {
      const providerId = session.actor.getSnapshot().context.hello?.provider_id;
      if (providerId && deps.cluster.forwardedFrame(session, providerId, frame, raw)) return;
    }
    const snapshot = session.actor.getSnapshot();
    const admitted = snapshot.matches("admitted");
    switch (frame.type) {
      case "hello":
        if (!snapshot.matches({ handshaking: "awaitingHello" })) break;
        return session.actor.send({ type: "provider.hello", frame });
      case "auth":
        if (!snapshot.matches({ handshaking: "awaitingAuth" })) break;
        return session.actor.send({ type: "provider.auth", signature: frame.signature });
      case "heartbeat":
        if (!admitted) break;
        // A heartbeat after a refused measurement that advertises the model again makes it routable
        // again (docs/decisions.md): the owner may have fixed the weights without reconnecting.
        if (session.refusedModels.size > 0) for (const m of frame.models) session.refusedModels.delete(m.model_id);
        session.actor.send({
          type: "provider.heartbeat",
          state: frame.state,
          slotsFree: frame.slots_free,
          models: frame.models,
          inFlight: session.attempts.size,
          load: frame.load,
        });
        // A report may free capacity (ready again, more slots): requests waiting for a slot get routed.
        registry.capacityChanged();
        deps.cluster?.sessionChanged(session, false);
        return;
      case "receipt": {
        if (!admitted) break;
        // Accepted for any still-pending attempt of this provider id, from any of its sessions — or,
        // in a cluster, of any node (the cluster finds the attempt's owner, or adopts it).
        const providerId = snapshot.context.hello!.provider_id;
        if (deps.cluster?.receipt(providerId, frame, raw)) return;
        const arrival = deps.settlements.receiptArrived(providerId, frame.request_id, frame.attempt_n, frame.receipt);
        if (arrival === "stored") return;
        // Receipts that settle nothing cost a lookup each: a session sending more than its budget of
        // them is flooding (an honest runtime paces its re-sent outbox below the default rate).
        if (!receiptBudget(session).take(deps.now())) {
          log.warn("provider_receipt_flood", { session_id: session.sessionId, provider_id: providerId });
          session.close(CloseCode.policyViolation, "receipt_rate_exceeded");
        }
        return;
      }
      default: {
        if (!admitted) break;
        return attemptFrame(deps, snapshot.context.hello!.provider_id, session, frame);
      }
    }
    session.actor.send({ type: "provider.outOfTurn", frameType: frame.type });
  }

  function handleFrame(ws: ServerWebSocket<SocketData>, session: SessionHandle, frame: ProviderFrame, raw: Uint8Array): void {
    try {
      onFrame(session, frame, raw);
    } catch (e) {
      // A bug in handling one frame closes that socket, never the process.
      log.error("provider_frame_failed", { session_id: session.sessionId, error: String(e) });
      ws.close(1011, "internal_error");
    }
  }

  return {
    maxPayloadLength: MAX_FRAME_BYTES,
    // Heartbeats are the protocol's liveness check; Bun's idle timeout would only duplicate it.
    idleTimeout: 0,
    sendPings: true,
    open(ws) {
      ws.data.session = openSession(ws);
    },
    message(ws, data) {
      const session = ws.data.session;
      if (!session) return;
      deps.cluster?.noticeStall();
      // The per-token path first, without the general decoder's result object (what it would return).
      const chunk = typeof data === "string" ? undefined : decodeChunkFrame(data as Uint8Array);
      if (chunk !== undefined) return handleFrame(ws, session, chunk, data as Uint8Array);
      // Anything it leaves alone: the general decoder and schema checks decide (src/wire/chunkFrame.ts).
      const decoded = decodeProviderFrameGeneral(typeof data === "string" ? data : (data as Uint8Array));
      if (!decoded.ok) {
        // A malformed hello has its own code (4001 invalid_hello); other schema failures are 1008.
        const code = decoded.frameType === "hello" ? CloseCode.invalidHello : decoded.closeCode;
        log.warn("provider_frame_rejected", { session_id: session.sessionId, reason: decoded.reason, code });
        ws.close(code, decoded.reason);
        return;
      }
      handleFrame(ws, session, decoded.frame, typeof data === "string" ? Buffer.from(data) : (data as Uint8Array));
    },
    close(ws, code) {
      ws.data.session?.actor.send({ type: "socket.closed", code });
    },
  };
}

