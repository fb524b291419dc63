// `gateway ledger audit` (docs/operator.md, issue 4 §9) as a pure function over what the store holds:
// every posting balances and is sealed, every charge matches a receipt that re-verifies against its
// persisted snapshot and the catalog history, and the money columns agree with the entries.
import { routeSnapshotChecker, snapshotDigest, verifyReceipt, type RouteSnapshot } from "../receipts/index.ts";
import { canonicalize } from "../receipts/jcs.ts";
import type { TerminalState } from "../wire/frames.ts";
import type { LedgerAuditData, SettlementRow } from "../store/ledgerTypes.ts";
import { priceUsage } from "./money.ts";

/** What the audit needs of one accepted catalog; injected so the ledger does not depend on catalog storage. */
export interface AuditCatalog {
  body_digest: string;
  models: { model_id: string; model_hash: string }[];
}
export type CatalogLookup = (catalogId: string) => AuditCatalog | undefined;

export type AuditFindingKind =
  | "unsealed_posting"
  | "unbalanced_posting"
  | "posting_without_settlement"
  | "posting_without_verified_receipt"
  | "posting_mismatch"
  | "grant_malformed"
  | "missing_posting"
  | "settlement_amounts"
  | "snapshot_missing"
  | "snapshot_tampered"
  | "snapshot_mismatch"
  | "receipt_missing"
  | "receipt_reverify_failed"
  | "billed_mismatch"
  | "catalog_unknown"
  | "catalog_digest_mismatch"
  | "model_hash_not_in_catalog"
  | "reservation_mismatch"
  | "stale_reservation";

export interface AuditFinding {
  kind: AuditFindingKind;
  request_id?: string;
  attempt_n?: number;
  posting_id?: number;
  detail: string;
}

export interface AuditReport {
  clean: boolean;
  checked: { postings: number; settlements: number; verified_receipts: number; reservations: number };
  totals: { debit_credits: number; provider_credits: number; platform_credits: number; sum_of_all_entries: number };
  findings: AuditFinding[];
}

const key = (request_id: string, attempt_n: number) => `${request_id}\u0000${attempt_n}`;

/** A catalog lookup over stored catalog bodies (the exact signed bytes); unparsable bodies read as unknown. */
export function catalogLookupFrom(
  get: (catalogId: string) => { body: Uint8Array; body_digest: string } | null | undefined,
): CatalogLookup {
  return (catalogId) => {
    const entry = get(catalogId);
    if (!entry) return undefined;
    try {
      const body = JSON.parse(new TextDecoder().decode(entry.body)) as { models?: { model_id?: unknown; model_hash?: unknown }[] };
      const models = (body.models ?? []).flatMap((m) =>
        typeof m.model_id === "string" && typeof m.model_hash === "string" ? [{ model_id: m.model_id, model_hash: m.model_hash }] : [],
      );
      return { body_digest: entry.body_digest, models };
    } catch {
      return undefined;
    }
  };
}

/** The entries a charged settlement must have posted (zero amounts are never written). */
function expectedEntries(s: SettlementRow): Map<string, number> {
  const payer = s.payer === "buyer" ? `buyer:${s.account_id}` : "promotion";
  const m = new Map<string, number>();
  const add = (a: string, n: number) => n !== 0 && m.set(a, (m.get(a) ?? 0) + n);
  add(payer, -s.debit_credits);
  add(`provider:${s.provider_id}`, s.provider_credits);
  add("platform", s.platform_credits);
  return m;
}

function sameEntries(a: Map<string, number>, b: readonly { account_id: string; amount: number }[]): boolean {
  return b.length === a.size && b.every((e) => a.get(e.account_id) === e.amount);
}

