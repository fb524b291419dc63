// The reference provider runtime: one WebSocket session at a time to the gateway (docs/protocol.md), jobs run
// on an Engine, reconnect with full-jitter backoff. A plain class: this is an I/O edge, not domain code.
import type { KeyObject } from "node:crypto";
import { encodeChunkFrame } from "../wire/chunkEncode.ts";
import { decodeGatewayFrame, encodeFrame } from "../wire/codec.ts";
import {
  CloseCode,
  MAX_FRAME_BYTES,
  type CancelFrame,
  type GatewayFrame,
  type JobFrame,
  type ModelEntry,
  type ProviderFrame,
  type ProviderLoad,
  type SettledFrame,
  type WelcomeFrame,
} from "../wire/frames.ts";
import type { Engine } from "./engine.ts";
import { signHandshake } from "../wire/handshake.ts";
import { Emitter, type LogFn, type RuntimeEvents } from "./events.ts";
import { declineJob, startAttempt, type Attempt } from "./attempt.ts";
import { createReceiptSigner, type ReceiptSigner } from "../receipts/index.ts";
import { ReceiptOutbox } from "./outbox.ts";

export type { LogFn, RuntimeEvents } from "./events.ts";

export interface Timers {
  setTimeout(fn: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
  setInterval(fn: () => void, ms: number): unknown;
  clearInterval(handle: unknown): void;
}

const realTimers: Timers = {
  setTimeout: (fn, ms) => setTimeout(fn, ms),
  clearTimeout: (h) => clearTimeout(h as ReturnType<typeof setTimeout>),
  setInterval: (fn, ms) => setInterval(fn, ms),
  clearInterval: (h) => clearInterval(h as ReturnType<typeof setInterval>),
};

export interface ProviderRuntimeOptions {
  gatewayUrl: string;
  /**
   * More gateways of one cluster (docs/scale-out.md): after a dropped or refused connection the
   * runtime tries the next URL of [gatewayUrl, ...moreGatewayUrls], in turn.
   */
  moreGatewayUrls?: readonly string[];
  providerId: string;
  key: { privateKey: KeyObject; publicKeyRaw: Uint8Array };
  engine: Engine;
  models: ModelEntry[];
  maxConcurrency?: number;
  hardware?: { ram_gb: number; chip?: string };
  runtime?: { name: string; version: string };
  backoff?: { minMs?: number; maxMs?: number };
  log?: LogFn;
  /** What an engine's exit fault does; default: drop the socket without a close handshake. */
  die?: () => void;
  random?: () => number;
  timers?: Timers;
  /** Time allowed for a clean close in stop() before the socket is dropped (default 2000 ms). */
  stopTimeoutMs?: number;
  /** Liveness watchdog of the socket (see DEFAULT_WATCHDOG). */
  watchdog?: { pingIntervalMs?: number; timeoutMs?: number };
  /** Wall clock for the watchdog and the receipts' timestamps; default Date.now. */
  now?: () => number;
  /**
   * The models to advertise now (hello, heartbeats, which jobs to take); default `models`. The CLI
   * passes the catalog watcher's list, so a model retired from the catalog stops being advertised.
   */
  advertisedModels?: () => ModelEntry[];
  /** Receipts the gateway may not have yet (default: a fresh in-memory outbox). */
  outbox?: ReceiptOutbox;
}

/**
 * A socket can die without a close: the Mac slept, a NAT dropped the flow, the gateway host vanished.
 * TCP then says nothing for minutes while the gateway has long evicted the session (3 missed
 * heartbeats, 30 s by default). So the runtime pings every `pingIntervalMs` and drops the socket when
 * nothing at all — pong, frame, or the open itself — arrived for `timeoutMs`, then reconnects. The
 * silence is measured on the wall clock, which keeps running while a machine sleeps (a monotonic clock
 * may not), so the first tick after a wake-up reconnects at once.
 */
/** Receipts re-sent per second at most: half the gateway's default budget (receiptFramesPerSecond). */
export const OUTBOX_RESEND_PER_SECOND = 100;

export const DEFAULT_WATCHDOG = { pingIntervalMs: 5_000, timeoutMs: 15_000 } as const;

export interface ProviderRuntime {
  /** True between `welcome` and the session's close. */
  readonly connected: boolean;
  readonly sessionId: string | null;
  /** Subscribes to a test/observability hook; returns the unsubscribe function. */
  on<E extends keyof RuntimeEvents>(event: E, fn: RuntimeEvents[E]): () => void;
  /** Closes the session cleanly (1000) and stops reconnecting. */
  stop(): Promise<void>;
  /** The advertised models changed: tell the gateway now rather than at the next heartbeat. */
  modelsChanged(): void;
}

const OPERATOR_REFUSALS: ReadonlySet<number> = new Set([
  CloseCode.authFailed,
  CloseCode.banned,
  CloseCode.keyMismatch,
  CloseCode.replaced,
]);

type Phase = "hello_sent" | "auth_sent" | "admitted" | "closed";

interface Session {
  ws: WebSocket;
  phase: Phase;
  sessionId: string | null;
  heartbeat: unknown;
  watchdog: unknown;
  /** Wall-clock time of the last sign of life from the gateway (or of the connect attempt). */
  lastHeardMs: number;
  draining: boolean;
  jobs: Map<string, Attempt>;
  closed: Promise<void>;
}

/** Which gateway frames each phase accepts; anything else is out of turn (1008). */
const ALLOWED: Record<Phase, ReadonlySet<GatewayFrame["type"]>> = {
  hello_sent: new Set(["challenge"]),
  auth_sent: new Set(["welcome"]),
  admitted: new Set(["job", "cancel", "drain", "settled"]),
  closed: new Set(),
};

const jobKey = (f: { request_id: string; attempt_n: number }) => `${f.attempt_n}/${f.request_id}`;
/**
 * Ended attempts kept for a crossing cancel. The gateway settles an attempt within milliseconds of its
 * receipt, which drops it here; only attempts it holds pending (a crossing) stay, so this is ample.
 */
const ENDED_KEPT = 1024;

class Runtime implements ProviderRuntime {
  private readonly events = new Emitter<RuntimeEvents>();
  private readonly log: LogFn;
  private readonly timers: Timers;
  private readonly maxConcurrency: number;
  private readonly now: () => number;
  private readonly pingIntervalMs: number;
  /** Output tokens sent since `since` (ms), and the decode rate last reported. */
  private readonly decode = { tokens: 0, since: 0, rate: 0 };
  private readonly watchdogTimeoutMs: number;
  private session: Session | null = null;
  private stopped = false;
  private reconnectTimer: unknown = null;
  /** The next paced outbox flush, while receipts wait for it. */
  private flushTimer: unknown = null;
  private failures = 0; // connection attempts since the last welcome: the backoff exponent
  private readonly gatewayUrls: string[];
  /** Which of gatewayUrls the next connection goes to. */
  private gatewayIndex = 0;
  private readonly signer: ReceiptSigner;
  private readonly outbox: ReceiptOutbox;
  /** Ended attempts not settled yet, by jobKey, oldest first (rememberEnded). */
  private readonly ended = new Map<string, Attempt>();

