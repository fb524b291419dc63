// The signed catalog feed (docs/catalog.md): public face of src/catalog/.
export * from "./schema.ts";
export {
  DEFAULT_VALIDITY_MS,
  buildCatalogBody,
  catalogBodyDigest,
  compareUtf8,
  decodeSignature,
  encodeCatalogBody,
  formatInstant,
  isExpiredAt,
  newCatalogId,
  parseInstant,
  signCatalogBody,
  verifyCatalogFeed,
  type FeedError,
  type FeedErrorCode,
  type FeedResult,
  type VerifiedFeed,
} from "./feed.ts";
export { OPERATOR_KEY_FILE, loadOperatorKey, loadOrCreateOperatorKey, operatorKeyPath, type OperatorKey, type OperatorKeyResult } from "./keys.ts";
export {
  addModel,
  catalogHealth,
  catalogRateCardRows,
  catalogStateFromEntry,
  catalogStateFromFeed,
  eligibleModelIds,
  expectedModelHash,
  hasCapability,
  lookupModel,
  removeModel,
  routeCatalogFields,
  upsertModels,
  type CatalogHealth,
  type CatalogState,
  type CatalogStateResult,
  type ModelsEdit,
  type SignedCatalogRecord,
} from "./state.ts";
export { CatalogHistoryLine, historyLine, parseHistoryLine, type ExportableCatalogEntry, type HistoryLineResult } from "./history.ts";
export { CATALOG_FILE, CATALOG_SIG_FILE, publishCatalogFiles, readCatalogFiles } from "./files.ts";
export { changeCatalog, ensureCatalog, setUpOperatorKey, startCatalog, type CatalogChangeResult, type CatalogWriter, type OperatorKeySetup } from "./operations.ts";
export { CATALOG_POLL_MS, createCatalogLive, pollCatalog, type CatalogLive, type CatalogReload, type PollTimers } from "./live.ts";
export { handleCatalog, handleCatalogPublicKey, handleCatalogSignature, type CatalogHttpSource } from "./http.ts";
export { hashGgufFile, hashSnapshotDirectory, hashWeights, manifestLine, type WeightsErrorCode, type WeightsHashResult } from "./weights.ts";
export { runCatalogCommand, type CatalogCliContext } from "./cli.ts";
