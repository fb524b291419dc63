// Shared helpers of the openai engine tests: run one job on an engine and record what it relayed.
import type { Engine, EngineChunk, EngineOutcome } from "../../src/provider/engine.ts";
import type { JobFrame } from "../../src/wire/frames.ts";
import { makeJob, withTimeout } from "./fake-gateway.ts";

export interface EngineRun {
  outcome: EngineOutcome;
  chunks: EngineChunk[];
  accepted: boolean;
  text: string;
  ms: number;
}

export interface RunOptions {
  job?: Partial<JobFrame>;
  /** Aborts the job's signal (as a gateway cancel) with `reason` after this many chunks (0 = at once). */
  cancelAfter?: { chunks: number; reason: string } | { ms: number; reason: string };
  /** Fails the test when the engine has not returned by then. */
  boundMs?: number;
}

/** Runs one job and resolves with the outcome and every emitted chunk. */
export async function runJob(engine: Engine, options: RunOptions = {}): Promise<EngineRun> {
  const controller = new AbortController();
  const chunks: EngineChunk[] = [];
  let accepted = false;
  const cancel = options.cancelAfter;
  if (cancel && "ms" in cancel) setTimeout(() => controller.abort(cancel.reason), cancel.ms);
  if (cancel && "chunks" in cancel && cancel.chunks === 0) controller.abort(cancel.reason);
  const started = performance.now();
  const outcome = await withTimeout(
    engine.run({
      job: makeJob({ model_id: "test-model", ...options.job }),
      signal: controller.signal,
      accept: () => void (accepted = true),
      emit: (chunk) => {
        if (controller.signal.aborted) return; // as the runtime does: nothing after a cancel
        accepted = true;
        chunks.push(chunk);
        if (cancel && "chunks" in cancel && chunks.length === cancel.chunks) controller.abort(cancel.reason);
      },
      die: () => {
        throw new Error("the openai engine never calls die()");
      },
    }),
    options.boundMs ?? 5000,
    "the engine to return",
  );
  return { outcome, chunks, accepted, text: chunks.map((c) => c.content ?? "").join(""), ms: performance.now() - started };
}

export const ended = (run: EngineRun) => (run.outcome.kind === "ended" ? run.outcome.result : null);
