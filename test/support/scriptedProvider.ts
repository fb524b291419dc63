// A scripted provider for settlement tests: a real WebSocket client speaking protocol v1 (msgpack
// frames, Ed25519 handshake) whose answer to every job is a script — accept with a chosen model hash,
// send chunks, answer `cancel`, end with a receipt. Receipts are signed by the independent test signer
// (test/receipts/independent-signer.ts, written from docs/receipts.md alone), never by src/receipts, and every
// field can be tampered with before signing.
import { randomBytes, type KeyObject } from "node:crypto";
import { decodeGatewayFrame, encodeFrame } from "../../src/wire/codec.ts";
import { signHandshake } from "../../src/wire/handshake.ts";
import type {
  CancelFrame,
  DeclineCode,
  EndFrame,
  GatewayFrame,
  HelloFrame,
  JobFrame,
  ModelEntry,
  ProviderFrame,
  SettledFrame,
  TerminalState,
  ToolCallDelta,
} from "../../src/wire/frames.ts";
import {
  fieldsOf,
  keyFromSeed,
  outputHashOf,
  rawPublic,
  signFields,
  type Fields,
  type ReceiptValues,
  type ToolCall,
} from "../receipts/independent-signer.ts";
import { modelHash, waitFor } from "./harness.ts";

export interface SentChunk {
  content?: string;
  tool_calls?: ToolCallDelta[];
  tokens: number;
}

/** How a receipt is built; every knob defaults to the honest value. */
export interface ReceiptOptions {
  terminal_state?: TerminalState;
  /** Default "stop" for normal_done, null otherwise. */
  finish_reason?: string | null;
  /** Bind only the longest chunk prefix whose content bytes total at most this (the cancel rule). */
  boundBytes?: number;
  /** observed = billable input tokens; default the provider's `inputTokens`. */
  inputTokens?: number;
  /** Values to replace after the honest ones are computed (then signed). */
  values?: Partial<ReceiptValues>;
  /** Edits the (name, JSON text) member list before signing: drop or add fields. */
  editFields?: (fields: Fields) => Fields;
  /** Sign with this key instead of the provider's. */
  signWith?: KeyObject;
  /** Changes the finished envelope (e.g. flips a signature character). */
  mutateEnvelope?: (envelope: string) => string;
}

export interface EndOptions {
  terminal_state?: TerminalState;
  finish_reason?: string | null;
  /** `usage.input_tokens`; default the provider's `inputTokens`. */
  inputTokens?: number;
  /** An envelope, options for building one, or null to send `end` without a receipt. */
  receipt?: string | ReceiptOptions | null;
}

/** A test provider's `hello` (docs/protocol.md): who it is, its receipt key, capacity and models. */
export const helloFrame = (o: { id: string; publicKey: Uint8Array; runtime: string; ramGb: number; maxConcurrency: number; models: HelloFrame["models"] }): HelloFrame => ({
  type: "hello",
  protocol: 1,
  provider_id: o.id,
  receipt_public_key: o.publicKey,
  runtime: { name: o.runtime, version: "0.0.0" },
  hardware: { ram_gb: o.ramGb },
  max_concurrency: o.maxConcurrency,
  models: o.models,
});

/** The receipt fields a provider copies from the job's route, as every honest signer does. */
export const receiptRouteFields = (r: JobFrame["route"]) => ({
  account_scope: r.account_scope,
  expected_catalog_model_hash: r.expected_catalog_model_hash,
  catalog_id: r.catalog_id,
  catalog_body_digest: r.catalog_body_digest,
  route_snapshot_digest: r.route_snapshot_digest,
  route_snapshot_mode: r.route_snapshot_mode,
  route_snapshot_policy_version: r.route_snapshot_policy_version,
  prompt_hash: r.prompt_hash,
});

/** UTF-8 byte length. */
export const utf8 = (text: string) => Buffer.byteLength(text, "utf8");

