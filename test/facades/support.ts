// Facade test support: a real gateway with the facades enabled, and an in-process provider runtime
// (a real WebSocket session) running the synthetic engine while recording every job it receives, so
// tests can assert exactly what reached the provider.
import { join } from "node:path";
import { loadOrCreateProviderKey } from "../../src/provider/keys.ts";
import { startProviderRuntime, type ProviderRuntime } from "../../src/provider/runtime.ts";
import { createSyntheticEngine } from "../../src/provider/synthetic.ts";
import type { Engine } from "../../src/provider/engine.ts";
import type { JobFrame } from "../../src/wire/frames.ts";
import { modelHash, type TestGateway } from "../support/harness.ts";

export interface RecordingProvider {
  runtime: ProviderRuntime;
  /** Every job received, in order. */
  jobs: JobFrame[];
  /** The job of one gateway request id (its first attempt). */
  jobOf(requestId: string): JobFrame | undefined;
  stop(): Promise<void>;
}

export async function startRecordingProvider(gw: TestGateway, id: string, models = ["test-model"]): Promise<RecordingProvider> {
  const jobs: JobFrame[] = [];
  // Tokens apart (not all at once, which would leave as one merged chunk): clients see a real stream.
  const synthetic = createSyntheticEngine({ tokensPerSecond: 2000 });
  const engine: Engine = {
    name: "recording-synthetic",
    run: (job) => {
      jobs.push(job.job);
      return synthetic.run(job);
    },
  };
  const key = await loadOrCreateProviderKey(join(gw.dataDir, "provider-keys", `${id}.key`));
  const runtime = startProviderRuntime({
    gatewayUrl: gw.wsUrl,
    providerId: id,
    key,
    engine,
    models: models.map((m) => ({ model_id: m, model_hash: modelHash(m), max_context_tokens: 8192 })),
    maxConcurrency: 4,
    backoff: { minMs: 50, maxMs: 200 },
  });
  return {
    runtime,
    jobs,
    jobOf: (requestId) => jobs.find((j) => j.request_id === requestId),
    stop: () => runtime.stop(),
  };
}

export interface SseEvent {
  event: string | null;
  data: string;
}

/** Parses a whole text/event-stream body into its events (test-side, independent of any SDK). */
export function parseSse(text: string): SseEvent[] {
  const events: SseEvent[] = [];
  for (const block of text.split("\n\n")) {
    if (block.trim() === "") continue;
    let event: string | null = null;
    const data: string[] = [];
    for (const line of block.split("\n")) {
      if (line.startsWith("event: ")) event = line.slice(7);
      else if (line.startsWith("data: ")) data.push(line.slice(6));
    }
    events.push({ event, data: data.join("\n") });
  }
  return events;
}
