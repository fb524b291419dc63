// Settlements, reservations and the double-entry ledger on PostgreSQL: the same semantics as the
// SQLite ledger (src/store/ledgerStore.ts), with the same guards in the schema (postgres/migrations.ts).
// SQLite serialises every write with BEGIN IMMEDIATE; here several nodes write at once, so each
// transaction takes transaction-scoped advisory locks instead, always in this order:
// - the buyer account's lock (`a:<account>`) where a balance is read or changed (reserve, a buyer's
//   settlement, a grant), so two nodes never both spend the same credits;
// - the request's lock (`r:<request>`) where its reservation and settlements are resolved together
//   (settleAttempt, markRequestEnded), so the last settlement and the request's end never miss
//   each other.
// A posting is written by ledger_post() in one round trip; the deferred trigger checks at COMMIT that
// it was sealed (entries summing to zero), and UNIQUE (request_id, attempt_n) allows one per attempt.
import type { SQL } from "bun";
import { createHash } from "node:crypto";
import { priceUsage, type Charge } from "../../ledger/money.ts";
import { buyerAccount, chargeAllowed, FUNDING_ACCOUNT, payingAccount, type Payer, type SettlementMode, PLATFORM_ACCOUNT, PROMOTION_ACCOUNT, providerAccount } from "../../ledger/charges.ts";
import type {
  LedgerAccountKind,
  LedgerAuditData,
  LedgerBalance,
  NewAttempt,
  PostingRow,
  ReservationRow,
  ReserveInput,
  ReserveResult,
  SettleInput,
  SettleResult,
} from "../ledgerTypes.ts";
import type { AsyncStore } from "../asyncStore.ts";
import { num, toReservation, toSettlement } from "./rows.ts";

type Tx = SQL;
type Row = Record<string, unknown>;

export type PgLedgerStore = Pick<
  AsyncStore,
  | "recordRouteSnapshot"
  | "getRouteSnapshot"
  | "recordAcceptedMeasurement"
  | "recordAttemptEnd"
  | "recordReceiptArrival"
  | "settleAttempt"
  | "getSettlement"
  | "listSettlements"
  | "reserve"
  | "markRequestEnded"
  | "unendedHeldReservations"
  | "getReservation"
  | "tokensCountedOn"
  | "grantCredits"
  | "ledgerBalance"
  | "ledgerBalances"
  | "availableCredits"
  | "ledgerAuditData"
>;

const isCount = (n: number) => Number.isSafeInteger(n) && n >= 0;

function accountKind(id: string): LedgerAccountKind {
  if (id.startsWith("buyer:")) return "buyer";
  if (id.startsWith("provider:")) return "provider";
  if (id === PLATFORM_ACCOUNT || id === PROMOTION_ACCOUNT || id === FUNDING_ACCOUNT) return id;
  throw new Error(`not a ledger account id: ${id}`);
}

const lock = (tx: Tx, key: string) => tx`SELECT pg_advisory_xact_lock(hashtextextended(${key}, 0))`;
const lockAccount = (tx: Tx, account_id: string) => lock(tx, `a:${account_id}`);
const lockRequest = (tx: Tx, request_id: string) => lock(tx, `r:${request_id}`);

