// Public face of the reference provider runtime (docs/operator.md `gateway provider`, docs/protocol.md).
export type { Engine, EngineChunk, EngineJob, EngineOutcome, EngineResult } from "./engine.ts";
export type { LogFn, RuntimeEvents } from "./events.ts";
export { loadOrCreateProviderKey, type ProviderKey } from "./keys.ts";
export { startProviderRuntime, type ProviderRuntime, type ProviderRuntimeOptions, type Timers } from "./runtime.ts";
export {
  createSyntheticEngine,
  estimateInputTokens,
  parseSyntheticFault,
  syntheticPlan,
  syntheticText,
  type SyntheticFault,
  type SyntheticOptions,
} from "./synthetic.ts";
export { PROVIDER_USAGE, runProviderCommand, type CommandIo } from "./cli.ts";
export { issueReceipt, observedInputTokens, boundChunks, type AttemptEnding, type IssuedReceipt } from "./receipts.ts";
export { ReceiptOutbox, DEFAULT_RECEIPT_DEADLINE_MS, type ReceiptOutboxOptions } from "./outbox.ts";
export { createEarningsLog, readEarnings, summarizeEarnings, earningsPathFor, type EarningRecord, type EarningsSummary } from "./earnings.ts";
export {
  catalogModels,
  catalogUrlsFor,
  createCatalogWatcher,
  DEFAULT_CATALOG_REFRESH_MS,
  type CatalogStatus,
  type CatalogWatcher,
  type CatalogWatcherOptions,
} from "./catalogFeed.ts";
