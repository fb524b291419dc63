// Settlements, reservations and the double-entry ledger in SQLite (docs/receipts.md, docs/ledger.md).
// Invariants, each enforced in code inside the transaction and again by the schema (migration 3):
// - every ledger change is one synchronous BEGIN IMMEDIATE transaction (no await inside: bun:sqlite
//   would commit at the first one);
// - the entries of a posting sum to zero (checked here, then by the seal trigger);
// - at most one posting per (request_id, attempt_n) (UNIQUE);
// - a settlement's first terminal outcome is final (guarded UPDATE ... WHERE label = 'pending', and a
//   trigger that refuses any write to a settled row);
// - balances are sums of entries; ledger_account_totals mirrors each sum, kept by a trigger inside
//   the transaction that adds the entries (never written by code).
import type { Database, Statement } from "bun:sqlite";
import { createHash } from "node:crypto";
import { buyerAccount, chargeAllowed, FUNDING_ACCOUNT, payingAccount, PLATFORM_ACCOUNT, PROMOTION_ACCOUNT, providerAccount } from "../ledger/charges.ts";
import { priceUsage, type Charge } from "../ledger/money.ts";
import { heldReservation, toReservation, toSettlement } from "./rowMapping.ts";
import type {
  DeliveredRecord,
  LedgerAccountKind,
  LedgerAuditData,
  LedgerBalance,
  LedgerStore,
  NewAttempt,
  PostingRow,
  ReceiptDisposition,
  ReserveInput,
  ReserveResult,
  SettleInput,
  SettleResult,
  SettlementRates,
  SettlementRow,
} from "./ledgerTypes.ts";

export { buyerAccount, FUNDING_ACCOUNT, PLATFORM_ACCOUNT, PROMOTION_ACCOUNT, providerAccount } from "../ledger/charges.ts";

const isCount = (n: number) => Number.isSafeInteger(n) && n >= 0;

/** A settlements row as SQLite returns it: a SettlementRow with its rates and delivered record as columns. */
type SettlementDbRow = Omit<SettlementRow, "rates" | "delivered" | "receipt"> &
  SettlementRates &
  DeliveredColumns & {
    /** The deciding envelope as stored in the row (settlements settled before migration 8), else null. */
    receipt: string | null;
    /** The deciding envelope's row in the arrival log (receipts_received), and its text from there. */
    receipt_id: number | null;
    receipt_envelope?: string | null;
  };

/** A delivered record as settlement columns (null until the attempt ended). */
interface DeliveredColumns {
  delivered_output_hash: string | null;
  delivered_start_byte: number | null;
  delivered_end_byte: number | null;
  delivered_tokens: number | null;
  delivered_terminal_state: string | null;
  delivered_finish_reason: string | null;
  delivered_tool_calls: number | null;
  delivered_tool_call_bytes: number | null;
  reported_input_tokens: number | null;
}

/** A delivered record as settlement columns, in the order of DELIVERED_COLUMNS. */
const deliveredColumns = (d: DeliveredRecord, ended_at_ms: number, pending_deadline_at_ms: number) => ({
  delivered_output_hash: d.output_hash,
  delivered_start_byte: d.start_byte,
  delivered_end_byte: d.end_byte,
  delivered_tokens: d.tokens,
  delivered_terminal_state: d.terminal_state,
  delivered_finish_reason: d.finish_reason,
  delivered_tool_calls: d.tool_calls_delivered ? 1 : 0,
  delivered_tool_call_bytes: d.tool_call_bytes,
  reported_input_tokens: d.reported_input_tokens,
  ended_at_ms,
  pending_deadline_at_ms,
});
const deliveredValues = (d: DeliveredRecord, ended_at_ms: number, pending_deadline_at_ms: number) =>
  Object.values(deliveredColumns(d, ended_at_ms, pending_deadline_at_ms));