/** Writes one sealed posting inside `tx`; zero amounts are left out, the rest must sum to zero. */
async function post(
  tx: Tx,
  kind: "settlement" | "grant",
  key: { request_id: string; attempt_n: number } | null,
  amounts: readonly (readonly [string, number])[],
  memo: string | null,
  now_ms: number,
): Promise<number> {
  const merged = new Map<string, number>();
  for (const [account, amount] of amounts) {
    if (!Number.isSafeInteger(amount)) throw new Error(`ledger amount ${amount} is not a safe integer`);
    merged.set(account, (merged.get(account) ?? 0) + amount);
  }
  const entries = [...merged].filter(([, amount]) => amount !== 0);
  const sum = entries.reduce((s, [, amount]) => s + amount, 0);
  if (sum !== 0 || entries.length < 2) throw new Error(`unbalanced posting (sum ${sum}, ${entries.length} entries)`);
  const accounts = entries.map(([account]) => account);
  const [row] = await tx`SELECT ledger_post(${kind}, ${key?.request_id ?? null}, ${key?.attempt_n ?? null}, ${memo}, ${now_ms},
    ${tx.array(accounts, "TEXT")}, ${tx.array(accounts.map(accountKind), "TEXT")}, ${tx.array(entries.map(([, a]) => a), "INT8")}) AS id`;
  return num((row as Row).id);
}

/** Resolves a request's held, ended reservation unless one of its attempts is pending. */
async function resolveReservationIfDone(tx: Tx, request_id: string, now_ms: number): Promise<void> {
  const [used] = await tx`
    SELECT COUNT(*) FILTER (WHERE label = 'pending') AS pending,
           COALESCE(SUM(billed_prompt_tokens + billed_completion_tokens), 0) AS tokens,
           COALESCE(SUM(debit_credits), 0) AS credits
      FROM settlements WHERE request_id = ${request_id}`;
  const u = used as Row;
  if (num(u.pending) > 0) return;
  const tokens = num(u.tokens);
  const credits = num(u.credits);
  await tx`UPDATE reservations SET state = ${tokens > 0 || credits > 0 ? "finalised" : "released"},
             used_tokens = ${tokens}, used_credits = ${credits}, resolved_at_ms = ${now_ms}
            WHERE request_id = ${request_id} AND state = 'held' AND request_ended`;
}

const tokensCountedOn = async (sql: Tx, account_id: string, day: string): Promise<number> => {
  const [row] = await sql`
    SELECT COALESCE(SUM(CASE state WHEN 'held' THEN tokens WHEN 'finalised' THEN used_tokens ELSE 0 END), 0) AS t
      FROM reservations WHERE account_id = ${account_id} AND day = ${day}`;
  return num((row as Row).t);
};

const balanceOf = async (sql: Tx, ledger_account_id: string): Promise<number> => {
  const [row] = await sql`SELECT balance FROM ledger_account_totals WHERE account_id = ${ledger_account_id}`;
  return row === undefined ? 0 : num((row as Row).balance);
};
const heldCredits = async (sql: Tx, account_id: string): Promise<number> => {
  const [row] = await sql`SELECT held_credits FROM reservation_holds WHERE account_id = ${account_id}`;
  return row === undefined ? 0 : num((row as Row).held_credits);
};

const SELECT_SETTLEMENTS = `SELECT s.*, rr.envelope AS receipt_envelope
  FROM settlements s LEFT JOIN receipts_received rr ON rr.id = s.receipt_id`;

