// One job attempt on the provider side: accepted → chunk (seq 0, 1, …) → end, or declined.
// The attempt owns the protocol invariants; the engine only produces content. Every `end` is followed
// by a `receipt` frame with the signed v0.4 receipt binding what the gateway can have delivered (docs/receipts.md).
import type { ReceiptSigner } from "../receipts/index.ts";
import type { CancelFrame, ChunkFrame, DeclineCode, JobFrame, ProviderFrame, TerminalState } from "../wire/frames.ts";
import type { Engine, EngineChunk, EngineOutcome, EngineResult } from "./engine.ts";
import type { LogFn } from "./events.ts";
import { issueReceipt, observedInputTokens, type IssuedReceipt } from "./receipts.ts";

export interface AttemptDeps {
  engine: Engine;
  /**
   * Sends a frame on the attempt's session. Returns false when it could not be handed to the socket
   * (session closed): such a chunk never reached the gateway, so no receipt may bind it.
   */
  send(frame: ProviderFrame): boolean | void;
  /** False once the session is gone: then nothing more is sent for this attempt. */
  live(): boolean;
  die(): void;
  log: LogFn;
  /** Signs the attempt's receipt; without one, `end` carries none (tests of the bare protocol). */
  signer?: ReceiptSigner;
  /** Wall clock for the receipt's timestamps. */
  now?: () => number;
  /**
   * A receipt that matters (something was delivered) and may not have reached the gateway: `sent`
   * says whether it went out in `end` on the live session. The runtime keeps it until settled.
   */
  keep?(receipt: IssuedReceipt, sent: boolean): void;
  /** Output tokens just sent (the runtime's decode rate for heartbeats). */
  produced?(tokens: number): void;
}

export interface Attempt {
  /**
   * Gateway cancel: the engine stops; `end` carries `reason` as its terminal state and a receipt that
   * binds exactly the chunks within `deliveredOutputBytes`.
   */
  cancel(reason: CancelFrame["reason"], deliveredOutputBytes?: number): void;
  /**
   * A `cancel` that crossed this attempt's `end` (docs/protocol.md): the receipt binding the prefix the
   * buyer received (the chunks within `deliveredOutputBytes`), with the cancel's reason as its terminal
   * state. Null unless the attempt already sent `end` uncancelled, or without a signer.
   */
  receiptAfterEnd(reason: CancelFrame["reason"], deliveredOutputBytes: number): IssuedReceipt | null;
  /** The session is lost: stop work, send nothing. */
  abandon(): void;
  /** Settles when the engine has returned and the last frame was sent. */
  readonly done: Promise<void>;
  /** Output tokens sent so far, and the job's cap (the heartbeat's load report). */
  progress(): { sentTokens: number; maxTokens: number };
}

/** Sends `declined` for a job the runtime will not run. */
export function declineJob(job: JobFrame, code: DeclineCode, deps: Pick<AttemptDeps, "send" | "log">): void {
  deps.log("job_declined", { request_id: job.request_id, attempt_n: job.attempt_n, code });
  deps.send({ type: "declined", request_id: job.request_id, attempt_n: job.attempt_n, code });
}

/** The most content one merged chunk frame carries (UTF-16 units: at most 192 KiB of UTF-8). */
const MAX_FRAME_CONTENT_CHARS = 64 * 1024;

function providerError(): EngineResult {
  return { terminal_state: "provider_error", finish_reason: null, usage: { input_tokens: 0, output_tokens: 0 } };
}

