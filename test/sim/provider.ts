// A simulated provider machine: speaks protocol v1 over the simulated network (real msgpack frames,
// the real Ed25519 handshake) and signs real receipts with the independent test signer
// (test/receipts/independent-signer.ts). Each job follows a plan drawn from the run's seed: honest,
// or with faults — declines, stalls, duplicate, out-of-order or inflated chunks, a disconnect at any
// frame, and receipts that come late, twice, forged or never. Like the real runtime it keeps every
// receipt it sent until a `settled` frame answers it and re-sends them after each reconnect.
import type { KeyObject } from "node:crypto";
import type { WebSocketHandler } from "bun";
import { decodeGatewayFrame, encodeFrame } from "../../src/wire/codec.ts";
import { signHandshake } from "../../src/wire/handshake.ts";
import type { CancelFrame, DeclineCode, GatewayFrame, JobFrame, ProviderFrame, TerminalState } from "../../src/wire/frames.ts";
import { helloFrame, receiptRouteFields } from "../support/scriptedProvider.ts";
import type { SocketData } from "../../src/gateway/providerEndpoint.ts";
import { fieldsOf, keyFromSeed, outputHashOf, promptBoundOf, rawPublic, signFields } from "../receipts/independent-signer.ts";
import type { Rng } from "../support/seededRandom.ts";
import type { SimClock } from "./clock.ts";
import { SimSocket } from "./network.ts";
import type { FaultCounter, Trace } from "./trace.ts";

export interface SimModel {
  model_id: string;
  model_hash: string;
}

interface Chunk {
  content: string;
  tokens: number;
}

type ReceiptFault = "none" | "late" | "twice" | "forged" | "never" | "inflated";

/** What this attempt will do, drawn when its job arrives. */
interface JobPlan {
  kind: "honest" | "decline" | "stall" | "stallMid";
  chunks: Chunk[];
  firstDelayMs: number;
  gapMs: number;
  duplicateAt: number | null;
  swapAt: number | null;
  inflateAt: number | null;
  disconnectAfterFrames: number | null;
  /** `accepted` names a hash other than the catalog's (a refused measurement). */
  wrongHash: boolean;
  receipt: ReceiptFault;
  declineCode: DeclineCode;
  inputTokens: number;
}

interface SimAttempt {
  job: JobFrame;
  plan: JobPlan;
  /** Chunks handed to the socket, in seq order (what a receipt binds). */
  sent: Chunk[];
  framesSent: number;
  cancel: CancelFrame | null;
  ended: boolean;
  nextChunk: number;
}

export interface ProviderStats {
  jobs: number;
  chunksSent: number;
}

const attemptKey = (requestId: string, attemptN: number) => `${requestId}#${attemptN}`;
const utf8 = (s: string) => Buffer.byteLength(s, "utf8");
const LETTERS = "abcdefghijklmnopqrstuvwxyz ";

export interface SimProviderOptions {
  id: string;
  keySeed: Uint8Array;
  model: SimModel;
  maxConcurrency: number;
  /** Probability that a job gets a fault of some kind (0 = always honest). */
  faultRate: number;
}

export class SimProvider {
  readonly key: KeyObject;
  readonly publicKey: Uint8Array;
  private socket: SimSocket | null = null;
  private sessionId: string | null = null;
  private admitted = false;
  private heartbeatMs = 0;
  private heartbeatTimer: { live: boolean } | null = null;
  private readonly attempts = new Map<string, SimAttempt>();
  /** Receipts sent and not yet answered by a final `settled` frame (the runtime's outbox). */
  readonly outbox = new Map<string, string>();
  /** Every final `settled` frame received: the gateway's acknowledgements, which a restart must not lose. */
  readonly acknowledged = new Map<string, { label: string; providerCredits: number }>();
  /** The provider stops reconnecting (end of the run). */
  retired = false;
  readonly stats: ProviderStats = { jobs: 0, chunksSent: 0 };