export function pgLedgerStore(sql: SQL, clock: () => number): PgLedgerStore {
  const selectSettlement = async (request_id: string, attempt_n: number) => {
    const rows = await sql.unsafe(`${SELECT_SETTLEMENTS} WHERE s.request_id = $1 AND s.attempt_n = $2`, [request_id, attempt_n]);
    return rows.length === 0 ? null : toSettlement(rows[0] as Row);
  };

  return {
    async recordRouteSnapshot(input: NewAttempt, now_ms = clock()) {
      if (createHash("sha256").update(input.snapshot_json).digest("hex") !== input.digest) {
        return { ok: false as const, code: "digest_mismatch" as const };
      }
      return sql.begin(async (tx) => {
        const inserted = await tx`
          INSERT INTO route_snapshots (request_id, attempt_n, digest, snapshot, created_at_ms)
          VALUES (${input.request_id}, ${input.attempt_n}, ${input.digest}, ${input.snapshot_json}, ${now_ms})
          ON CONFLICT (request_id, attempt_n) DO NOTHING`;
        if (inserted.count === 0) return { ok: false as const, code: "duplicate_attempt" as const };
        await tx`
          INSERT INTO settlements (request_id, attempt_n, provider_id, account_id, payer, mode,
            prompt_credits_per_million, completion_credits_per_million, provider_share_bps, created_at_ms)
          VALUES (${input.request_id}, ${input.attempt_n}, ${input.provider_id}, ${input.account_id}, ${input.payer}, ${input.mode},
            ${input.rates.prompt_credits_per_million}, ${input.rates.completion_credits_per_million}, ${input.rates.provider_share_bps}, ${now_ms})`;
        return { ok: true as const };
      });
    },

    async getRouteSnapshot(request_id, attempt_n) {
      const [row] = await sql`SELECT snapshot, digest FROM route_snapshots WHERE request_id = ${request_id} AND attempt_n = ${attempt_n}`;
      return row === undefined ? null : { snapshot_json: (row as Row).snapshot as string, digest: (row as Row).digest as string };
    },

    async recordAcceptedMeasurement(request_id, attempt_n, model_hash) {
      const res = await sql`UPDATE settlements SET accepted_model_hash = ${model_hash}
        WHERE request_id = ${request_id} AND attempt_n = ${attempt_n} AND label = 'pending' AND accepted_model_hash IS NULL`;
      return res.count === 1;
    },

    async recordAttemptEnd(request_id, attempt_n, d, pending_deadline_at_ms, now_ms = clock()) {
      const res = await sql`UPDATE settlements SET delivered_output_hash = ${d.output_hash}, delivered_start_byte = ${d.start_byte},
          delivered_end_byte = ${d.end_byte}, delivered_tokens = ${d.tokens}, delivered_terminal_state = ${d.terminal_state},
          delivered_finish_reason = ${d.finish_reason}, delivered_tool_calls = ${d.tool_calls_delivered},
          delivered_tool_call_bytes = ${d.tool_call_bytes}, reported_input_tokens = ${d.reported_input_tokens}, ended_at_ms = ${now_ms}, pending_deadline_at_ms = ${pending_deadline_at_ms}
        WHERE request_id = ${request_id} AND attempt_n = ${attempt_n} AND label = 'pending' AND ended_at_ms IS NULL`;
      return res.count === 1;
    },

    async recordReceiptArrival(input, now_ms = clock()) {
      const [row] = await sql`INSERT INTO receipts_received (request_id, attempt_n, provider_id, envelope, received_at_ms, disposition)
        VALUES (${input.request_id}, ${input.attempt_n}, ${input.provider_id}, ${input.envelope}, ${now_ms}, ${input.disposition}) RETURNING id`;
      return num((row as Row).id);
    },

    async settleAttempt(input: SettleInput, now_ms = clock()): Promise<SettleResult> {
      // The payer is read before the locks (it never changes) so the account lock comes first.
      const [head] = await sql`SELECT payer, account_id FROM settlements WHERE request_id = ${input.request_id} AND attempt_n = ${input.attempt_n}`;
      if (head === undefined) return { ok: false, code: "unknown_attempt" };
      return sql.begin(async (tx): Promise<SettleResult> => {
        const h = head as Row;
        if (h.payer === "buyer") await lockAccount(tx, h.account_id as string);
        await lockRequest(tx, input.request_id);
        const [locked] = await tx`SELECT * FROM settlements WHERE request_id = ${input.request_id} AND attempt_n = ${input.attempt_n} FOR UPDATE`;
        const row = locked as Row;
        if (row.label !== "pending") {
          return { ok: false, code: "already_settled", settlement: (await selectSettlementIn(tx, input.request_id, input.attempt_n))! };
        }
        let charge: Charge | null = null;
        const billed = input.billed ?? null;
        if (billed !== null && (billed.prompt_tokens !== 0 || billed.completion_tokens !== 0)) {
          // The settlement's own rule (src/ledger/charges.ts), checked again where the charge is written.
          if (!chargeAllowed(input.label, row.mode as SettlementMode)) return { ok: false, code: "charge_not_allowed" };
          const priced = priceUsage(billed.prompt_tokens, billed.completion_tokens, {
            prompt_credits_per_million: num(row.prompt_credits_per_million),
            completion_credits_per_million: num(row.completion_credits_per_million),
            provider_share_bps: num(row.provider_share_bps),
          });
          if (!priced.ok) return { ok: false, code: "invalid_amount" };
          charge = priced.charge;
        }
        const byArrival = input.receipt?.arrival_id !== undefined;
        const ended = input.ended !== undefined && row.ended_at_ms === null ? input.ended : null;
        const d = ended?.delivered;
        const [written] = await tx`
          UPDATE settlements SET label = ${input.label}, reason = ${input.reason},
                 receipt = COALESCE(${byArrival ? null : (input.receipt?.envelope ?? null)}::text, receipt),
                 receipt_id = COALESCE(${input.receipt?.arrival_id ?? null}::bigint, receipt_id),
                 receipt_received_at_ms = COALESCE(${input.receipt?.received_at_ms ?? null}::bigint, receipt_received_at_ms),
                 billed_prompt_tokens = ${charge?.prompt_tokens ?? 0}, billed_completion_tokens = ${charge?.completion_tokens ?? 0},
                 debit_credits = ${charge?.debit_credits ?? 0}, provider_credits = ${charge?.provider_credits ?? 0},
                 platform_credits = ${charge?.platform_credits ?? 0}, settled_at_ms = ${now_ms},
                 delivered_output_hash = CASE WHEN ${ended !== null} THEN ${d?.output_hash ?? null}::text ELSE delivered_output_hash END,
                 delivered_start_byte = CASE WHEN ${ended !== null} THEN ${d?.start_byte ?? null}::bigint ELSE delivered_start_byte END,
                 delivered_end_byte = CASE WHEN ${ended !== null} THEN ${d?.end_byte ?? null}::bigint ELSE delivered_end_byte END,
                 delivered_tokens = CASE WHEN ${ended !== null} THEN ${d?.tokens ?? null}::bigint ELSE delivered_tokens END,
                 delivered_terminal_state = CASE WHEN ${ended !== null} THEN ${d?.terminal_state ?? null}::text ELSE delivered_terminal_state END,
                 delivered_finish_reason = CASE WHEN ${ended !== null} THEN ${d?.finish_reason ?? null}::text ELSE delivered_finish_reason END,
                 delivered_tool_calls = CASE WHEN ${ended !== null} THEN ${d?.tool_calls_delivered ?? null}::boolean ELSE delivered_tool_calls END,
                 delivered_tool_call_bytes = CASE WHEN ${ended !== null} THEN ${d?.tool_call_bytes ?? null}::bigint ELSE delivered_tool_call_bytes END,
                 reported_input_tokens = CASE WHEN ${ended !== null} THEN ${d?.reported_input_tokens ?? null}::bigint ELSE reported_input_tokens END,
                 ended_at_ms = CASE WHEN ${ended !== null} THEN ${ended?.ended_at_ms ?? null}::bigint ELSE ended_at_ms END,
                 pending_deadline_at_ms = CASE WHEN ${ended !== null} THEN ${ended?.pending_deadline_at_ms ?? null}::bigint ELSE pending_deadline_at_ms END
           WHERE request_id = ${input.request_id} AND attempt_n = ${input.attempt_n} AND label = 'pending'
          RETURNING *`;
        let posting_id: number | null = null;
        if (charge !== null && charge.debit_credits > 0) {
          const payer = payingAccount(row.payer as Payer, row.account_id as string);
          posting_id = await post(
            tx,
            "settlement",
            { request_id: input.request_id, attempt_n: input.attempt_n },
            [
              [payer, -charge.debit_credits],
              [providerAccount(row.provider_id as string), charge.provider_credits],
              [PLATFORM_ACCOUNT, charge.platform_credits],
            ],
            null,
            now_ms,
          );
        }
        await resolveReservationIfDone(tx, input.request_id, now_ms);
        const settled = toSettlement({ ...(written as Row), receipt_envelope: byArrival ? input.receipt!.envelope : null });
        return { ok: true, settlement: settled, posting_id };
      });
    },

    getSettlement: selectSettlement,

    async listSettlements(filter = {}) {
      const where: string[] = [];
      const args: string[] = [];
      if (filter.request_id !== undefined) {
        args.push(filter.request_id);
        where.push(`s.request_id = $${args.length}`);
      }
      if (filter.label !== undefined) {
        args.push(filter.label);
        where.push(`s.label = $${args.length}`);
      }
      const rows = await sql.unsafe(
        `${SELECT_SETTLEMENTS} ${where.length ? `WHERE ${where.join(" AND ")}` : ""} ORDER BY s.created_at_ms, s.request_id COLLATE "C", s.attempt_n`,
        args,
      );
      return (rows as Row[]).map(toSettlement);
    },

    async reserve(input: ReserveInput, now_ms = clock()): Promise<ReserveResult> {
      if (!isCount(input.tokens) || !isCount(input.credits)) return { ok: false, code: "invalid_amount" };
      return sql.begin(async (tx): Promise<ReserveResult> => {
        // Quota and balance are per account: one admission of an account at a time, on any node.
        await lockAccount(tx, input.account_id);
        const [taken] = await tx`SELECT 1 FROM reservations WHERE request_id = ${input.request_id}`;
        if (taken !== undefined) return { ok: false, code: "duplicate_request" };
        if (input.daily_token_limit !== undefined) {
          const used = await tokensCountedOn(tx, input.account_id, input.day);
          if (used + input.tokens > input.daily_token_limit) return { ok: false, code: "quota_exhausted", used_tokens: used };
        }
        if (input.payer === "buyer") {
          const available = (await balanceOf(tx, buyerAccount(input.account_id))) - (await heldCredits(tx, input.account_id));
          if (available < input.credits) return { ok: false, code: "insufficient_balance", available_credits: available };
        }
        await tx`INSERT INTO reservations (request_id, account_id, payer, day, tokens, credits, created_at_ms)
          VALUES (${input.request_id}, ${input.account_id}, ${input.payer}, ${input.day}, ${input.tokens}, ${input.credits}, ${now_ms})`;
        const reservation: ReservationRow = {
          request_id: input.request_id,
          account_id: input.account_id,
          payer: input.payer,
          day: input.day,
          tokens: input.tokens,
          credits: input.credits,
          state: "held",
          request_ended: false,
          used_tokens: 0,
          used_credits: 0,
          created_at_ms: now_ms,
          resolved_at_ms: null,
        };
        return { ok: true, reservation };
      });
    },

    async markRequestEnded(request_id, now_ms = clock()) {
      await sql.begin(async (tx) => {
        await lockRequest(tx, request_id);
        const res = await tx`UPDATE reservations SET request_ended = true WHERE request_id = ${request_id} AND state = 'held'`;
        if (res.count === 1) await resolveReservationIfDone(tx, request_id, now_ms);
      });
    },

    async unendedHeldReservations() {
      const rows = await sql`SELECT request_id FROM reservations WHERE state = 'held' AND NOT request_ended ORDER BY created_at_ms`;
      return (rows as Row[]).map((r) => r.request_id as string);
    },

    async getReservation(request_id) {
      const [row] = await sql`SELECT * FROM reservations WHERE request_id = ${request_id}`;
      return row === undefined ? null : toReservation(row as Row);
    },

    tokensCountedOn: (account_id, day) => tokensCountedOn(sql, account_id, day),

    async grantCredits(account_id, credits, memo, now_ms = clock()) {
      if (!isCount(credits) || credits === 0) return { ok: false, code: "invalid_amount" };
      const posting_id = await sql.begin(async (tx) => {
        await lockAccount(tx, account_id);
        return post(
          tx,
          "grant",
          null,
          [
            [FUNDING_ACCOUNT, -credits],
            [buyerAccount(account_id), credits],
          ],
          memo ?? null,
          now_ms,
        );
      });
      return { ok: true as const, posting_id };
    },

    ledgerBalance: (id) => balanceOf(sql, id),

    async ledgerBalances(): Promise<LedgerBalance[]> {
      const rows = await sql`
        SELECT a.id AS account_id, a.kind, COALESCE(e.balance, 0) AS balance
          FROM ledger_accounts a
          LEFT JOIN (SELECT account_id, SUM(amount) AS balance FROM ledger_entries GROUP BY account_id) e ON e.account_id = a.id
         ORDER BY a.id COLLATE "C"`;
      return (rows as Row[]).map((r) => ({ account_id: r.account_id as string, kind: r.kind as LedgerAccountKind, balance: num(r.balance) }));
    },

    availableCredits: async (account_id) => (await balanceOf(sql, buyerAccount(account_id))) - (await heldCredits(sql, account_id)),

    async ledgerAuditData(): Promise<LedgerAuditData> {
      // One REPEATABLE READ transaction: postings, entries and settlements are seen at one instant.
      return sql.begin("ISOLATION LEVEL REPEATABLE READ READ ONLY", async (tx) => {
        const postings = (await tx`SELECT * FROM ledger_postings ORDER BY id`) as Row[];
        const entries = (await tx`SELECT posting_id, account_id, amount FROM ledger_entries ORDER BY posting_id, account_id COLLATE "C"`) as Row[];
        const byPosting = new Map<number, { account_id: string; amount: number }[]>();
        for (const e of entries) {
          const id = num(e.posting_id);
          const list = byPosting.get(id) ?? [];
          list.push({ account_id: e.account_id as string, amount: num(e.amount) });
          byPosting.set(id, list);
        }
        const settlements = (
          (await tx`SELECT s.*, rr.envelope AS receipt_envelope, r.snapshot AS snapshot_json, r.digest AS snapshot_digest
                      FROM settlements s LEFT JOIN route_snapshots r USING (request_id, attempt_n)
                      LEFT JOIN receipts_received rr ON rr.id = s.receipt_id
                     ORDER BY s.created_at_ms, s.request_id COLLATE "C", s.attempt_n`) as Row[]
        ).map((r) => ({
          ...toSettlement(r),
          snapshot_json: (r.snapshot_json as string | null) ?? null,
          snapshot_digest: (r.snapshot_digest as string | null) ?? null,
        }));
        const reservations = ((await tx`SELECT * FROM reservations ORDER BY created_at_ms`) as Row[]).map(toReservation);
        return {
          postings: postings.map(
            (p): PostingRow => ({
              id: num(p.id),
              kind: p.kind as PostingRow["kind"],
              request_id: (p.request_id as string | null) ?? null,
              attempt_n: p.attempt_n === null ? null : num(p.attempt_n),
              sealed: p.sealed as boolean,
              memo: (p.memo as string | null) ?? null,
              created_at_ms: num(p.created_at_ms),
              entries: byPosting.get(num(p.id)) ?? [],
            }),
          ),
          settlements,
          reservations,
        };
      });
    },
  };

  async function selectSettlementIn(tx: Tx, request_id: string, attempt_n: number) {
    const rows = await tx.unsafe(`${SELECT_SETTLEMENTS} WHERE s.request_id = $1 AND s.attempt_n = $2`, [request_id, attempt_n]);
    return rows.length === 0 ? null : toSettlement(rows[0] as Row);
  }
}