/** Delivered calls from tool-call deltas, per docs/receipts.md (first id/name wins, raw arguments). */
function assembleToolCalls(chunks: readonly SentChunk[]): ToolCall[] | null {
  const calls = new Map<number, ToolCall>();
  for (const c of chunks) {
    for (const d of c.tool_calls ?? []) {
      const call = calls.get(d.index) ?? { index: d.index, id: null, name: null, arguments: "" };
      if (call.id === null && d.id !== undefined) call.id = d.id;
      if (call.name === null && d.name !== undefined) call.name = d.name;
      if (d.arguments !== undefined) call.arguments += d.arguments;
      calls.set(d.index, call);
    }
  }
  return calls.size === 0 ? null : [...calls.values()].sort((a, b) => a.index - b.index);
}

/** The cancel rule: the longest chunk prefix whose content bytes total at most `bytes`. */
function withinBytes(chunks: readonly SentChunk[], bytes: number): SentChunk[] {
  const out: SentChunk[] = [];
  let total = 0;
  for (const c of chunks) {
    total += c.content === undefined ? 0 : utf8(c.content);
    if (total > bytes) break;
    out.push(c);
  }
  return out;
}

/** One job as the script sees it. */
export class ScriptedAttempt {
  readonly sent: SentChunk[] = [];
  acceptedHash: string | null = null;
  cancel: CancelFrame | null = null;
  private seq = 0;
  private cancelWaiters: ((c: CancelFrame) => void)[] = [];

  constructor(
    readonly provider: ScriptedProvider,
    readonly job: JobFrame,
  ) {}

  get key(): string {
    return `${this.job.request_id}#${this.job.attempt_n}`;
  }

  private send(frame: ProviderFrame): void {
    this.provider.send(frame);
  }

  /** `accepted` with the hash this provider advertises for the model, or the one given. */
  accept(hash: string = this.provider.advertisedHash(this.job.model_id)): void {
    this.acceptedHash = hash;
    this.send({ type: "accepted", request_id: this.job.request_id, attempt_n: this.job.attempt_n, model_hash: hash });
  }

  decline(code: DeclineCode = "queue_full"): void {
    this.send({ type: "declined", request_id: this.job.request_id, attempt_n: this.job.attempt_n, code });
  }

  chunk(content: string | undefined, tokens = 1, tool_calls?: ToolCallDelta[]): void {
    const c: SentChunk = { tokens };
    if (content !== undefined) c.content = content;
    if (tool_calls !== undefined) c.tool_calls = tool_calls;
    this.sent.push(c);
    this.send({ type: "chunk", request_id: this.job.request_id, attempt_n: this.job.attempt_n, seq: this.seq++, ...c });
  }

  /** Resolves with the gateway's `cancel` for this attempt. */
  cancelled(timeoutMs = 5000): Promise<CancelFrame> {
    if (this.cancel) return Promise.resolve(this.cancel);
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`no cancel for ${this.key}`)), timeoutMs);
      this.cancelWaiters.push((c) => {
        clearTimeout(timer);
        resolve(c);
      });
    });
  }

  /** @internal */
  cancelReceived(frame: CancelFrame): void {
    this.cancel = frame;
    for (const w of this.cancelWaiters.splice(0)) w(frame);
  }

  /** The honest receipt values for what this attempt sent (or the bound prefix), before tampering. */
  receiptValues(o: ReceiptOptions = {}): ReceiptValues {
    const terminal_state = o.terminal_state ?? "normal_done";
    const finish_reason = o.finish_reason !== undefined ? o.finish_reason : terminal_state === "normal_done" ? "stop" : null;
    const bound = o.boundBytes === undefined ? this.sent : withinBytes(this.sent, o.boundBytes);
    const content = bound.map((c) => c.content ?? "").join("");
    const bytes = utf8(content);
    const tokens = bound.reduce((n, c) => n + c.tokens, 0);
    const input = o.inputTokens ?? this.provider.inputTokens;
    const now = Date.now();
    const r = this.job.route;
    return {
      request_id: this.job.request_id,
      attempt_n: this.job.attempt_n,
      provider_id: this.provider.id,
      key: this.provider.key,
      ...receiptRouteFields(r),
      model_id: this.job.model_id,
      model_hash: this.acceptedHash ?? this.provider.advertisedHash(this.job.model_id),
      output_hash: outputHashOf({ content, finish_reason, start: 0, end: bytes, terminal_state, tool_calls: assembleToolCalls(bound) }),
      start: 0,
      end: bytes,
      terminal_state,
      terminal_state_ts_unix_ms: now,
      issued_at_unix_ms: now,
      billable_input_tokens: input,
      billable_output_tokens: tokens,
      delivered_output_bytes: bytes,
      observed_input_tokens: input,
      observed_output_tokens: tokens,
      ...o.values,
    };
  }

  /** A signed envelope, honest unless the options tamper with it. */
  receipt(o: ReceiptOptions = {}): string {
    const values = this.receiptValues(o);
    const fields = (o.editFields ?? ((f) => f))(fieldsOf(values));
    const envelope = signFields(fields, o.signWith ?? this.provider.key);
    return o.mutateEnvelope ? o.mutateEnvelope(envelope) : envelope;
  }

  /** `end`, by default `normal_done` with an honest receipt binding every chunk sent. */
  end(o: EndOptions = {}): void {
    const terminal_state = o.terminal_state ?? "normal_done";
    const finish_reason = o.finish_reason !== undefined ? o.finish_reason : terminal_state === "normal_done" ? "stop" : null;
    const receipt =
      o.receipt === null
        ? undefined
        : typeof o.receipt === "string"
          ? o.receipt
          : this.receipt({ terminal_state, finish_reason, inputTokens: o.inputTokens, ...o.receipt });
    const frame: EndFrame = {
      type: "end",
      request_id: this.job.request_id,
      attempt_n: this.job.attempt_n,
      terminal_state,
      finish_reason,
      usage: { input_tokens: o.inputTokens ?? this.provider.inputTokens, output_tokens: this.sent.reduce((n, c) => n + c.tokens, 0) },
      ...(receipt === undefined ? {} : { receipt }),
    };
    this.send(frame);
  }

  /** A `receipt` frame (a late receipt) for this attempt. */
  sendReceipt(envelope: string): void {
    this.send({ type: "receipt", request_id: this.job.request_id, attempt_n: this.job.attempt_n, receipt: envelope });
  }
}