  constructor(
    private readonly o: SimProviderOptions,
    private readonly clock: SimClock,
    private readonly rng: Rng,
    private readonly trace: Trace,
    private readonly faults: FaultCounter,
    /** The gateway's WebSocket handler now, or null while the gateway is down. */
    private readonly gatewayHandler: () => WebSocketHandler<SocketData> | null,
  ) {
    this.key = keyFromSeed(o.keySeed);
    this.publicKey = rawPublic(this.key);
  }

  get id(): string {
    return this.o.id;
  }

  get connected(): boolean {
    return this.socket !== null && this.socket.isOpen;
  }

  /** Attempts this provider is still working on. */
  get busy(): number {
    let n = 0;
    for (const a of this.attempts.values()) if (!a.ended) n++;
    return n;
  }

  connect(): void {
    if (this.retired || this.connected) return;
    const handler = this.gatewayHandler();
    if (!handler) return this.reconnectLater();
    this.sessionId = null;
    this.admitted = false;
    this.socket = new SimSocket(this.clock, this.rng, handler, {
      onFrame: (bytes) => this.onFrame(bytes),
      onClosed: (code, reason) => this.onClosed(code, reason),
    });
    this.socket.connect();
    this.trace.add(`${this.id} dials`);
    // The provider speaks first (docs/protocol.md): hello, then auth once the challenge came.
    const models = [{ model_id: this.o.model.model_id, model_hash: this.o.model.model_hash, max_context_tokens: 8192 }];
    this.send(helloFrame({ id: this.id, publicKey: this.publicKey, runtime: "sim", ramGb: 64, maxConcurrency: this.o.maxConcurrency, models }));
  }

  private reconnectLater(): void {
    if (this.retired) return;
    this.clock.at(200 + this.rng.int(1800), () => this.connect());
  }

  /** The gateway process died: the connection resets (the provider hears it after the latency). */
  gatewayDied(): void {
    this.socket?.reset();
  }

  /** The end of the run: leaves and never reconnects. */
  retire(): void {
    this.retired = true;
    this.disconnect("end of run");
  }

  /** Drops the connection now (the disconnect fault, or the end of the run). */
  disconnect(why: string): void {
    if (!this.socket?.isOpen) return;
    this.trace.add(`${this.id} drops its connection (${why})`);
    this.socket.drop();
    this.lost();
    this.reconnectLater();
  }

  /** Everything in flight dies with the connection; receipts stay in the outbox. */
  private lost(): void {
    this.admitted = false;
    if (this.heartbeatTimer) this.heartbeatTimer.live = false;
    this.heartbeatTimer = null;
    for (const a of this.attempts.values()) a.ended = true;
    this.attempts.clear();
  }

  private onClosed(code: number, reason: string): void {
    this.trace.add(`${this.id} sees its connection close ${code} ${reason}`);
    this.lost();
    this.reconnectLater();
  }

  private send(frame: ProviderFrame): void {
    this.socket?.send(encodeFrame(frame));
  }

  private onFrame(bytes: Uint8Array): void {
    const decoded = decodeGatewayFrame(bytes);
    if (!decoded.ok) throw new Error(`${this.id}: the gateway sent a frame that does not decode: ${decoded.reason}`);
    const frame = decoded.frame as GatewayFrame;
    if (process.env.SIM_DEBUG) this.trace.add(`${this.id} <- ${frame.type}`);
    switch (frame.type) {
      case "challenge":
        this.sessionId = frame.session_id;
        this.send({ type: "auth", signature: signHandshake(this.key, frame.session_id, this.id, frame.nonce) });
        return;
      case "welcome":
        this.admitted = true;
        this.heartbeatMs = frame.heartbeat_interval_ms;
        this.trace.add(`${this.id} admitted (${frame.session_id})`);
        this.heartbeat();
        // Like the runtime's outbox: every unanswered receipt again on the new session.
        for (const [key, envelope] of this.outbox) {
          const [requestId, n] = key.split("#");
          this.send({ type: "receipt", request_id: requestId!, attempt_n: Number(n), receipt: envelope });
        }
        return;
      case "job":
        return this.onJob(frame);
      case "cancel":
        return this.onCancel(frame);
      case "settled":
        if (frame.label === "pending") return;
        this.outbox.delete(attemptKey(frame.request_id, frame.attempt_n));
        this.acknowledged.set(attemptKey(frame.request_id, frame.attempt_n), { label: frame.label, providerCredits: frame.provider_credits });
        this.trace.add(`${this.id} settled ${attemptKey(frame.request_id, frame.attempt_n)} ${frame.label}${frame.reason ? ` (${frame.reason})` : ""}, ${frame.provider_credits} credits`);
        return;
      case "drain":
        return;
    }
  }