/** Starts running `job` on the engine at once. */
export function startAttempt(job: JobFrame, modelHash: string, deps: AttemptDeps): Attempt {
  const ids = { request_id: job.request_id, attempt_n: job.attempt_n };
  const controller = new AbortController();
  const signal = controller.signal;
  let cancelReason: CancelFrame["reason"] | null = null;
  let cancelBytes: number | null = null;
  let accepted = false;
  /** The engine's prompt-token count once `end` went out uncancelled: a crossing cancel's receipt uses it. */
  let endedInputTokens: number | null = null;
  let nextSeq = 0;
  let sentTokens = 0;
  // What reached the socket, kept until the end: a cancel binds a prefix of it (chunksWithinBytes).
  const sent: EngineChunk[] = [];
  const now = deps.now ?? Date.now;

  const sign = (terminal_state: TerminalState, finish_reason: string | null, inputTokens: number, bytes: number | null, at = now()) => {
    if (!deps.signer) return null;
    try {
      return issueReceipt(deps.signer, {
        job,
        modelHash,
        sent,
        terminal_state,
        finish_reason,
        cancelDeliveredBytes: bytes,
        engineInputTokens: inputTokens,
        terminalAtMs: at,
        issuedAtMs: at,
      });
    } catch (error) {
      // A bug, never an expected failure; the end still goes out (the gateway quarantines: no_receipt).
      deps.log("receipt_error", { ...ids, error: error instanceof Error ? error.name : typeof error });
      return null;
    }
  };

  const accept = () => {
    if (accepted) return;
    accepted = true;
    deps.send({ type: "accepted", ...ids, model_hash: modelHash });
  };
  // Deltas the engine emits in one synchronous run (in practice: one upstream read) leave as one chunk
  // frame, sent from a microtask: a backlog costs both hops one frame per read instead of one per
  // token, and no delta waits for a timer. Only content merges, never across the max_tokens cap (the
  // gateway cuts at the first chunk past it), and a frame stays far below the wire's 1 MiB limit.
  let pending: ChunkFrame | null = null;
  const flush = () => {
    const frame = pending;
    if (frame === null) return;
    pending = null;
    if (signal.aborted) return; // nothing after a cancel: the receipt binds the delivered prefix
    sentTokens += frame.tokens;
    deps.produced?.(frame.tokens);
    if (deps.send(frame) === false) return;
    // The frame itself is kept: it holds the chunk's content, tool_calls and tokens, and is never changed.
    sent.push(frame);
  };
  const merges = (frame: ChunkFrame, chunk: EngineChunk, tokens: number) =>
    frame.content !== undefined &&
    frame.tool_calls === undefined &&
    chunk.content !== undefined &&
    chunk.tool_calls === undefined &&
    frame.content.length + chunk.content.length <= MAX_FRAME_CONTENT_CHARS &&
    sentTokens + frame.tokens + tokens <= job.params.max_tokens;
  const emit = (chunk: EngineChunk) => {
    if (signal.aborted) return; // nothing after a cancel: the receipt binds the delivered prefix
    accept();
    const tokens = Math.max(0, Math.floor(chunk.tokens));
    if (pending !== null && merges(pending, chunk, tokens)) {
      pending.content += chunk.content!;
      pending.tokens += tokens;
      return;
    }
    // While a frame is pending its flush is already queued: it will send the frame made below instead.
    if (pending !== null) flush();
    else queueMicrotask(flush);
    // This key order is the one src/wire/chunkEncode.ts writes (no spread: this runs per token).
    const frame: ChunkFrame = { type: "chunk", request_id: ids.request_id, attempt_n: ids.attempt_n, seq: nextSeq++, tokens };
    // Absent keys, not undefined values: msgpackr would encode undefined as an extension type.
    if (chunk.content !== undefined) frame.content = chunk.content;
    if (chunk.tool_calls !== undefined) frame.tool_calls = chunk.tool_calls;
    pending = frame;
  };

  // The session was lost before `end` could go out. The gateway records such an attempt as its own
  // cancel's reason when it had cancelled, else as a provider_error, with finish_reason null and what
  // it relayed (src/gateway/settlements.ts `released`). The receipt binds the same: the cancel's
  // prefix, or every chunk that reached the socket. It is handed to the runtime for a later session.
  const lost = (outcome: EngineOutcome) => {
    if (!accepted) return;
    const inputTokens = outcome.kind === "ended" ? outcome.result.usage.input_tokens : 0;
    const receipt =
      cancelReason !== null
        ? sign(cancelReason, null, inputTokens, cancelBytes)
        : sign("provider_error", null, inputTokens, null);
    if (receipt === null || receipt.deliveredNothing) return; // settled zero_settled without a receipt
    deps.log("receipt_held", { ...ids, reason: "session_lost" });
    deps.keep?.(receipt, false);
  };

  const finish = (outcome: EngineOutcome) => {
    flush();
    if (!deps.live()) return lost(outcome);
    if (outcome.kind === "declined" && !accepted) return declineJob(job, outcome.code, deps);
    // Declining after accepting is an engine bug: the attempt ends as a provider error.
    const result = outcome.kind === "ended" ? outcome.result : providerError();
    accept(); // `end` never comes out of turn, even when the engine accepted nothing
    const terminal_state = cancelReason ?? result.terminal_state;
    // finish_reason is a string for normal_done (docs/protocol.md); a cancelled attempt has none.
    let finish_reason = cancelReason !== null ? null : result.finish_reason;
    if (terminal_state === "normal_done") finish_reason ??= "stop";
    // Usage reports what was actually sent: the gateway checks output tokens against delivered chunks.
    // Input is capped at the gateway's own bound for the prompt, as in the receipt.
    const usage = { input_tokens: observedInputTokens(job, result.usage.input_tokens), output_tokens: sentTokens };
    const terminalAtMs = now();
    // `end` goes out first and the receipt right after it in a `receipt` frame (docs/protocol.md): the buyer's
    // response waits on `end` only, not on signing here nor on the gateway's judging there.
    const endSent = deps.send({ type: "end", ...ids, terminal_state, finish_reason, usage }) !== false;
    const receipt = sign(terminal_state, finish_reason, result.usage.input_tokens, cancelReason !== null ? cancelBytes : null, terminalAtMs);
    if (endSent && cancelReason === null) endedInputTokens = result.usage.input_tokens;
    const delivered = endSent && receipt !== null && deps.send({ type: "receipt", ...ids, receipt: receipt.envelope }) !== false;
    deps.log("job_ended", { ...ids, terminal_state, finish_reason, chunks: nextSeq, ...usage, receipt: receipt !== null });
    if (receipt !== null && !receipt.deliveredNothing) deps.keep?.(receipt, delivered);
  };

  // `new Promise` so that an engine throwing synchronously is handled like a rejection.
  const running = new Promise<EngineOutcome>((resolve) => {
    // A dying provider has sent what it emitted before (fault injection: chunks, then no end).
    const die = () => {
      flush();
      deps.die();
    };
    resolve(deps.engine.run({ job, signal, accept, emit, die }));
  });
  const done = running
    .catch((error: unknown): EngineOutcome => {
      // Only the error's class: an engine's message may quote upstream text, which may quote the prompt.
      deps.log("engine_error", { ...ids, error: error instanceof Error ? error.name : typeof error });
      return { kind: "ended", result: providerError() };
    })
    .then(finish)
    .catch(() => deps.log("attempt_error", ids));

  return {
    cancel(reason, deliveredOutputBytes) {
      if (cancelReason !== null || signal.aborted || endedInputTokens !== null) return;
      cancelReason = reason;
      // Without a byte count (never from the wire: the schema requires it) nothing is claimed as delivered.
      cancelBytes = deliveredOutputBytes ?? 0;
      controller.abort(reason);
    },
    receiptAfterEnd(reason, deliveredOutputBytes) {
      if (endedInputTokens === null) return null;
      return sign(reason, null, endedInputTokens, deliveredOutputBytes);
    },
    abandon() {
      controller.abort("session_closed");
    },
    done,
    progress: () => ({ sentTokens, maxTokens: job.params.max_tokens }),
  };
}