export type Script = (attempt: ScriptedAttempt) => void | Promise<void>;

/** The honest default: accept, two chunks, `end` with a receipt. */
export const honestScript: Script = (a) => {
  a.accept();
  a.chunk("Hello, ", 2);
  a.chunk("world!", 1);
  a.end();
};

export interface ScriptedProviderOptions {
  /** ws://…/v1/provider/connect */
  url: string;
  id: string;
  /** 32-byte Ed25519 seed; the same seed reconnects as the same key. Default: random. */
  seed?: Uint8Array;
  /** Advertised models: an id (advertised with modelHash(id)) or an explicit entry. */
  models: readonly (string | { model_id: string; model_hash: string })[];
  maxConcurrency?: number;
  script?: Script;
  /** Prompt tokens this provider reports (usage.input_tokens and the receipt's input tokens). */
  inputTokens?: number;
}

/** A provider over a real WebSocket whose job answers are scripted. Use `ScriptedProvider.connect`. */
export class ScriptedProvider {
  readonly id: string;
  readonly seed: Uint8Array;
  readonly key: KeyObject;
  readonly publicKeyRaw: Uint8Array;
  readonly models: ModelEntry[];
  script: Script;
  inputTokens: number;
  readonly jobs: JobFrame[] = [];
  readonly attempts = new Map<string, ScriptedAttempt>();
  readonly settled: SettledFrame[] = [];
  readonly cancels: CancelFrame[] = [];
  /** Errors thrown by scripts (a test should expect none). */
  readonly errors: unknown[] = [];
  closeCode: number | null = null;
  private ws!: WebSocket;
  private heartbeat: ReturnType<typeof setInterval> | null = null;

  private constructor(private readonly o: ScriptedProviderOptions) {
    this.id = o.id;
    this.seed = o.seed ?? new Uint8Array(randomBytes(32));
    this.key = keyFromSeed(this.seed);
    this.publicKeyRaw = rawPublic(this.key);
    this.models = o.models.map((m) =>
      typeof m === "string" ? { model_id: m, model_hash: modelHash(m), max_context_tokens: 8192 } : { ...m, max_context_tokens: 8192 },
    );
    this.script = o.script ?? honestScript;
    this.inputTokens = o.inputTokens ?? 7;
  }

  /** Connects, completes the handshake and resolves once welcomed. */
  static async connect(o: ScriptedProviderOptions): Promise<ScriptedProvider> {
    const p = new ScriptedProvider(o);
    await p.open();
    return p;
  }