function accountKind(id: string): LedgerAccountKind {
  if (id.startsWith("buyer:")) return "buyer";
  if (id.startsWith("provider:")) return "provider";
  if (id === PLATFORM_ACCOUNT || id === PROMOTION_ACCOUNT || id === FUNDING_ACCOUNT) return id;
  throw new Error(`not a ledger account id: ${id}`);
}

// The settlement's terminal columns, and the delivered record's (written with them when the attempt
// ends and settles at once).
const SETTLE_COLUMNS = `label = ?, reason = ?, receipt = COALESCE(?, receipt), receipt_id = COALESCE(?, receipt_id),
       receipt_received_at_ms = COALESCE(?, receipt_received_at_ms),
       billed_prompt_tokens = ?, billed_completion_tokens = ?,
       debit_credits = ?, provider_credits = ?, platform_credits = ?, settled_at_ms = ?,
       accepted_model_hash = COALESCE(accepted_model_hash, ?)`;
const DELIVERED_COLUMNS = `delivered_output_hash = ?, delivered_start_byte = ?, delivered_end_byte = ?,
       delivered_tokens = ?, delivered_terminal_state = ?, delivered_finish_reason = ?, delivered_tool_calls = ?,
       delivered_tool_call_bytes = ?, reported_input_tokens = ?, ended_at_ms = ?, pending_deadline_at_ms = ?`;

/** What an attempt's charge is priced and posted by, fixed when it opened (recordRouteSnapshot). */
interface AttemptTerms {
  provider_id: string;
  account_id: string;
  payer: NewAttempt["payer"];
  mode: NewAttempt["mode"];
  prompt_credits_per_million: number;
  completion_credits_per_million: number;
  provider_share_bps: number;
  /** Whether its delivered record is written. */
  ended: boolean;
}
const TERMS_COLUMNS = [
  "provider_id",
  "account_id",
  "payer",
  "mode",
  "prompt_credits_per_million",
  "completion_credits_per_million",
  "provider_share_bps",
] as const satisfies readonly (keyof AttemptTerms)[];
const termsValues = (t: AttemptTerms) => TERMS_COLUMNS.map((column) => t[column]);
const SETTLE_WHERE = `request_id = ? AND attempt_n = ? AND label = 'pending' AND ${TERMS_COLUMNS.map((c) => `${c} = ?`).join(" AND ")}`;
/**
 * Attempts this connection opened and has not settled, kept at most this many (the oldest are
 * forgotten first): a forgotten one settles the long way, reading its terms.
 */
const MAX_OPENED = 65_536;

/**
 * Settlement rows with their deciding envelope: a settlement refers to its receipt's row in the arrival
 * log instead of storing the ~2 KB envelope twice (growing each settlement row by it at settle time
 * split its pages; docs/benchmarks.md).
 */
const SELECT_SETTLEMENTS = `SELECT s.*, rr.envelope AS receipt_envelope
  FROM settlements s LEFT JOIN receipts_received rr ON rr.id = s.receipt_id`;

/**
 * The request path's statements, prepared once per connection: each request runs about fifteen, and
 * a lookup in bun:sqlite's query cache per call costs more than keeping them.
 */
