// The live registry: provider sessions (by session and by provider id) and in-flight attempts
// (by request id + attempt number), so frames reach the request actor that owns them.
import type { ActorRefFrom } from "xstate";
import type { ProviderSessionMachine } from "../../actors/providerSession.ts";
import { freeSlots } from "../../actors/providerSession.ts";
import type { RequestLogic } from "../../actors/request.ts";
import type { ChunkFrame } from "../wire/frames.ts";
import type { ChunkMeter } from "./chunkMeter.ts";
import type { ProviderView } from "./routing.ts";

export interface SessionHandle {
  sessionId: string;
  actor: ActorRefFrom<ProviderSessionMachine>;
  send(frame: Uint8Array): void;
  close(code: number, reason: string): void;
  /** Keys of attempts in flight on this session. */
  attempts: Set<string>;
  /** Models this session measured with a hash other than the catalog's: not routed here until a later heartbeat advertises them (docs/protocol.md). */
  refusedModels: Set<string>;
}

/**
 * A provider session held by another node of the cluster (docs/scale-out.md): the job, cancel and
 * settled frames go there over the cluster transport, and its frames come back the same way.
 */
export interface RemoteSession {
  remote: true;
  sessionId: string;
  nodeId: string;
  providerId: string;
  /** The receipt key its session authenticated with. */
  publicKey: Uint8Array;
  /** Keys of this node's attempts in flight on it. */
  attempts: Set<string>;
  /** Sends a frame to the session; a job names its attempt (`jobKey`), so that its frames come back. */
  send(frame: Uint8Array, jobKey?: string): void;
  /** This node let attempt `key` go: the slot it held there frees. */
  release(key: string): void;
}

/** An attempt another node owns, running on one of this node's sessions: its frames go back there. */
export interface ForwardedAttempt {
  key: string;
  ownerNode: string;
  session: SessionHandle;
  /** The owner let it go (or it ended): its slot is free, but its `end` and receipt still go back. */
  released: boolean;
  at: number;
}

export const isRemote = (session: SessionHandle | RemoteSession): session is RemoteSession => "remote" in session;

export interface AttemptHandle {
  key: string;
  requestId: string;
  attemptN: number;
  /** The model the job asked for. */
  model: string;
  request: ActorRefFrom<RequestLogic>;
  session: SessionHandle | RemoteSession;
  /** The attempt's delivered counts (seq, tokens, bytes), kept at the edge of the request actor. */
  meter: ChunkMeter;
  /** Takes one of the attempt's `chunk` frames (only the first one becomes an actor event). */
  chunk(frame: ChunkFrame): void;
}

export const attemptKey = (requestId: string, attemptN: number): string => `${requestId}#${attemptN}`;

export class Registry {
  readonly sessions = new Map<string, SessionHandle>();
  readonly admittedByProvider = new Map<string, SessionHandle>();
  readonly attempts = new Map<string, AttemptHandle>();
  /** Other nodes' attempts on this node's sessions, by attempt key (a cluster node only). */
  readonly forwarded = new Map<string, ForwardedAttempt>();
  /** Other nodes' sessions as this node routes to them, by session id (a cluster node only). */
  readonly remoteSessions = new Map<string, RemoteSession>();
  /** Told when a local session's slots change (the cluster shares them with the other nodes). */
  sessionChanged: ((sessionId: string) => void) | null = null;
  /** Frames about jobs a session does not hold: ignored, and counted (docs/protocol.md). */
  ignoredFrames = 0;
  /** Called when a slot may have freed or a provider became routable (the admission queue listens). */
  capacityChanged: () => void = () => {};
  /** Attempts per session that have not delivered a first chunk (routing's saturation rule). */
  private readonly awaiting = new WeakMap<SessionHandle | RemoteSession, number>();
  /** Keys of attempts whose first chunk arrived. */
  private readonly started = new Set<string>();
  /** Receipt frames counted and not stored, by why (src/gateway/settlements.ts receiptArrived). */
  readonly ignoredReceipts = { duplicate: 0, after_final: 0, unknown_attempt: 0 };
  /** Sessions whose attempts changed this event-loop turn; their actors hear the count at its end. */
  private readonly uncounted = new Set<SessionHandle>();

  constructor(private readonly endOfTurn: (run: () => void) => void = (run) => void setImmediate(run)) {}