  get publicKeyBase64(): string {
    return Buffer.from(this.publicKeyRaw).toString("base64");
  }

  advertisedHash(modelId: string): string {
    return this.models.find((m) => m.model_id === modelId)?.model_hash ?? modelHash(modelId);
  }

  send(frame: ProviderFrame): void {
    if (this.ws.readyState === WebSocket.OPEN) this.ws.send(encodeFrame(frame));
  }

  private open(): Promise<void> {
    this.ws = new WebSocket(this.o.url);
    this.ws.binaryType = "arraybuffer";
    return new Promise((resolve, reject) => {
      this.ws.addEventListener("open", () => {
        this.send(helloFrame({ id: this.id, publicKey: this.publicKeyRaw, runtime: "scripted-test-provider", ramGb: 16, maxConcurrency: this.o.maxConcurrency ?? 4, models: this.models }));
      });
      this.ws.addEventListener("error", () => reject(new Error(`${this.id}: websocket error`)));
      this.ws.addEventListener("close", (e) => {
        this.closeCode = e.code;
        this.stopHeartbeat();
        reject(new Error(`${this.id}: closed with ${e.code} before welcome`));
      });
      this.ws.addEventListener("message", (event) => {
        const decoded = decodeGatewayFrame(event.data as ArrayBuffer);
        if (!decoded.ok) {
          this.errors.push(new Error(`gateway sent an invalid frame (${decoded.reason})`));
          return;
        }
        this.onFrame(decoded.frame, resolve);
      });
    });
  }

  private onFrame(frame: GatewayFrame, welcomed: () => void): void {
    switch (frame.type) {
      case "challenge":
        this.send({ type: "auth", signature: signHandshake(this.key, frame.session_id, this.id, frame.nonce) });
        return;
      case "welcome":
        this.heartbeat = setInterval(() => this.sendHeartbeat(), frame.heartbeat_interval_ms);
        welcomed();
        return;
      case "job": {
        this.jobs.push(frame);
        const attempt = new ScriptedAttempt(this, frame);
        this.attempts.set(attempt.key, attempt);
        Promise.resolve()
          .then(() => this.script(attempt))
          .catch((e) => this.errors.push(e));
        return;
      }
      case "cancel":
        this.cancels.push(frame);
        this.attempts.get(`${frame.request_id}#${frame.attempt_n}`)?.cancelReceived(frame);
        return;
      case "settled":
        this.settled.push(frame);
        return;
      case "drain":
        return;
    }
  }

  /** One `heartbeat` now: ready, every slot free, the advertised models. */
  sendHeartbeat(): void {
    this.send({ type: "heartbeat", state: "ready", slots_free: this.o.maxConcurrency ?? 4, models: this.models });
  }

  attempt(requestId: string, attemptN = 0): ScriptedAttempt {
    const a = this.attempts.get(`${requestId}#${attemptN}`);
    if (!a) throw new Error(`${this.id} never got ${requestId}#${attemptN}`);
    return a;
  }

  /** The last job this provider received. */
  lastJob(): JobFrame {
    const job = this.jobs.at(-1);
    if (!job) throw new Error(`${this.id} has received no job`);
    return job;
  }

  async waitForJobs(n: number, timeoutMs = 5000): Promise<JobFrame> {
    await waitFor(() => this.jobs.length >= n, timeoutMs, `${this.id}: ${n} jobs`);
    return this.jobs[n - 1]!;
  }

  async waitForSettled(requestId: string, attemptN = 0, timeoutMs = 5000): Promise<SettledFrame> {
    const find = () => this.settled.find((s) => s.request_id === requestId && s.attempt_n === attemptN);
    await waitFor(() => find() !== undefined, timeoutMs, `${this.id}: settled ${requestId}#${attemptN}`);
    return find()!;
  }

  private stopHeartbeat(): void {
    if (this.heartbeat) clearInterval(this.heartbeat);
    this.heartbeat = null;
  }

  async close(): Promise<void> {
    this.stopHeartbeat();
    if (this.ws.readyState === WebSocket.CLOSED) return;
    const closed = new Promise<void>((resolve) => this.ws.addEventListener("close", () => resolve(), { once: true }));
    this.ws.close(1000);
    await closed;
  }
}