function ledgerStatements(db: Database) {
  const ensureStatements = new Map<number, Statement>();
  const entryStatements = new Map<number, Statement>();
  const rowsOf = (n: number) => Array.from({ length: n }, () => "(?, ?, ?)").join(", ");
  return {
    /**
     * Ledger accounts known to exist, filled on first sight: a posting upserts only accounts not in
     * it (an account is never deleted). One a rolled-back transaction created is healed by post().
     */
    knownAccounts: new Set<string>(),
    selectSettlement: db.prepare(`${SELECT_SETTLEMENTS} WHERE s.request_id = ? AND s.attempt_n = ?`),
    // The settlement's terms, read when this connection did not open the attempt (or lost track).
    selectTerms: db.prepare(
      `SELECT label, ${TERMS_COLUMNS.join(", ")}, ended_at_ms IS NOT NULL AS ended FROM settlements WHERE request_id = ? AND attempt_n = ?`,
    ),
    // A conflict on the key is the duplicate the caller is told about; any other constraint still throws.
    insertSnapshot: db.prepare(
      `INSERT INTO route_snapshots (request_id, attempt_n, digest, snapshot, created_at_ms) VALUES (?, ?, ?, ?, ?)
       ON CONFLICT (request_id, attempt_n) DO NOTHING`,
    ),
    insertSettlement: db.prepare(
      `INSERT INTO settlements (request_id, attempt_n, provider_id, account_id, payer, mode,
         prompt_credits_per_million, completion_credits_per_million, provider_share_bps, created_at_ms)
       VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
    ),
    recordAccepted: db.prepare(
      `UPDATE settlements SET accepted_model_hash = ?
        WHERE request_id = ? AND attempt_n = ? AND label = 'pending' AND accepted_model_hash IS NULL`,
    ),
    recordEnd: db.prepare(
      `UPDATE settlements SET ${DELIVERED_COLUMNS}, accepted_model_hash = COALESCE(accepted_model_hash, ?)
        WHERE request_id = ? AND attempt_n = ? AND label = 'pending' AND ended_at_ms IS NULL`,
    ),
    insertReceipt: db.prepare(
      `INSERT INTO receipts_received (request_id, attempt_n, provider_id, envelope, received_at_ms, disposition)
       VALUES (?, ?, ?, ?, ?, ?)`,
    ),
    // The outcome, written only to a pending row with the terms it was priced at (no row otherwise),
    // and the row as written: the settlement needs no read of its own.
    settle: db.prepare(`UPDATE settlements SET ${SETTLE_COLUMNS} WHERE ${SETTLE_WHERE} RETURNING *`),
    // With a delivered record given: kept when one is written already, else written with the outcome.
    settleEnded: db.prepare(`UPDATE settlements SET ${SETTLE_COLUMNS} WHERE ${SETTLE_WHERE} AND ended_at_ms IS NOT NULL RETURNING *`),
    settleWithEnd: db.prepare(`UPDATE settlements SET ${SETTLE_COLUMNS}, ${DELIVERED_COLUMNS} WHERE ${SETTLE_WHERE} AND ended_at_ms IS NULL RETURNING *`),
    insertPosting: db.prepare("INSERT INTO ledger_postings (kind, request_id, attempt_n, memo, created_at_ms) VALUES (?, ?, ?, ?, ?)"),
    // A posting's new accounts and its entries, each one multi-row statement (n rows: a settlement
    // has 3 entries, a grant 2): a statement's run costs about as much as its row.
    ensureAccounts: (n: number) => {
      let statement = ensureStatements.get(n);
      if (statement === undefined) ensureStatements.set(n, (statement = db.prepare(`INSERT OR IGNORE INTO ledger_accounts (id, kind, created_at_ms) VALUES ${rowsOf(n)}`)));
      return statement;
    },
    insertEntries: (n: number) => {
      let statement = entryStatements.get(n);
      if (statement === undefined) entryStatements.set(n, (statement = db.prepare(`INSERT INTO ledger_entries (posting_id, account_id, amount) VALUES ${rowsOf(n)}`)));
      return statement;
    },
    sealPosting: db.prepare("UPDATE ledger_postings SET sealed = 1 WHERE id = ?"),
    // The trigger-kept total (migrations.ts, ledger_account_totals), equal to SUM(amount) of the
    // account's entries: O(1) on the reservation path instead of a scan of the account's history.
    balance: db.prepare("SELECT balance AS b FROM ledger_account_totals WHERE account_id = ?"),
    // What admission checks, in one read: whether the request id is taken, and the buyer's balance and
    // held credits (the trigger-kept sum, migrations.ts, reservation_holds).
    admissionFacts: db.prepare(
      `SELECT EXISTS (SELECT 1 FROM reservations WHERE request_id = ?) AS taken,
              COALESCE((SELECT balance FROM ledger_account_totals WHERE account_id = ?), 0) AS balance,
              COALESCE((SELECT held_credits FROM reservation_holds WHERE account_id = ?), 0) AS held`,
    ),
    // The trigger-kept sum (migrations.ts, reservation_holds) of the account's held buyer reservations.
    heldCredits: db.prepare("SELECT held_credits AS c FROM reservation_holds WHERE account_id = ?"),
    insertReservation: db.prepare(
      `INSERT INTO reservations (request_id, account_id, payer, day, tokens, credits, created_at_ms)
       VALUES (?, ?, ?, ?, ?, ?, ?)`,
    ),
    selectReservation: db.prepare("SELECT * FROM reservations WHERE request_id = ?"),
    markEnded: db.prepare("UPDATE reservations SET request_ended = 1 WHERE request_id = ? AND state = 'held'"),
    endedAndHeld: db.prepare("SELECT 1 FROM reservations WHERE request_id = ? AND state = 'held' AND request_ended = 1"),
    // What the request's settlements charged, and how many are still pending, in one read. Not folded
    // into the resolving UPDATE as `UPDATE … FROM` it: SQLite materialises that subquery on every run,
    // which costs several times the read and the UPDATE (docs/benchmarks.md, "SQL per request pass").
    requestUsage: db.prepare(
      `SELECT COUNT(*) FILTER (WHERE label = 'pending') AS pending,
              COALESCE(SUM(billed_prompt_tokens + billed_completion_tokens), 0) AS tokens,
              COALESCE(SUM(debit_credits), 0) AS credits
         FROM settlements WHERE request_id = ?`,
    ),
    resolveReservation: db.prepare(
      `UPDATE reservations SET state = ?, used_tokens = ?, used_credits = ?, resolved_at_ms = ?
        WHERE request_id = ? AND state = 'held'`,
    ),
  };
}
type LedgerStatements = ReturnType<typeof ledgerStatements>;

/**
 * Writes one sealed posting. Must run inside a transaction. Zero amounts are left out; the rest must
 * sum to zero — a violation is a bug and throws, rolling the whole transaction back.
 */
function post(
  q: LedgerStatements,
  kind: "settlement" | "grant",
  key: { request_id: string; attempt_n: number } | null,
  amounts: readonly (readonly [string, number])[],
  memo: string | null,
  now_ms: number,
): number {
  const merged = new Map<string, number>();
  for (const [account, amount] of amounts) {
    if (!Number.isSafeInteger(amount)) throw new Error(`ledger amount ${amount} is not a safe integer`);
    merged.set(account, (merged.get(account) ?? 0) + amount);
  }
  const entries = [...merged].filter(([, amount]) => amount !== 0);
  // Invariant: entries of one posting sum to zero.
  const sum = entries.reduce((s, [, amount]) => s + amount, 0);
  if (sum !== 0 || entries.length < 2) throw new Error(`unbalanced posting (sum ${sum}, ${entries.length} entries)`);

  const posting_id = Number(q.insertPosting.run(kind, key?.request_id ?? null, key?.attempt_n ?? null, memo, now_ms).lastInsertRowid);
  const accounts = entries.map(([account]) => account);
  ensureAccounts(q, accounts.filter((account) => !q.knownAccounts.has(account)), now_ms);
  const values = entries.flatMap(([account, amount]) => [posting_id, account, amount]);
  try {
    q.insertEntries(entries.length).run(...values);
  } catch (error) {
    // A known account whose creating transaction rolled back (foreign keys are checked at once): the
    // statement alone failed; forget what was known, upsert this posting's accounts and write again.
    if ((error as { code?: string }).code !== "SQLITE_CONSTRAINT_FOREIGNKEY") throw error;
    q.knownAccounts.clear();
    ensureAccounts(q, accounts, now_ms);
    q.insertEntries(entries.length).run(...values);
  }
  // The seal trigger re-checks the sum in SQL; after it, the posting and its entries are immutable.
  q.sealPosting.run(posting_id);
  return posting_id;
}

/** Creates the ledger accounts not yet known to exist (INSERT OR IGNORE), and knows them from now on. */
function ensureAccounts(q: LedgerStatements, accounts: readonly string[], now_ms: number): void {
  if (accounts.length === 0) return;
  q.ensureAccounts(accounts.length).run(...accounts.flatMap((account) => [account, accountKind(account), now_ms]));
  for (const account of accounts) q.knownAccounts.add(account);
}

function settlementEntries(row: SettlementDbRow, charge: Charge): [string, number][] {
  return [
    [payingAccount(row.payer, row.account_id), -charge.debit_credits],
    [providerAccount(row.provider_id), charge.provider_credits],
    [PLATFORM_ACCOUNT, charge.platform_credits],
  ];
}

/** Resolves a request's held reservation once the request ended and none of its attempts is pending. */
function resolveReservationIfDone(q: LedgerStatements, request_id: string, now_ms: number): void {
  if (q.endedAndHeld.get(request_id) !== null) resolveReservationUnlessPending(q, request_id, now_ms);
}

/** Resolves a request's reservation, known to be held and ended, unless one of its attempts is pending. */
function resolveReservationUnlessPending(q: LedgerStatements, request_id: string, now_ms: number): void {
  const used = q.requestUsage.get(request_id) as { pending: number; tokens: number; credits: number };
  if (used.pending > 0) return;
  q.resolveReservation.run(used.tokens > 0 || used.credits > 0 ? "finalised" : "released", used.tokens, used.credits, now_ms, request_id);
}

function tokensCountedOn(db: Database, account_id: string, day: string): number {
  const row = db
    .query(
      `SELECT COALESCE(SUM(CASE state WHEN 'held' THEN tokens WHEN 'finalised' THEN used_tokens ELSE 0 END), 0) AS t
         FROM reservations WHERE account_id = ? AND day = ?`,
    )
    .get(account_id, day) as { t: number };
  return row.t;
}

/** The ledger half of the Store, over an open database. `clock` supplies times not given by the caller. */
export function ledgerStore(db: Database, clock: () => number): LedgerStore {
  const q = ledgerStatements(db);
  const balanceOf = (ledger_account_id: string): number => (q.balance.get(ledger_account_id) as { b: number } | null)?.b ?? 0;
  const heldCredits = (account_id: string): number => (q.heldCredits.get(account_id) as { c: number } | null)?.c ?? 0;
  const selectSettlement = (request_id: string, attempt_n: number) => q.selectSettlement.get(request_id, attempt_n) as SettlementDbRow | null;

  // Transaction wrappers are made once: bun:sqlite's db.transaction() builds four wrapper functions
  // per call. Each runs as BEGIN IMMEDIATE, or as a SAVEPOINT inside an open group commit.
  const recordRouteSnapshotTx = db.transaction((input: NewAttempt, now_ms: number) => {
    const inserted = q.insertSnapshot.run(input.request_id, input.attempt_n, input.digest, input.snapshot_json, now_ms);
    if (inserted.changes === 0) return { ok: false as const, code: "duplicate_attempt" as const };
    q.insertSettlement.run(
      input.request_id,
      input.attempt_n,
      input.provider_id,
      input.account_id,
      input.payer,
      input.mode,
      input.rates.prompt_credits_per_million,
      input.rates.completion_credits_per_million,
      input.rates.provider_share_bps,
      now_ms,
    );
    if (opened.size >= MAX_OPENED) opened.delete(opened.keys().next().value!);
    opened.set(attemptKey(input.request_id, input.attempt_n), {
      provider_id: input.provider_id,
      account_id: input.account_id,
      payer: input.payer,
      mode: input.mode,
      ...input.rates,
      ended: false,
    });
    return { ok: true as const };
  }).immediate;

  // Attempts opened here and not settled yet, by attemptKey: their settlement writes the outcome
  // guarded by the terms kept here (the database's row decides: a row that differs, or none, sends it
  // the long way), so it reads nothing first.
  const opened = new Map<string, AttemptTerms>();
  const attemptKey = (request_id: string, attempt_n: number) => `${attempt_n}:${request_id}`;

  /** Prices and writes the outcome for an attempt with terms `t`; null when no pending row has them. */
  const settleAs = (input: SettleInput, t: AttemptTerms, now_ms: number): SettleResult | null => {
    let charge: Charge | null = null;
    const billed = input.billed ?? null;
    if (billed !== null && (billed.prompt_tokens !== 0 || billed.completion_tokens !== 0)) {
      // The settlement's own rule (src/ledger/charges.ts), checked again where the charge is written.
      if (!chargeAllowed(input.label, t.mode)) return { ok: false, code: "charge_not_allowed" };
      const priced = priceUsage(billed.prompt_tokens, billed.completion_tokens, t);
      if (!priced.ok) return { ok: false, code: "invalid_amount" };
      charge = priced.charge;
    }
    const byArrival = input.receipt?.arrival_id !== undefined;
    const outcome = [
      input.label,
      input.reason,
      byArrival ? null : (input.receipt?.envelope ?? null),
      input.receipt?.arrival_id ?? null,
      input.receipt?.received_at_ms ?? null,
      charge?.prompt_tokens ?? 0,
      charge?.completion_tokens ?? 0,
      charge?.debit_credits ?? 0,
      charge?.provider_credits ?? 0,
      charge?.platform_credits ?? 0,
      now_ms,
      input.accepted_model_hash ?? null,
    ];
    const where = [input.request_id, input.attempt_n, ...termsValues(t)];
    // The delivered record given with the outcome is written by the same UPDATE, unless one was
    // recorded already (the first one wins, as with recordAttemptEnd).
    const ended = input.ended;
    const written = (
      ended === undefined
        ? q.settle.get(...outcome, ...where)
        : t.ended
          ? q.settleEnded.get(...outcome, ...where)
          : q.settleWithEnd.get(...outcome, ...deliveredValues(ended.delivered, ended.ended_at_ms, ended.pending_deadline_at_ms), ...where)
    ) as SettlementDbRow | null;
    if (written === null) return null;
    let posting_id: number | null = null;
    if (charge !== null && charge.debit_credits > 0) {
      posting_id = post(q, "settlement", { request_id: input.request_id, attempt_n: input.attempt_n }, settlementEntries(written, charge), null, now_ms);
    }
    if (input.end_request === true && q.markEnded.run(input.request_id).changes === 1) resolveReservationUnlessPending(q, input.request_id, now_ms);
    else resolveReservationIfDone(q, input.request_id, now_ms);
    return { ok: true, settlement: toSettlement({ ...written, receipt_envelope: byArrival ? input.receipt!.envelope : null }), posting_id };
  };

  const alreadySettled = (input: SettleInput): SettleResult => ({
    ok: false,
    code: "already_settled",
    settlement: toSettlement(selectSettlement(input.request_id, input.attempt_n)!),
  });

  const settleAttemptTx = db.transaction((input: SettleInput, now_ms: number): SettleResult => {
    const key = attemptKey(input.request_id, input.attempt_n);
    const known = opened.get(key);
    if (known !== undefined) {
      opened.delete(key);
      // Anything but a written outcome is decided again the long way, on the row itself.
      const settled = settleAs(input, known, now_ms);
      if (settled?.ok) return settled;
    }
    const row = q.selectTerms.get(input.request_id, input.attempt_n) as (Omit<AttemptTerms, "ended"> & { label: string; ended: number }) | null;
    if (row === null) return { ok: false, code: "unknown_attempt" };
    if (row.label !== "pending") return alreadySettled(input);
    // Unreachable to be null under BEGIN IMMEDIATE (we hold the write lock), kept as the race guard it is.
    return settleAs(input, { ...row, ended: row.ended === 1 }, now_ms) ?? alreadySettled(input);
  }).immediate;

  const reserveTx = db.transaction((input: ReserveInput, now_ms: number): ReserveResult => {
    const facts = q.admissionFacts.get(input.request_id, buyerAccount(input.account_id), input.account_id) as { taken: number; balance: number; held: number };
    if (facts.taken === 1) return { ok: false, code: "duplicate_request" };
    if (input.daily_token_limit !== undefined) {
      const used = tokensCountedOn(db, input.account_id, input.day);
      if (used + input.tokens > input.daily_token_limit) return { ok: false, code: "quota_exhausted", used_tokens: used };
    }
    if (input.payer === "buyer") {
      const available = facts.balance - facts.held;
      if (available < input.credits) return { ok: false, code: "insufficient_balance", available_credits: available };
    }
    q.insertReservation.run(input.request_id, input.account_id, input.payer, input.day, input.tokens, input.credits, now_ms);
    return { ok: true, reservation: heldReservation(input, now_ms) };
  }).immediate;

  const markRequestEndedTx = db.transaction((request_id: string, now_ms: number) => {
    // A changed row is a held reservation now marked ended: no need to read that back.
    if (q.markEnded.run(request_id).changes === 1) resolveReservationUnlessPending(q, request_id, now_ms);
  }).immediate;

  const grantTx = db.transaction((account_id: string, credits: number, memo: string | null, now_ms: number) => {
    const posting_id = post(
      q,
      "grant",
      null,
      [
        [FUNDING_ACCOUNT, -credits],
        [buyerAccount(account_id), credits],
      ],
      memo,
      now_ms,
    );
    return { ok: true as const, posting_id };
  }).immediate;

  return {
    recordRouteSnapshot(input: NewAttempt, now_ms = clock()) {
      // The digest is what the receipt echoes: a row whose text does not hash to it could never settle.
      if (createHash("sha256").update(input.snapshot_json).digest("hex") !== input.digest) {
        return { ok: false as const, code: "digest_mismatch" as const };
      }
      return recordRouteSnapshotTx(input, now_ms);
    },

    getRouteSnapshot(request_id, attempt_n) {
      return db
        .query("SELECT snapshot AS snapshot_json, digest FROM route_snapshots WHERE request_id = ? AND attempt_n = ?")
        .get(request_id, attempt_n) as { snapshot_json: string; digest: string } | null;
    },

    recordAcceptedMeasurement(request_id, attempt_n, model_hash) {
      // `label = 'pending'` keeps a settled row untouched (its trigger would refuse the write anyway).
      return q.recordAccepted.run(model_hash, request_id, attempt_n).changes === 1;
    },

    recordAttemptEnd(request_id, attempt_n, d, pending_deadline_at_ms, now_ms = clock(), accepted_model_hash = null) {
      const written = q.recordEnd.run(...deliveredValues(d, now_ms, pending_deadline_at_ms), accepted_model_hash, request_id, attempt_n).changes === 1;
      const known = opened.get(attemptKey(request_id, attempt_n));
      if (written && known !== undefined) known.ended = true;
      return written;
    },

    recordReceiptArrival(input, now_ms = clock()) {
      return Number(
        q.insertReceipt.run(input.request_id, input.attempt_n, input.provider_id, input.envelope, now_ms, input.disposition satisfies ReceiptDisposition)
          .lastInsertRowid,
      );
    },

    settleAttempt: (input: SettleInput, now_ms = clock()): SettleResult => settleAttemptTx(input, now_ms),

    getSettlement(request_id, attempt_n) {
      const row = selectSettlement(request_id, attempt_n);
      return row === null ? null : toSettlement(row);
    },

    listSettlements(filter = {}) {
      const where: string[] = [];
      const args: string[] = [];
      if (filter.request_id !== undefined) {
        where.push("request_id = ?");
        args.push(filter.request_id);
      }
      if (filter.label !== undefined) {
        where.push("label = ?");
        args.push(filter.label);
      }
      const sql = `${SELECT_SETTLEMENTS} ${where.length ? `WHERE ${where.map((w) => `s.${w}`).join(" AND ")}` : ""}
                    ORDER BY s.created_at_ms, s.request_id, s.attempt_n`;
      return (db.query(sql).all(...args) as SettlementDbRow[]).map(toSettlement);
    },

    reserve(input: ReserveInput, now_ms = clock()): ReserveResult {
      if (!isCount(input.tokens) || !isCount(input.credits)) return { ok: false, code: "invalid_amount" };
      return reserveTx(input, now_ms);
    },

    markRequestEnded(request_id, now_ms = clock()) {
      markRequestEndedTx(request_id, now_ms);
    },

    unendedHeldReservations() {
      return (db.query("SELECT request_id FROM reservations WHERE state = 'held' AND request_ended = 0").all() as { request_id: string }[]).map(
        (r) => r.request_id,
      );
    },

    getReservation(request_id) {
      const row = q.selectReservation.get(request_id) as object | null;
      return row === null ? null : toReservation(row);
    },

    tokensCountedOn: (account_id, day) => tokensCountedOn(db, account_id, day),

    grantCredits(account_id, credits, memo, now_ms = clock()) {
      if (!isCount(credits) || credits === 0) return { ok: false, code: "invalid_amount" };
      return grantTx(account_id, credits, memo ?? null, now_ms);
    },

    ledgerBalance: (id) => balanceOf(id),

    ledgerBalances(): LedgerBalance[] {
      return db
        .query(
          // Summed from the entries themselves (not the kept totals), in one pass over them.
          `SELECT a.id AS account_id, a.kind, COALESCE(e.balance, 0) AS balance
             FROM ledger_accounts a
             LEFT JOIN (SELECT account_id, SUM(amount) AS balance FROM ledger_entries GROUP BY account_id) e ON e.account_id = a.id
            ORDER BY a.id`,
        )
        .all() as LedgerBalance[];
    },

    availableCredits: (account_id) => balanceOf(buyerAccount(account_id)) - heldCredits(account_id),

    ledgerAuditData(): LedgerAuditData {
      // One read transaction: postings, entries and settlements are seen at the same instant.
      return db.transaction(() => {
        const postings = db.query("SELECT * FROM ledger_postings ORDER BY id").all() as (Omit<PostingRow, "sealed" | "entries"> & {
          sealed: number;
        })[];
        const entries = db.query("SELECT posting_id, account_id, amount FROM ledger_entries ORDER BY posting_id, account_id").all() as {
          posting_id: number;
          account_id: string;
          amount: number;
        }[];
        const byPosting = new Map<number, { account_id: string; amount: number }[]>();
        for (const e of entries) {
          const list = byPosting.get(e.posting_id) ?? [];
          list.push({ account_id: e.account_id, amount: e.amount });
          byPosting.set(e.posting_id, list);
        }
        const settlements = (
          db
            .query(
              `SELECT s.*, rr.envelope AS receipt_envelope, r.snapshot AS snapshot_json, r.digest AS snapshot_digest
                 FROM settlements s LEFT JOIN route_snapshots r USING (request_id, attempt_n)
                 LEFT JOIN receipts_received rr ON rr.id = s.receipt_id
                ORDER BY s.created_at_ms, s.request_id, s.attempt_n`,
            )
            .all() as (SettlementDbRow & { snapshot_json: string | null; snapshot_digest: string | null })[]
        ).map((r) => ({ ...toSettlement(r), snapshot_json: r.snapshot_json, snapshot_digest: r.snapshot_digest }));
        const reservations = (db.query("SELECT * FROM reservations ORDER BY created_at_ms").all() as object[]).map(toReservation);
        return {
          postings: postings.map((p) => ({ ...p, sealed: p.sealed === 1, entries: byPosting.get(p.id) ?? [] })),
          settlements,
          reservations,
        };
      })();
    },
  };
}