  private heartbeat(): void {
    if (!this.admitted || !this.connected) return;
    this.send({
      type: "heartbeat",
      state: "ready",
      slots_free: Math.max(0, this.o.maxConcurrency - this.busy),
      models: [{ model_id: this.o.model.model_id, model_hash: this.o.model.model_hash, max_context_tokens: 8192 }],
    } as ProviderFrame);
    const timer = { live: true };
    this.heartbeatTimer = timer;
    this.clock.at(this.heartbeatMs, () => {
      if (timer.live) this.heartbeat();
    });
  }

  private plan(): JobPlan {
    const r = this.rng;
    const n = 1 + r.int(6);
    const chunks: Chunk[] = [];
    for (let i = 0; i < n; i++) {
      const tokens = 1 + r.int(3);
      let content = "";
      for (let j = 0, len = tokens + r.int(6); j < len; j++) content += LETTERS[r.int(LETTERS.length)];
      chunks.push({ content, tokens });
    }
    const plan: JobPlan = {
      kind: "honest",
      chunks,
      firstDelayMs: 5 + r.int(300),
      gapMs: 1 + r.int(60),
      duplicateAt: null,
      swapAt: null,
      inflateAt: null,
      disconnectAfterFrames: null,
      wrongHash: false,
      receipt: "none",
      declineCode: "queue_full",
      inputTokens: 3 + r.int(20),
    };
    if (r.next() >= this.o.faultRate) return plan;
    // One fault kind per faulty job, so each one's effect is readable in the trace.
    const fault = r.pick(["decline", "stall", "stallMid", "duplicate", "swap", "inflate", "disconnect", "late", "twice", "forged", "never", "inflatedReceipt", "wrongHash"] as const);
    this.faults.count(`provider_${fault}`);
    switch (fault) {
      case "decline":
        plan.kind = "decline";
        plan.declineCode = r.pick(["queue_full", "model_not_loaded", "context_exceeded", "internal"] as const);
        break;
      case "stall":
      case "stallMid":
        plan.kind = fault;
        break;
      case "duplicate":
        plan.duplicateAt = r.int(n);
        break;
      case "swap":
        plan.swapAt = n > 1 ? r.int(n - 1) : null;
        break;
      case "inflate":
        plan.inflateAt = r.int(n);
        break;
      case "disconnect":
        // Any frame: before `accepted` (0) … after `end` (n + 2).
        plan.disconnectAfterFrames = r.int(n + 3);
        break;
      case "wrongHash":
        plan.wrongHash = true;
        break;
      case "inflatedReceipt":
        plan.receipt = "inflated";
        break;
      default:
        plan.receipt = fault;
    }
    return plan;
  }

