// What the request edge keeps per live buyer request, beside its actor.
import type { ActorRefFrom } from "xstate";
import type { RequestLogic } from "../../actors/request.ts";
import type { ChatResponder, NormalizedChat } from "../chat/contract.ts";
import type { Payer } from "../ledger/charges.ts";
import type { AdmittedPricing } from "./settlement/pricing.ts";
import type { ChunkFrame, EndFrame } from "../wire/frames.ts";
import type { ChunkMeter } from "./chunkMeter.ts";
import type { OutputGate } from "./outputSent.ts";
import type { RequestTiming } from "./requestReport.ts";

export interface RequestSpec {
  requestId: string;
  chat: NormalizedChat;
  promptBound: number;
  responder: ChatResponder;
  /** The buyer's account (logged; never a key). */
  accountId?: string;
  /** When the HTTP request arrived, on the runner's `monotonicNow` clock; default: when `start` runs. */
  arrivedAt?: number;
  /** The buyer route, for metrics labels; default /v1/chat/completions. */
  buyerRoute?: string;
  /** Who pays the request's attempts (the reservation was taken at admission). */
  payer?: Payer;
  /** The price the reservation was taken at; every attempt is charged at it (absent: the price at dispatch). */
  pricing?: AdmittedPricing;
  /** A tagged conversation (sticky routing on): its key, and the provider it is pinned to, if any. */
  sticky?: { key: string; providerId: string | null };
}

/** An attempt as the edge knows it. */
export interface LiveAttempt {
  key: string;
  attemptN: number;
  providerId: string;
  sessionId: string;
  /** When its job left (monotonic clock). */
  at: number;
  firstByte: boolean;
  meter: ChunkMeter;
}

export interface RequestHandle extends RequestSpec {
  actor: ActorRefFrom<RequestLogic>;
  startedAtMs: number;
  lastEnd: EndFrame | null;
  timing: RequestTiming;
  /** The current (or last) attempt's chunk count: replaced at each dispatch. */
  meter: ChunkMeter;
  /** Adds a relayed chunk to the current attempt's delivered prefix (settlement); replaced at each dispatch. */
  toPrefix: (frame: ChunkFrame) => void;
  /** The dispatch of the current `routing` visit; `stopped` once the actor left `routing`. */
  dispatch: { stopped: boolean };
  /** The attempt the buyer waits on: its provider and when its job left (routing learns from how it ends). */
  sent: LiveAttempt | null;
  /** A hedge of `sent` in flight that has not won yet (docs/routing.md, Hedging). */
  hedge: LiveAttempt | null;
  hedgeTimer: unknown;
  /** Cancels the hedge in flight (the first attempt delivered first, or the request ended). */
  hedgeCancel: (() => void) | null;
  /** The provider whose first chunk the buyer got (sticky routing pins the conversation to it). */
  servedBy: string | null;
  /**
   * A stream's output written up to its last attempt's release, leaving the process: that attempt's
   * delivered record and `[DONE]` wait for it (docs/receipts.md, "Crashes").
   */
  outputLeft: OutputGate | null;
}
