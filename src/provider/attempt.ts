// One job attempt on the provider side: accepted → chunk (seq 0, 1, …) → end, or declined.
// The attempt owns the protocol invariants; the engine only produces content.
import type { CancelFrame, ChunkFrame, DeclineCode, JobFrame, ProviderFrame } from "../wire/frames.ts";
import type { Engine, EngineChunk, EngineOutcome, EngineResult } from "./engine.ts";
import type { LogFn } from "./events.ts";

export interface AttemptDeps {
  engine: Engine;
  /** Sends a frame on the attempt's session (a no-op once the session is closed). */
  send(frame: ProviderFrame): void;
  /** False once the session is gone: then nothing more is sent for this attempt. */
  live(): boolean;
  die(): void;
  log: LogFn;
}

export interface Attempt {
  /** Gateway cancel: the engine stops; `end` carries `reason` as its terminal state. */
  cancel(reason: CancelFrame["reason"]): void;
  /** The session is lost: stop work, send nothing. */
  abandon(): void;
  /** Settles when the engine has returned and the last frame was sent. */
  readonly done: Promise<void>;
}

/** Sends `declined` for a job the runtime will not run. */
export function declineJob(job: JobFrame, code: DeclineCode, deps: Pick<AttemptDeps, "send" | "log">): void {
  deps.log("job_declined", { request_id: job.request_id, attempt_n: job.attempt_n, code });
  deps.send({ type: "declined", request_id: job.request_id, attempt_n: job.attempt_n, code });
}

function providerError(): EngineResult {
  return { terminal_state: "provider_error", finish_reason: null, usage: { input_tokens: 0, output_tokens: 0 } };
}

/** Starts running `job` on the engine at once. */
export function startAttempt(job: JobFrame, modelHash: string, deps: AttemptDeps): Attempt {
  const ids = { request_id: job.request_id, attempt_n: job.attempt_n };
  const controller = new AbortController();
  const signal = controller.signal;
  let cancelReason: CancelFrame["reason"] | null = null;
  let accepted = false;
  let nextSeq = 0;
  let sentTokens = 0;

  const accept = () => {
    if (accepted) return;
    accepted = true;
    deps.send({ type: "accepted", ...ids, model_hash: modelHash });
  };
  const emit = (chunk: EngineChunk) => {
    if (signal.aborted) return; // nothing after a cancel: the receipt binds the delivered prefix
    accept();
    const tokens = Math.max(0, Math.floor(chunk.tokens));
    const frame: ChunkFrame = { type: "chunk", ...ids, seq: nextSeq++, tokens };
    // Absent keys, not undefined values: msgpackr would encode undefined as an extension type.
    if (chunk.content !== undefined) frame.content = chunk.content;
    if (chunk.tool_calls !== undefined) frame.tool_calls = chunk.tool_calls;
    sentTokens += tokens;
    deps.send(frame);
  };

  const finish = (outcome: EngineOutcome) => {
    if (!deps.live()) return;
    if (outcome.kind === "declined" && !accepted) return declineJob(job, outcome.code, deps);
    // Declining after accepting is an engine bug: the attempt ends as a provider error.
    const result = outcome.kind === "ended" ? outcome.result : providerError();
    accept(); // `end` never comes out of turn, even when the engine accepted nothing
    const terminal_state = cancelReason ?? result.terminal_state;
    // finish_reason is a string for normal_done (DESIGN §3); a cancelled attempt has none.
    let finish_reason = cancelReason !== null ? null : result.finish_reason;
    if (terminal_state === "normal_done") finish_reason ??= "stop";
    // Usage reports what was actually sent: the gateway checks output tokens against delivered chunks.
    const usage = { input_tokens: Math.max(0, Math.floor(result.usage.input_tokens)), output_tokens: sentTokens };
    deps.send({ type: "end", ...ids, terminal_state, finish_reason, usage });
    deps.log("job_ended", { ...ids, terminal_state, finish_reason, chunks: nextSeq, ...usage });
  };

  // `new Promise` so that an engine throwing synchronously is handled like a rejection.
  const running = new Promise<EngineOutcome>((resolve) => {
    resolve(deps.engine.run({ job, signal, accept, emit, die: deps.die }));
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
    cancel(reason) {
      if (cancelReason !== null || signal.aborted) return;
      cancelReason = reason;
      controller.abort(reason);
    },
    abandon() {
      controller.abort("session_closed");
    },
    done,
  };
}
