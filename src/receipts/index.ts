// Receipts v0.4 (docs/receipts.md): canonical JSON, the hashes a receipt binds, the envelope, the provider's
// signer and the gateway's pure verifier. Nothing here does I/O besides node:crypto and WebCrypto.
export { canonicalBytes, canonicalize, JcsError, MAX_JCS_DEPTH } from "./jcs.ts";
export {
  accountScope,
  chunksWithinBytes,
  DeliveredPrefixBuilder,
  deliveredNothing,
  deliveredPrefixOf,
  jcsSha256,
  outputHash,
  outputTokenBound,
  OUTPUT_TOKEN_ALLOWANCE,
  promptHash,
  promptTokenBound,
  receiptKeyId,
  routeSnapshotDigest,
  sha256Hex,
  ToolCallAssembler,
  toolCallDeltaBytes,
  type DeliveredChunk,
  type DeliveredPrefix,
  type DeliveredToolCall,
  type OutputHashInput,
} from "./hashes.ts";
export {
  hasReceiptFieldSet,
  RECEIPT_FIELDS,
  RECEIPT_USAGE_FIELDS,
  RECEIPT_VERSION,
  ReceiptBody,
  receiptBodyChecker,
  ReceiptUsage,
  SETTLEMENT_POLICY_VERSION,
  SIGNATURE_KEY_ALG,
  SnapshotMode,
} from "./schema.ts";
export {
  encodeEnvelope,
  MAX_ENVELOPE_CHARS,
  parseEnvelope,
  verifySignature,
  verifySignatureAsync,
  type EnvelopeError,
  type ParsedEnvelope,
  type ParseEnvelopeResult,
} from "./envelope.ts";
export { jobRouteOf, ROUTE_SNAPSHOT_VERSION, RouteSnapshot, routeSnapshotChecker, snapshotDigest } from "./snapshot.ts";
export { createReceiptSigner, type ReceiptFacts, type ReceiptSigner } from "./signer.ts";
export {
  checkReceipt,
  ISSUED_AT_TOLERANCE_MS,
  judgeAcceptedMeasurement,
  SETTLEMENT_REASONS,
  verdictWithSignature,
  verifyReceipt,
  type QuarantineReason,
  type ReceiptCheck,
  type ReceiptJudgement,
  type ReceiptVerdict,
  type SettlementReason,
  type VerifyReceiptInput,
} from "./verify.ts";