/** Runs every check; `clean` is true only when nothing was found. */
export function auditLedger(data: LedgerAuditData, lookup: CatalogLookup): AuditReport {
  const findings: AuditFinding[] = [];
  const find = (f: AuditFinding) => findings.push(f);
  const settlements = new Map(data.settlements.map((s) => [key(s.request_id, s.attempt_n), s]));
  const postingsByAttempt = new Map<string, number>();
  let sumAll = 0;

  for (const p of data.postings) {
    const sum = p.entries.reduce((acc, e) => acc + e.amount, 0);
    sumAll += sum;
    if (!p.sealed) find({ kind: "unsealed_posting", posting_id: p.id, detail: "posting was never sealed" });
    if (p.entries.length < 2 || sum !== 0) {
      find({ kind: "unbalanced_posting", posting_id: p.id, detail: `entries sum to ${sum} over ${p.entries.length} entries` });
    }
    if (p.kind === "grant") {
      const ok = p.entries.every((e) => (e.account_id === "funding" ? e.amount < 0 : e.account_id.startsWith("buyer:") && e.amount > 0));
      if (!ok) find({ kind: "grant_malformed", posting_id: p.id, detail: "a grant moves credits from funding to one buyer only" });
      continue;
    }
    if (p.request_id === null || p.attempt_n === null) continue; // the schema's CHECK forbids it
    const ids = { request_id: p.request_id, attempt_n: p.attempt_n, posting_id: p.id };
    postingsByAttempt.set(key(p.request_id, p.attempt_n), (postingsByAttempt.get(key(p.request_id, p.attempt_n)) ?? 0) + 1);
    const s = settlements.get(key(p.request_id, p.attempt_n));
    if (s === undefined) {
      find({ kind: "posting_without_settlement", ...ids, detail: "no settlement for this posting" });
      continue;
    }
    const chargeable = s.label === "verified" || (s.mode === "observe" && s.label === "quarantined");
    if (!chargeable) find({ kind: "posting_without_verified_receipt", ...ids, detail: `settlement is ${s.label} in ${s.mode} mode` });
    if (!sameEntries(expectedEntries(s), p.entries)) {
      find({ kind: "posting_mismatch", ...ids, detail: "entries differ from the settlement's debit and credits" });
    }
  }

  let verifiedReceipts = 0;
  const totals = { debit_credits: 0, provider_credits: 0, platform_credits: 0 };
  for (const s of data.settlements) {
    const ids = { request_id: s.request_id, attempt_n: s.attempt_n };
    totals.debit_credits += s.debit_credits;
    totals.provider_credits += s.provider_credits;
    totals.platform_credits += s.platform_credits;

    const priced = priceUsage(s.billed_prompt_tokens, s.billed_completion_tokens, s.rates);
    const amountsOk =
      priced.ok &&
      priced.charge.debit_credits === s.debit_credits &&
      priced.charge.provider_credits === s.provider_credits &&
      priced.charge.platform_credits === s.platform_credits;
    if (!amountsOk) find({ kind: "settlement_amounts", ...ids, detail: "debit or split differs from billed tokens × route-time rates" });
    const postings = postingsByAttempt.get(key(s.request_id, s.attempt_n)) ?? 0;
    if (s.debit_credits > 0 && postings !== 1) find({ kind: "missing_posting", ...ids, detail: `charged ${s.debit_credits} credits with ${postings} postings` });

    // The snapshot: present, untouched (its digest still matches), and the one the rates came from.
    if (s.snapshot_json === null || s.snapshot_digest === null) {
      find({ kind: "snapshot_missing", ...ids, detail: "no route snapshot" });
      continue;
    }
    let snapshot: RouteSnapshot | null = null;
    try {
      const parsed: unknown = JSON.parse(s.snapshot_json);
      if (routeSnapshotChecker.Check(parsed) && canonicalize(parsed) === s.snapshot_json) snapshot = parsed;
    } catch {
      snapshot = null;
    }
    if (snapshot === null || snapshotDigest(snapshot) !== s.snapshot_digest) {
      find({ kind: "snapshot_tampered", ...ids, detail: "snapshot text does not match its digest or schema" });
      continue;
    }
    if (
      snapshot.provider_id !== s.provider_id ||
      snapshot.prompt_credits_per_million !== s.rates.prompt_credits_per_million ||
      snapshot.completion_credits_per_million !== s.rates.completion_credits_per_million ||
      snapshot.provider_share_bps !== s.rates.provider_share_bps ||
      snapshot.route_snapshot_mode !== s.mode
    ) {
      find({ kind: "snapshot_mismatch", ...ids, detail: "settlement row differs from its route snapshot" });
    }

    if (s.label !== "verified") continue;
    if (s.receipt === null || s.delivered === null || s.receipt_received_at_ms === null) {
      find({ kind: "receipt_missing", ...ids, detail: "verified without a stored receipt and delivered record" });
      continue;
    }
    verifiedReceipts++;
    const verdict = verifyReceipt({
      envelope: s.receipt,
      sessionPublicKey: new Uint8Array(Buffer.from(snapshot.provider_public_key, "base64")),
      snapshot,
      snapshotDigest: s.snapshot_digest,
      acceptedModelHash: s.accepted_model_hash,
      // Rows written before tool-call bytes were kept have none: the verifier then bounds as it did.
      delivered: { ...s.delivered, terminal_state: s.delivered.terminal_state as TerminalState, tool_call_bytes: s.delivered.tool_call_bytes ?? undefined },
      promptTokenBound: snapshot.prompt_token_bound,
      requestStartMs: snapshot.request_started_at_unix_ms,
      arrivalMs: s.receipt_received_at_ms,
      expected: { request_id: s.request_id, attempt_n: s.attempt_n, provider_id: s.provider_id, account_scope: snapshot.account_scope },
    });
    if (verdict.label !== "verified") {
      find({ kind: "receipt_reverify_failed", ...ids, detail: verdict.reason });
      continue;
    }
    const usage = verdict.receipt.usage;
    if (
      s.mode === "enforce" &&
      (s.billed_prompt_tokens !== usage.billable_input_tokens || s.billed_completion_tokens !== usage.billable_output_tokens)
    ) {
      find({ kind: "billed_mismatch", ...ids, detail: "billed tokens differ from the receipt's billable usage" });
    }
    const catalog = lookup(snapshot.catalog_id);
    if (catalog === undefined) {
      find({ kind: "catalog_unknown", ...ids, detail: `catalog ${snapshot.catalog_id} is not in the history` });
    } else if (catalog.body_digest !== snapshot.catalog_body_digest) {
      find({ kind: "catalog_digest_mismatch", ...ids, detail: `catalog ${snapshot.catalog_id} digest differs` });
    } else if (!catalog.models.some((m) => m.model_id === verdict.receipt.model_id && m.model_hash === verdict.receipt.model_hash)) {
      find({ kind: "model_hash_not_in_catalog", ...ids, detail: `${verdict.receipt.model_id} with that hash is not in ${snapshot.catalog_id}` });
    }
  }

  for (const r of data.reservations) {
    const attempts = data.settlements.filter((s) => s.request_id === r.request_id);
    const used = attempts.reduce((acc, s) => acc + s.debit_credits, 0);
    if (r.state === "finalised" && r.used_credits !== used) {
      find({ kind: "reservation_mismatch", request_id: r.request_id, detail: `used ${r.used_credits} ≠ settled debits ${used}` });
    }
    if (r.state === "held" && r.request_ended && attempts.every((s) => s.label !== "pending")) {
      find({ kind: "stale_reservation", request_id: r.request_id, detail: "held after every attempt settled" });
    }
  }

  return {
    clean: findings.length === 0,
    checked: {
      postings: data.postings.length,
      settlements: data.settlements.length,
      verified_receipts: verifiedReceipts,
      reservations: data.reservations.length,
    },
    totals: { ...totals, sum_of_all_entries: sumAll },
    findings,
  };
}
