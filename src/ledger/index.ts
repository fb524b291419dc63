// Money (docs/ledger.md): pure pricing and split rules, the rate card, and the ledger audit.
export {
  BPS_DENOMINATOR,
  debitCredits,
  observedBilling,
  priceUsage,
  PROVIDER_SHARE_BPS,
  reservationCredits,
  splitDebit,
  type Charge,
  type MoneyResult,
  type Rates,
} from "./money.ts";
export {
  buildRateCard,
  DEFAULT_CREDITS_PER_MILLION,
  DEFAULT_ROW,
  DEFAULT_USD_PER_MILLION_CREDITS,
  rateCardBody,
  rateCardHandler,
  RateRowConfig,
  rowFor,
  type RateCard,
  type RateCardBody,
  type RateCardRowBody,
  type RateRow,
} from "./rateCard.ts";
export {
  auditLedger,
  catalogLookupFrom,
  type AuditCatalog,
  type AuditFinding,
  type AuditFindingKind,
  type AuditReport,
  type CatalogLookup,
} from "./audit.ts";