  constructor(private readonly options: ProviderRuntimeOptions) {
    this.log = options.log ?? (() => {});
    this.timers = options.timers ?? realTimers;
    this.maxConcurrency = options.maxConcurrency ?? 1;
    this.now = options.now ?? Date.now;
    this.pingIntervalMs = options.watchdog?.pingIntervalMs ?? DEFAULT_WATCHDOG.pingIntervalMs;
    this.watchdogTimeoutMs = options.watchdog?.timeoutMs ?? DEFAULT_WATCHDOG.timeoutMs;
    if (!(this.pingIntervalMs > 0 && this.watchdogTimeoutMs > this.pingIntervalMs)) {
      throw new Error("watchdog: pingIntervalMs must be positive and below timeoutMs");
    }
    this.gatewayUrls = [options.gatewayUrl, ...(options.moreGatewayUrls ?? [])];
    if (!this.gatewayUrls.every((url) => /^wss?:\/\//.test(url))) throw new Error("gatewayUrl must be ws:// or wss://");
    if (!Number.isInteger(this.maxConcurrency) || this.maxConcurrency < 1) {
      throw new Error("maxConcurrency must be a positive integer");
    }
    this.events.onListenerError = (event) => this.log("listener_error", { hook: event });
    // The receipt key is the session key (`hello.receipt_public_key`): the gateway verifies receipts
    // under the key the session authenticated with.
    this.signer = createReceiptSigner(options.key.privateKey, options.providerId);
    this.outbox = options.outbox ?? new ReceiptOutbox({ now: this.now, log: this.log });
  }

  private models(): ModelEntry[] {
    return this.options.advertisedModels?.() ?? this.options.models;
  }

  modelsChanged(): void {
    const session = this.session;
    if (session?.phase === "admitted") this.sendHeartbeat(session);
  }

  get connected(): boolean {
    return this.session?.phase === "admitted";
  }

  get sessionId(): string | null {
    return this.connected ? (this.session?.sessionId ?? null) : null;
  }

  on<E extends keyof RuntimeEvents>(event: E, fn: RuntimeEvents[E]): () => void {
    return this.events.on(event, fn);
  }

  connect(): void {
    this.reconnectTimer = null;
    if (this.stopped) return;
    const url = this.gatewayUrls[this.gatewayIndex]!;
    this.log("connecting", { url, attempt: this.failures });
    const ws = new WebSocket(url);
    ws.binaryType = "arraybuffer";
    let markClosed = () => {};
    const session: Session = {
      ws,
      phase: "hello_sent",
      sessionId: null,
      heartbeat: null,
      watchdog: null,
      lastHeardMs: this.now(),
      draining: false,
      jobs: new Map(),
      closed: new Promise((resolve) => (markClosed = resolve)),
    };
    this.session = session;
    // Started before the open: a connect that hangs (e.g. SYNs into a sleeping network) counts as silence too.
    session.watchdog = this.timers.setInterval(() => this.watchdogTick(session), this.pingIntervalMs);
    const heard = () => (session.lastHeardMs = this.now());
    ws.addEventListener("pong", heard);
    ws.onopen = () => {
      heard();
      this.sendHello(session);
    };
    ws.onmessage = (event) => {
      heard();
      this.onMessage(session, event.data as unknown);
    };
    ws.onerror = () => this.log("socket_error", {});
    ws.onclose = (event) => {
      this.onClose(session, event.code, event.reason);
      markClosed();
    };
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.reconnectTimer !== null) this.timers.clearTimeout(this.reconnectTimer);
    this.reconnectTimer = null;
    if (this.flushTimer !== null) this.timers.clearTimeout(this.flushTimer);
    this.flushTimer = null;
    const session = this.session;
    if (session && session.phase !== "closed") {
      session.ws.close(CloseCode.normal, "provider stopping");
      let fallback: unknown;
      const timedOut = new Promise<void>((resolve) => {
        fallback = this.timers.setTimeout(() => {
          session.ws.terminate();
          resolve();
        }, this.options.stopTimeoutMs ?? 2000);
      });
      await Promise.race([session.closed, timedOut]);
      this.timers.clearTimeout(fallback);
      // Abandoned attempts sign their receipts into the outbox as their engines return; wait for
      // them (bounded) so the outbox file holds those receipts before the process exits.
      let giveUp: unknown;
      const enough = new Promise<void>((resolve) => (giveUp = this.timers.setTimeout(resolve, this.options.stopTimeoutMs ?? 2000)));
      await Promise.race([Promise.all([...session.jobs.values()].map((a) => a.done)), enough]);
      this.timers.clearTimeout(giveUp);
    }
    await this.outbox.saved();
    this.log("stopped", {});
  }

  // ---- session ----

  /** False when the frame could not be handed to the socket (closed or closing). */
  private send(session: Session, frame: ProviderFrame): boolean {
    if (session.phase === "closed" || session.ws.readyState !== WebSocket.OPEN) return false;
    session.ws.send(frame.type === "chunk" ? encodeChunkFrame(frame) : encodeFrame(frame));
    return true;
  }

  private sendHello(session: Session): void {
    const { providerId, key, hardware, runtime } = this.options;
    const models = this.models();
    this.log("connected", { url: this.gatewayUrls[this.gatewayIndex] });
    this.send(session, {
      type: "hello",
      protocol: 1,
      provider_id: providerId,
      receipt_public_key: key.publicKeyRaw,
      runtime: runtime ?? { name: "gateway-provider", version: "0.1.0" },
      hardware: hardware ?? { ram_gb: 0 },
      max_concurrency: this.maxConcurrency,
      models,
    });
  }

  private watchdogTick(session: Session): void {
    if (session.phase === "closed") return;
    const silentMs = this.now() - session.lastHeardMs;
    if (silentMs >= this.watchdogTimeoutMs) {
      this.log("watchdog_timeout", { silent_ms: silentMs, phase: session.phase });
      this.timers.clearInterval(session.watchdog);
      session.watchdog = null;
      // No close handshake: the peer is not answering, and the close event (1006) schedules the reconnect.
      session.ws.terminate();
      return;
    }
    if (session.ws.readyState === WebSocket.OPEN) session.ws.ping();
  }

  private violation(session: Session, closeCode: number, reason: string, fields: Record<string, unknown>): void {
    this.log("invalid_frame", { reason, close_code: closeCode, ...fields });
    session.ws.close(closeCode, reason);
  }

  private onMessage(session: Session, data: unknown): void {
    // After we started closing (e.g. on a bad frame) nothing more from this socket is acted on.
    if (session.phase === "closed" || session.ws.readyState !== WebSocket.OPEN) return;
    if (data instanceof ArrayBuffer && data.byteLength > MAX_FRAME_BYTES) {
      return this.violation(session, CloseCode.messageTooBig, "too_big", { bytes: data.byteLength });
    }
    const decoded = decodeGatewayFrame(data as string | ArrayBuffer);
    if (!decoded.ok) return this.violation(session, decoded.closeCode, decoded.reason, {});
    const frame = decoded.frame;
    if (!ALLOWED[session.phase].has(frame.type)) {
      const fields = { type: frame.type, phase: session.phase };
      return this.violation(session, CloseCode.policyViolation, "out_of_turn", fields);
    }
    switch (frame.type) {
      case "challenge": {
        const { privateKey } = this.options.key;
        const signature = signHandshake(privateKey, frame.session_id, this.options.providerId, frame.nonce);
        session.phase = "auth_sent";
        this.send(session, { type: "auth", signature });
        return;
      }
      case "welcome":
        return this.onWelcome(session, frame);
      case "job":
        return this.onJob(session, frame);
      case "cancel":
        return this.onCancel(session, frame);
      case "drain":
        session.draining = true;
        this.log("drain_received", { in_flight: session.jobs.size });
        this.sendHeartbeat(session); // tell the gateway at once rather than at the next interval
        return this.events.emit("drain");
      case "settled":
        return this.onSettled(frame);
    }
  }

  private onWelcome(session: Session, frame: WelcomeFrame): void {
    session.phase = "admitted";
    session.sessionId = frame.session_id;
    this.failures = 0; // backoff restarts from minMs once a session was admitted
    session.heartbeat = this.timers.setInterval(() => this.sendHeartbeat(session), frame.heartbeat_interval_ms);
    const { session_id, tier, heartbeat_interval_ms, catalog_id } = frame;
    this.log("welcome", { session_id, tier, heartbeat_interval_ms, catalog_id });
    this.events.emit("welcome", frame);
    this.flushOutbox();
  }

  private sendHeartbeat(session: Session): void {
    const slotsFree = Math.max(0, this.maxConcurrency - session.jobs.size);
    const state = session.draining ? "draining" : slotsFree === 0 ? "busy" : "ready";
    this.send(session, { type: "heartbeat", state, slots_free: slotsFree, models: this.models(), load: this.load(session) });
  }

  /**
   * The heartbeat's load report (docs/protocol.md): jobs with no output yet, the decode rate since the
   * last report (all jobs), and the output tokens still to come of the running jobs.
   */
  private load(session: Session): ProviderLoad {
    let queued = 0;
    let outstanding = 0;
    for (const attempt of session.jobs.values()) {
      const { sentTokens, maxTokens } = attempt.progress();
      if (sentTokens === 0) queued++;
      outstanding += Math.max(0, maxTokens - sentTokens);
    }
    const now = this.now();
    if (this.decode.since === 0) this.decode.since = now;
    const seconds = (now - this.decode.since) / 1000;
    // A rate over less than a second says little: keep the last one until more time has passed.
    if (seconds >= 1) {
      this.decode.rate = Math.round((this.decode.tokens / seconds) * 10) / 10;
      this.decode.tokens = 0;
      this.decode.since = now;
    }
    return { queued_jobs: queued, decode_tokens_per_s: this.decode.rate, outstanding_output_tokens: outstanding };
  }

  private onSettled(frame: SettledFrame): void {
    const { request_id, attempt_n, label, reason, provider_credits } = frame;
    this.log("settled", { request_id, attempt_n, label, reason, provider_credits });
    this.outbox.settled(frame, label);
    if (label !== "pending") this.ended.delete(jobKey(frame));
    this.events.emit("settled", frame);
  }

  private onClose(session: Session, code: number, reason: string): void {
    session.phase = "closed";
    if (session.heartbeat !== null) this.timers.clearInterval(session.heartbeat);
    if (session.watchdog !== null) this.timers.clearInterval(session.watchdog);
    // The gateway treats in-flight attempts of a lost socket as lost; stop spending work on them.
    for (const attempt of session.jobs.values()) attempt.abandon();
    this.log("closed", { code, reason });
    this.events.emit("closed", code, reason);
    if (this.stopped || this.session !== session) return;
    const minMs = this.options.backoff?.minMs ?? 250;
    const maxMs = this.options.backoff?.maxMs ?? 30_000;
    // Refusals that only an operator can lift (bad key, ban, binding, replaced by a twin) retry at the
    // slowest pace, so a misconfigured machine does not hammer the gateway.
    const ceiling = OPERATOR_REFUSALS.has(code) ? maxMs : Math.min(maxMs, minMs * 2 ** this.failures);
    const delayMs = Math.floor((this.options.random ?? Math.random)() * ceiling); // full jitter
    this.failures = Math.min(this.failures + 1, 30);
    // The gateway that dropped or refused us may be gone: the next one of a cluster is tried.
    this.gatewayIndex = (this.gatewayIndex + 1) % this.gatewayUrls.length;
    this.log("reconnect_scheduled", { delay_ms: delayMs, attempt: this.failures, url: this.gatewayUrls[this.gatewayIndex] });
    this.reconnectTimer = this.timers.setTimeout(() => this.connect(), delayMs);
  }

  /**
   * Sends held receipts on the current session, when one is admitted (docs/protocol.md `receipt`), at most
   * OUTBOX_RESEND_PER_SECOND a second: the gateway closes a session that sends receipts settling
   * nothing faster than its budget (docs/reliability.md), and a large outbox may be mostly those.
   */
  private flushOutbox(): void {
    const session = this.session;
    if (session?.phase !== "admitted") return;
    const sent = this.outbox.flush(session, (frame) => this.send(session, frame), OUTBOX_RESEND_PER_SECOND);
    if (sent < OUTBOX_RESEND_PER_SECOND || this.flushTimer !== null) return;
    this.flushTimer = this.timers.setTimeout(() => {
      this.flushTimer = null;
      this.flushOutbox();
    }, 1000);
  }

  // ---- jobs ----

  private onJob(session: Session, job: JobFrame): void {
    const ids = { request_id: job.request_id, attempt_n: job.attempt_n };
    this.log("job_received", { ...ids, model_id: job.model_id, max_tokens: job.params.max_tokens });
    this.events.emit("job", job.request_id, job.attempt_n);
    const key = jobKey(job);
    if (session.jobs.has(key)) return this.log("frame_ignored", { type: "job", ...ids, why: "duplicate" });
    const send = (frame: ProviderFrame) => this.send(session, frame);
    const model = this.models().find((m) => m.model_id === job.model_id);
    if (!model) return declineJob(job, "model_not_loaded", { send, log: this.log });
    // Draining takes no new work; queue_full sends the request elsewhere without blaming the model.
    if (session.draining || session.jobs.size >= this.maxConcurrency) {
      return declineJob(job, "queue_full", { send, log: this.log });
    }
    const attempt = startAttempt(job, model.model_hash, {
      engine: this.options.engine,
      send,
      live: () => session.phase === "admitted",
      die: this.options.die ?? (() => session.ws.terminate()),
      log: this.log,
      signer: this.signer,
      now: this.now,
      produced: (tokens) => {
        this.decode.tokens += tokens;
      },
      keep: (receipt, sent) => {
        this.outbox.keep(job, receipt.envelope, receipt.body.terminal_state_ts_unix_ms, sent ? session : null);
        if (!sent) this.flushOutbox(); // the attempt's session is gone, but a newer one may be up already
      },
    });
    session.jobs.set(key, attempt);
    void attempt.done.then(() => {
      session.jobs.delete(key);
      this.rememberEnded(key, attempt);
    });
  }

  /**
   * Attempts that sent `end`, kept until settled (at most ENDED_KEPT, oldest dropped first): a `cancel`
   * that crossed the `end` is answered with a receipt for the prefix the buyer received.
   */
  private rememberEnded(key: string, attempt: Attempt): void {
    this.ended.delete(key);
    this.ended.set(key, attempt);
    if (this.ended.size > ENDED_KEPT) this.ended.delete(this.ended.keys().next().value as string);
  }

  private onCancel(session: Session, frame: CancelFrame): void {
    const ids = { request_id: frame.request_id, attempt_n: frame.attempt_n };
    this.log("cancel_received", { ...ids, reason: frame.reason });
    this.events.emit("cancel", frame.request_id, frame.attempt_n, frame.reason);
    const attempt = session.jobs.get(jobKey(frame)) ?? this.ended.get(jobKey(frame));
    if (!attempt) return this.log("frame_ignored", { type: "cancel", ...ids, why: "unknown_job" });
    // A cancel that crossed our `end`: the buyer got only a prefix, and the gateway waits (until its
    // pending deadline) for a receipt bound to it, which replaces the full one in the outbox.
    const receipt = attempt.receiptAfterEnd(frame.reason, frame.delivered_output_bytes);
    if (receipt === null) return attempt.cancel(frame.reason, frame.delivered_output_bytes);
    this.log("cancel_after_end", { ...ids, reason: frame.reason, delivered_output_bytes: frame.delivered_output_bytes });
    if (receipt.deliveredNothing) return; // the gateway settles it zero_settled without a receipt
    const sent = this.send(session, { type: "receipt", ...ids, receipt: receipt.envelope }) !== false;
    this.outbox.keep(frame, receipt.envelope, receipt.body.terminal_state_ts_unix_ms, sent ? session : null);
  }
}

/** Starts the runtime: it connects at once and keeps a session up until stop(). */
export function startProviderRuntime(options: ProviderRuntimeOptions): ProviderRuntime {
  const runtime = new Runtime(options);
  runtime.connect();
  return runtime;
}