  private onJob(job: JobFrame): void {
    this.stats.jobs++;
    const key = attemptKey(job.request_id, job.attempt_n);
    const plan = this.plan();
    const attempt: SimAttempt = { job, plan, sent: [], framesSent: 0, cancel: null, ended: false, nextChunk: 0 };
    this.attempts.set(key, attempt);
    this.trace.add(`${this.id} job ${key} plan ${plan.kind}${plan.receipt !== "none" ? ` receipt:${plan.receipt}` : ""}${plan.duplicateAt !== null ? " dup" : ""}${plan.swapAt !== null ? " swap" : ""}${plan.inflateAt !== null ? " inflate" : ""}${plan.disconnectAfterFrames !== null ? ` drop@${plan.disconnectAfterFrames}` : ""}${plan.wrongHash ? " wrong-hash" : ""} chunks=${plan.chunks.length}`);
    const socket = this.socket;
    this.clock.at(plan.firstDelayMs / 4, () => {
      if (this.socket !== socket || attempt.ended) return;
      if (plan.kind === "decline") {
        attempt.ended = true;
        this.attempts.delete(key);
        this.send({ type: "declined", request_id: job.request_id, attempt_n: job.attempt_n, code: plan.declineCode });
        return;
      }
      const hash = plan.wrongHash ? "f".repeat(64) : this.o.model.model_hash;
      if (!this.jobFrame(attempt, { type: "accepted", request_id: job.request_id, attempt_n: job.attempt_n, model_hash: hash })) return;
      if (plan.kind === "stall") return;
      this.clock.at(plan.firstDelayMs, () => this.nextChunk(attempt, socket));
    });
  }

  /** Sends one of the attempt's frames, dropping the connection first when the plan says so. */
  private jobFrame(attempt: SimAttempt, frame: ProviderFrame): boolean {
    if (attempt.plan.disconnectAfterFrames !== null && attempt.framesSent >= attempt.plan.disconnectAfterFrames) {
      this.disconnect(`fault after ${attempt.framesSent} frames of ${attemptKey(attempt.job.request_id, attempt.job.attempt_n)}`);
      return false;
    }
    attempt.framesSent++;
    this.send(frame);
    return true;
  }

  private nextChunk(attempt: SimAttempt, socket: SimSocket | null): void {
    if (this.socket !== socket || attempt.ended || attempt.cancel) return;
    const { plan, job } = attempt;
    const i = attempt.nextChunk;
    if (plan.kind === "stallMid" && i === Math.ceil(plan.chunks.length / 2)) return;
    if (i >= plan.chunks.length) return this.end(attempt, "normal_done");
    let order = [i];
    if (plan.swapAt === i && i + 1 < plan.chunks.length) order = [i + 1, i];
    for (const k of order) {
      const chunk = plan.chunks[k]!;
      const tokens = plan.inflateAt === k ? utf8(chunk.content) * 4 + 8 : chunk.tokens;
      const frame: ProviderFrame = { type: "chunk", request_id: job.request_id, attempt_n: job.attempt_n, seq: k, content: chunk.content, tokens };
      if (!this.jobFrame(attempt, frame)) return;
      attempt.sent.push(chunk);
      this.stats.chunksSent++;
      if (plan.duplicateAt === k) this.jobFrame(attempt, frame);
    }
    attempt.nextChunk = i + order.length;
    this.clock.at(plan.gapMs, () => this.nextChunk(attempt, socket));
  }

  private onCancel(frame: CancelFrame): void {
    const key = attemptKey(frame.request_id, frame.attempt_n);
    const attempt = this.attempts.get(key);
    if (!attempt) return;
    if (attempt.ended) {
      // A cancel that crossed our `end`: the receipt binding the prefix the buyer received replaces ours.
      if (attempt.cancel) return;
      attempt.cancel = frame;
      const receipt = this.receipt(attempt, frame.reason, frame.delivered_output_bytes);
      this.outbox.set(key, receipt);
      this.send({ type: "receipt", request_id: frame.request_id, attempt_n: frame.attempt_n, receipt });
      return;
    }
    attempt.cancel = frame;
    this.end(attempt, frame.reason, frame.delivered_output_bytes);
  }

