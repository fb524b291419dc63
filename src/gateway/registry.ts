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

export interface AttemptHandle {
  key: string;
  requestId: string;
  attemptN: number;
  /** The model the job asked for. */
  model: string;
  request: ActorRefFrom<RequestLogic>;
  session: SessionHandle;
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
  /** Frames about jobs a session does not hold: ignored, and counted (docs/protocol.md). */
  ignoredFrames = 0;
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
    this.countLater(handle.session);
  }

  /** Forgets an attempt and frees its slot; a no-op when already released. */
  releaseAttempt(key: string): void {
    const handle = this.attempts.get(key);
    if (!handle) return;
    this.attempts.delete(key);
    handle.session.attempts.delete(key);
    this.countLater(handle.session);
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