  /** Routing views of admitted sessions. */
  *providerViews(): Generator<ProviderView> {
    for (const session of this.admittedByProvider.values()) {
      const snapshot = session.actor.getSnapshot();
      const c = snapshot.context;
      if (!c.hello || !c.tier || snapshot.status !== "active") continue;
      const sub = admittedSubState(snapshot);
      if (!sub) continue;
      // The live count, not the actor's (which hears it at the end of the turn): a slot taken or freed
      // earlier in this turn counts for the next request routed in it.
      const inFlight = session.attempts.size;
      const free = freeSlots(c, inFlight);
      yield {
        sessionId: session.sessionId,
        providerId: c.hello.provider_id,
        tier: c.tier,
        state: sub === "ready" || sub === "busy" ? (free > 0 ? "ready" : "busy") : sub,
        warmModels: c.models.map((m) => m.model_id),
        freeSlots: free,
        inFlight,
        awaitingFirstByte: this.awaiting.get(session) ?? 0,
        maxConcurrency: c.hello.max_concurrency,
        load: c.reportedLoad
          ? {
              queuedJobs: c.reportedLoad.queued_jobs,
              decodeTokensPerS: c.reportedLoad.decode_tokens_per_s,
              outstandingOutputTokens: c.reportedLoad.outstanding_output_tokens,
            }
          : null,
      };
    }
  }

  provisionalSessionCount(): number {
    let n = 0;
    for (const s of this.admittedByProvider.values()) if (s.actor.getSnapshot().context.tier === "provisional") n++;
    return n;
  }

  addAttempt(handle: AttemptHandle): void {
    this.attempts.set(handle.key, handle);
    handle.session.attempts.add(handle.key);
    this.awaiting.set(handle.session, (this.awaiting.get(handle.session) ?? 0) + 1);
    if (!isRemote(handle.session)) this.countLater(handle.session);
  }

  /** The attempt's first chunk arrived: it no longer waits for a first token. */
  firstChunk(key: string): void {
    const handle = this.attempts.get(key);
    if (!handle || this.started.has(key)) return;
    this.started.add(key);
    this.awaiting.set(handle.session, Math.max(0, (this.awaiting.get(handle.session) ?? 0) - 1));
  }

  /** Forgets an attempt and frees its slot; a no-op when already released. */
  releaseAttempt(key: string): void {
    const handle = this.attempts.get(key);
    if (!handle) return;
    this.attempts.delete(key);
    handle.session.attempts.delete(key);
    if (!this.started.delete(key)) this.awaiting.set(handle.session, Math.max(0, (this.awaiting.get(handle.session) ?? 0) - 1));
    if (isRemote(handle.session)) handle.session.release(key);
    else this.countLater(handle.session);
    this.capacityChanged();
  }

  /** Another node's attempt starts on a local session: it takes a slot there. */
  addForwarded(attempt: ForwardedAttempt): void {
    this.forwarded.set(attempt.key, attempt);
    attempt.session.attempts.add(attempt.key);
    this.countLater(attempt.session);
  }

  /** Frees a forwarded attempt's slot; its entry stays so that its late frames still find the owner. */
  releaseForwarded(key: string, forget = false): void {
    const attempt = this.forwarded.get(key);
    if (!attempt) return;
    if (forget) this.forwarded.delete(key);
    if (attempt.released) return;
    attempt.released = true;
    attempt.session.attempts.delete(key);
    this.countLater(attempt.session);
    this.capacityChanged();
  }

  /**
   * The session actor learns its in-flight count at the end of an event-loop turn in which it changed,
   * and only when the count moves it between `ready` and `busy` — all the count decides there (routing
   * reads the live count); an event per attempt, or per turn, cost the main thread more than it
   * told the machine (docs/benchmarks.md, Measurements behind the code).
   */
  private countLater(session: SessionHandle): void {
    if (this.uncounted.size === 0) {
      this.endOfTurn(() => {
        const sessions = [...this.uncounted];
        this.uncounted.clear();
        for (const s of sessions) {
          const inFlight = s.attempts.size;
          if (movesSubState(s.actor.getSnapshot(), inFlight)) s.actor.send({ type: "attempts.counted", inFlight });
          this.sessionChanged?.(s.sessionId);
        }
      });
    }
    this.uncounted.add(session);
  }
}

type SessionSnapshot = ReturnType<SessionHandle["actor"]["getSnapshot"]>;

/** An admitted session's sub-state (`ready`, `busy`, `asleep`, `draining`), or undefined. */
function admittedSubState(snapshot: SessionSnapshot): ProviderView["state"] | undefined {
  const value = snapshot.value;
  return typeof value === "object" && "admitted" in value ? (value.admitted as ProviderView["state"]) : undefined;
}

/** Whether an active session in `ready` or `busy` would be in the other one with `inFlight` attempts. */
function movesSubState(snapshot: SessionSnapshot, inFlight: number): boolean {
  if (snapshot.status !== "active") return false;
  const sub = admittedSubState(snapshot);
  if (sub !== "ready" && sub !== "busy") return false;
  return (freeSlots(snapshot.context, inFlight) === 0) !== (sub === "busy");
}