  private end(attempt: SimAttempt, terminal: TerminalState, boundBytes: number | null = null): void {
    if (attempt.ended) return;
    attempt.ended = true;
    const { job, plan } = attempt;
    const key = attemptKey(job.request_id, job.attempt_n);
    const finish = terminal === "normal_done" ? "stop" : null;
    const receipt = this.receipt(attempt, terminal, boundBytes);
    const inline = plan.receipt === "none" || plan.receipt === "twice" || plan.receipt === "forged" || plan.receipt === "inflated";
    const outputTokens = attempt.sent.reduce((n, c) => n + c.tokens, 0);
    const sentEnd = this.jobFrame(attempt, {
      type: "end",
      request_id: job.request_id,
      attempt_n: job.attempt_n,
      terminal_state: terminal,
      finish_reason: finish,
      usage: { input_tokens: plan.inputTokens, output_tokens: outputTokens },
      ...(inline ? { receipt } : {}),
    });
    if (sentEnd && plan.disconnectAfterFrames === attempt.framesSent) this.disconnect(`fault after the end of ${key}`);
    // The end may never leave (the disconnect fault): the receipt still waits in the outbox, as the runtime's does.
    if (plan.receipt === "never") return;
    this.outbox.set(key, receipt);
    const socket = this.socket;
    if (sentEnd && plan.receipt === "twice") this.send({ type: "receipt", request_id: job.request_id, attempt_n: job.attempt_n, receipt });
    if (plan.receipt === "late") {
      this.clock.at(100 + this.rng.int(12_000), () => {
        if (this.socket === socket && this.connected && this.admitted) this.send({ type: "receipt", request_id: job.request_id, attempt_n: job.attempt_n, receipt });
      });
    }
  }

  /** A receipt for what the attempt sent (or the prefix within `boundBytes`); tampered when the plan says so. */
  private receipt(attempt: SimAttempt, terminal: TerminalState, boundBytes: number | null): string {
    const { job, plan } = attempt;
    // The receipt binds chunks in seq order (what the gateway relayed), as far as the bound allows.
    const inOrder = [...attempt.sent].sort((a, b) => plan.chunks.indexOf(a) - plan.chunks.indexOf(b));
    const unique = inOrder.filter((c, i) => inOrder.indexOf(c) === i);
    const bound: Chunk[] = [];
    let bytes = 0;
    for (const c of unique) {
      if (boundBytes !== null && bytes + utf8(c.content) > boundBytes) break;
      bytes += utf8(c.content);
      bound.push(c);
    }
    const content = bound.map((c) => c.content).join("");
    const tokens = bound.reduce((n, c) => n + c.tokens, 0);
    const finish = terminal === "normal_done" ? "stop" : null;
    const input = Math.min(plan.inputTokens, promptBoundOf(job.messages as never));
    const now = this.clock.wall();
    const r = job.route;
    const values = {
      request_id: job.request_id,
      attempt_n: job.attempt_n,
      provider_id: this.id,
      key: this.key,
      ...receiptRouteFields(r),
      model_id: job.model_id,
      model_hash: plan.wrongHash ? "f".repeat(64) : this.o.model.model_hash,
      output_hash: outputHashOf({ content, finish_reason: finish, start: 0, end: utf8(content), terminal_state: terminal, tool_calls: null }),
      start: 0,
      end: utf8(content),
      terminal_state: terminal,
      terminal_state_ts_unix_ms: now,
      issued_at_unix_ms: now,
      billable_input_tokens: input,
      billable_output_tokens: tokens,
      delivered_output_bytes: utf8(content),
      observed_input_tokens: input,
      observed_output_tokens: tokens,
    };
    if (plan.receipt === "inflated") {
      values.billable_output_tokens += 5;
      values.observed_output_tokens += 5;
    }
    if (plan.receipt === "forged") return signFields(fieldsOf(values), keyFromSeed(new Uint8Array(32).fill(7)));
    return signFields(fieldsOf(values), this.key);
  }
}
