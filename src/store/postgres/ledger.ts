// Settlements, reservations and the double-entry ledger on PostgreSQL: the same semantics as the
// SQLite ledger (src/store/ledgerStore.ts), with the same guards in the schema (postgres/migrations.ts).
// SQLite serialises every write with BEGIN IMMEDIATE; here several nodes write at once, so each
// transaction takes transaction-scoped advisory locks instead, always in this order:
// - the buyer account's lock (`a:<account>`) where a balance is read to admit or a grant adds to it
//   (reserve, grant), so two nodes never both spend the same credits. A settlement does not take it
//   (docs/decisions.md, "Settlements do not take the account's lock"): it reads no balance, and the
//   admission reads quota, balance and holds in one snapshot (migration 6), before or after it;
// - the request's lock (`r:<request>`) where its reservation and settlements are resolved together
//   (settleAttempt, markRequestEnded), so the last settlement and the request's end never miss
//   each other.
// A posting is written by ledger_post() in one round trip; the deferred trigger checks at COMMIT that
// it was sealed (entries summing to zero), and UNIQUE (request_id, attempt_n) allows one per attempt.
// The request path's transactions (reserve, an attempt's opening, its settlement, the request's end)
// are each one call of a database function (postgres/migrations.ts, version 3): the locks above are
// then held for the server's own work only, never across round trips to the gateway. Settlements, and
// one account's admissions, that wait while one is in flight go together in one transaction
// (migrations 7 and 8), taking the same locks in one order.
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
  ReserveInput,
  ReserveResult,
  SettleInput,
  SettleResult,
} from "../ledgerTypes.ts";
import { isAdoptedElsewhere, type AsyncStore } from "../asyncStore.ts";
import { heldReservation } from "../rowMapping.ts";
import { keyedBatcher, naturalBatcher } from "./naturalBatch.ts";
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
  | "claimAttempt"
  | "claimPending"
  | "writerReaped"
  | "writersReapedExcept"
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

/** A posting's entries as ledger_post()'s arrays; zero amounts are left out, the rest must sum to zero. */
function postingArrays(amounts: readonly (readonly [string, number])[]): { accounts: string[]; kinds: LedgerAccountKind[]; amounts: number[] } {
  const merged = new Map<string, number>();
  for (const [account, amount] of amounts) {
    if (!Number.isSafeInteger(amount)) throw new Error(`ledger amount ${amount} is not a safe integer`);
    merged.set(account, (merged.get(account) ?? 0) + amount);
  }
  // By account id: every settlement locks the ledger sums' rows in this order (migration 7).
  const entries = [...merged].filter(([, amount]) => amount !== 0).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  const sum = entries.reduce((s, [, amount]) => s + amount, 0);
  if (sum !== 0 || entries.length < 2) throw new Error(`unbalanced posting (sum ${sum}, ${entries.length} entries)`);
  const accounts = entries.map(([account]) => account);
  return { accounts, kinds: accounts.map(accountKind), amounts: entries.map(([, a]) => a) };
}

/** Writes one sealed grant posting inside `tx`. */
async function postGrant(tx: Tx, amounts: readonly (readonly [string, number])[], memo: string | null, now_ms: number): Promise<number> {
  const p = postingArrays(amounts);
  const [row] = await tx`SELECT ledger_post('grant', NULL, NULL, ${memo}, ${now_ms},
    ${tx.array(p.accounts, "TEXT")}, ${tx.array(p.kinds, "TEXT")}, ${tx.array(p.amounts, "INT8")}) AS id`;
  return num((row as Row).id);
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

/** What a settlement's charge depends on: fixed when its attempt opened (gateway_open_attempt). */
interface AttemptHead {
  label: string;
  payer: string;
  account_id: string;
  provider_id: string;
  mode: string;
  prompt_credits_per_million: number;
  completion_credits_per_million: number;
  provider_share_bps: number;
}

/** Open attempts' heads remembered by this process; beyond it the oldest are forgotten (read again). */
const HEADS_LIMIT = 100_000;

/** One settlement's arguments, named as gateway_settle_attempts (migration 7) reads them. */
interface SettleCall {
  request_id: string;
  attempt_n: number;
  /** The reservation's account: batched calls resolve holds in this order. */
  account: string;
  label: string;
  reason: string | null;
  receipt: string | null;
  receipt_id: number | null;
  receipt_received_at_ms: number | null;
  billed_prompt: number;
  billed_completion: number;
  debit: number;
  provider_credits: number;
  platform_credits: number;
  ended: boolean;
  output_hash: string | null;
  start_byte: number | null;
  end_byte: number | null;
  tokens: number | null;
  terminal_state: string | null;
  finish_reason: string | null;
  tool_calls: boolean | null;
  tool_call_bytes: number | null;
  reported_input_tokens: number | null;
  ended_at_ms: number | null;
  pending_deadline_at_ms: number | null;
  accounts: string[] | null;
  kinds: string[] | null;
  amounts: number[] | null;
  now: number;
  accepted_model_hash: string | null;
  end_request: boolean;
}

/** One admission's arguments, named as gateway_reserves (migration 8) reads them. */
interface ReserveCall {
  request_id: string;
  account_id: string;
  payer: string;
  day: string;
  tokens: number;
  credits: number;
  daily_token_limit: number | null;
  ledger_account: string;
  now: number;
  /** The writer's epoch when the call was made (migration 12): a call made before a refusal taught a new one is refused, batched or alone. */
  epoch: number;
}

/** The most calls one batch carries. */
const BATCH_MAX = 64;

/** A batch's calls as the batch functions read them: each numbered by its place. */
const callsJson = (calls: readonly object[]) => JSON.stringify(calls.map((c, n) => ({ ...c, n })));

/** A batch function's rows, one per call, put back in the calls' order (column `i`). */
async function batchRows(query: Promise<unknown>, count: number): Promise<Row[]> {
  const byCall: (Row | undefined)[] = Array.from({ length: count }, () => undefined);
  for (const r of (await query) as Row[]) byCall[num(r.i)] = r;
  if (byCall.some((r) => r === undefined)) throw new Error("a batch function answered fewer rows than calls");
  return byCall as Row[];
}

/** Told when a batch of settlements or admissions failed and its calls are being retried one by one. */
export type BatchFailed = (what: "settlements" | "admissions", size: number, error: unknown) => void;

export function pgLedgerStore(sql: SQL, clock: () => number, onBatchFailed: BatchFailed = () => {}): PgLedgerStore {
  // The heads of attempts this process opened, so that their settlement reads nothing before its one
  // call (docs/scale-out.md, "Measured"): the row was written with exactly these values and they never
  // change; whether the attempt is still pending is checked under the locks by gateway_settle_attempt.
  const heads = new Map<string, AttemptHead>();
  // The reaps of this store's writer it has learned of (migration 12): an opening or a reservation
  // carries it as of when it was made, and is refused once a survivor reaped the writer since. A refusal
  // teaches the count, so a node reaped while alive (split from Redis, stalled) writes again from its
  // next call on; what it made before is refused.
  let epoch = 0;
  const learning = async <T>(write: () => Promise<T>): Promise<T> => {
    try {
      return await write();
    } catch (error) {
      if (isAdoptedElsewhere(error)) {
        // Recorded as learned (migration 13): a sweep marks a writer again only once it learned the last mark.
        const [row] = await sql`SELECT gateway_writer_learned() AS reaped`.catch(() => []);
        if (row !== undefined && (row as Row).reaped !== null) epoch = Math.max(epoch, num((row as Row).reaped));
      }
      throw error;
    }
  };
  const headKey = (request_id: string, attempt_n: number) => `${request_id}#${attempt_n}`;
  // A node's settlements go one call at a time, those that wait meanwhile together in one transaction:
  // the ledger sums' hot rows are then locked once per batch, not once per attempt.
  const settleOne = async (c: SettleCall): Promise<Row> => {
    const [row] = await sql`SELECT * FROM gateway_settle_attempt(${c.request_id}, ${c.attempt_n}, NULL::text, ${c.label}, ${c.reason},
      ${c.receipt}::text, ${c.receipt_id}::bigint, ${c.receipt_received_at_ms}::bigint, ${c.billed_prompt}, ${c.billed_completion},
      ${c.debit}, ${c.provider_credits}, ${c.platform_credits}, ${c.ended}, ${c.output_hash}::text, ${c.start_byte}::bigint,
      ${c.end_byte}::bigint, ${c.tokens}::bigint, ${c.terminal_state}::text, ${c.finish_reason}::text, ${c.tool_calls}::boolean,
      ${c.tool_call_bytes}::bigint, ${c.reported_input_tokens}::bigint, ${c.ended_at_ms}::bigint, ${c.pending_deadline_at_ms}::bigint,
      ${c.accounts ? sql.array(c.accounts, "TEXT") : null}::text[], ${c.kinds ? sql.array(c.kinds, "TEXT") : null}::text[],
      ${c.amounts ? sql.array(c.amounts, "INT8") : null}::int8[], ${c.now}, ${c.accepted_model_hash}::text, ${c.end_request})`;
    return row as Row;
  };
  const settleMany = (calls: SettleCall[]) => batchRows(sql`SELECT * FROM gateway_settle_attempts(${callsJson(calls)}::text::jsonb)`, calls.length);
  const settle = naturalBatcher(settleOne, settleMany, BATCH_MAX, (size, error) => onBatchFailed("settlements", size, error));
  // An account's admissions queue on its lock anyway: a node sends one at a time per account, those
  // that wait meanwhile together (the lock is then taken once per batch, not once per request).
  const admitOne = (c: ReserveCall): Promise<Row> =>
    learning(async () => {
      const [row] = await sql`SELECT * FROM gateway_reserve(${c.request_id}, ${c.account_id}, ${c.payer}, ${c.day},
        ${c.tokens}, ${c.credits}, ${c.daily_token_limit}::bigint, ${c.ledger_account}, ${c.now}, ${c.epoch}::integer)`;
      return row as Row;
    });
  const admitMany = (calls: ReserveCall[]) =>
    learning(() => batchRows(sql`SELECT * FROM gateway_reserves(${callsJson(calls)}::text::jsonb, ${Math.min(...calls.map((c) => c.epoch))}::integer)`, calls.length));
  const admit = keyedBatcher(admitOne, admitMany, BATCH_MAX, (size, error) => onBatchFailed("admissions", size, error));
  const selectSettlement = async (request_id: string, attempt_n: number) => {
    const rows = await sql.unsafe(`${SELECT_SETTLEMENTS} WHERE s.request_id = $1 AND s.attempt_n = $2`, [request_id, attempt_n]);
    return rows.length === 0 ? null : toSettlement(rows[0] as Row);
  };

  return {
    async recordRouteSnapshot(input: NewAttempt, now_ms = clock()) {
      if (createHash("sha256").update(input.snapshot_json).digest("hex") !== input.digest) {
        return { ok: false as const, code: "digest_mismatch" as const };
      }
      const madeIn = epoch;
      const [row] = await learning(
        () => sql`SELECT gateway_open_attempt(${input.request_id}, ${input.attempt_n}, ${input.digest}, ${input.snapshot_json},
          ${input.provider_id}, ${input.account_id}, ${input.payer}, ${input.mode}, ${input.rates.prompt_credits_per_million},
          ${input.rates.completion_credits_per_million}, ${input.rates.provider_share_bps}, ${now_ms}, ${madeIn}::integer) AS opened`,
      );
      if ((row as Row).opened !== true) return { ok: false as const, code: "duplicate_attempt" as const };
      if (heads.size >= HEADS_LIMIT) heads.delete(heads.keys().next().value!);
      heads.set(headKey(input.request_id, input.attempt_n), {
        label: "pending",
        payer: input.payer,
        account_id: input.account_id,
        provider_id: input.provider_id,
        mode: input.mode,
        prompt_credits_per_million: input.rates.prompt_credits_per_million,
        completion_credits_per_million: input.rates.completion_credits_per_million,
        provider_share_bps: input.rates.provider_share_bps,
      });
      return { ok: true as const };
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

    async recordAttemptEnd(request_id, attempt_n, d, pending_deadline_at_ms, now_ms = clock(), accepted_model_hash) {
      const res = await sql`UPDATE settlements SET accepted_model_hash = COALESCE(accepted_model_hash, ${accepted_model_hash ?? null}::text),
          delivered_output_hash = ${d.output_hash}, delivered_start_byte = ${d.start_byte},
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
      // What the charge depends on (payer, rates, mode) never changes once the attempt is open: it is
      // read and priced first, so the transaction itself is one call that holds its locks briefly.
      const key = headKey(input.request_id, input.attempt_n);
      let h: Row | undefined = heads.get(key) as Row | undefined;
      if (h === undefined) {
        [h] = (await sql`SELECT label, payer, account_id, provider_id, mode, prompt_credits_per_million,
          completion_credits_per_million, provider_share_bps FROM settlements WHERE request_id = ${input.request_id} AND attempt_n = ${input.attempt_n}`) as Row[];
        if (h === undefined) return { ok: false, code: "unknown_attempt" };
      }
      const alreadySettled = async (): Promise<SettleResult> => ({
        ok: false,
        code: "already_settled",
        settlement: (await selectSettlement(input.request_id, input.attempt_n))!,
      });
      if (h.label !== "pending") return alreadySettled();
      let charge: Charge | null = null;
      const billed = input.billed ?? null;
      if (billed !== null && (billed.prompt_tokens !== 0 || billed.completion_tokens !== 0)) {
        // The settlement's own rule (src/ledger/charges.ts), checked again where the charge is written.
        if (!chargeAllowed(input.label, h.mode as SettlementMode)) return { ok: false, code: "charge_not_allowed" };
        const priced = priceUsage(billed.prompt_tokens, billed.completion_tokens, {
          prompt_credits_per_million: num(h.prompt_credits_per_million),
          completion_credits_per_million: num(h.completion_credits_per_million),
          provider_share_bps: num(h.provider_share_bps),
        });
        if (!priced.ok) return { ok: false, code: "invalid_amount" };
        charge = priced.charge;
      }
      const posting =
        charge !== null && charge.debit_credits > 0
          ? postingArrays([
              [payingAccount(h.payer as Payer, h.account_id as string), -charge.debit_credits],
              [providerAccount(h.provider_id as string), charge.provider_credits],
              [PLATFORM_ACCOUNT, charge.platform_credits],
            ])
          : null;
      const byArrival = input.receipt?.arrival_id !== undefined;
      const ended = input.ended ?? null;
      const d = ended?.delivered;
      const r = await settle({
        request_id: input.request_id,
        attempt_n: input.attempt_n,
        account: h.account_id as string,
        label: input.label,
        reason: input.reason,
        receipt: byArrival ? null : (input.receipt?.envelope ?? null),
        receipt_id: input.receipt?.arrival_id ?? null,
        receipt_received_at_ms: input.receipt?.received_at_ms ?? null,
        billed_prompt: charge?.prompt_tokens ?? 0,
        billed_completion: charge?.completion_tokens ?? 0,
        debit: charge?.debit_credits ?? 0,
        provider_credits: charge?.provider_credits ?? 0,
        platform_credits: charge?.platform_credits ?? 0,
        ended: ended !== null,
        output_hash: d?.output_hash ?? null,
        start_byte: d?.start_byte ?? null,
        end_byte: d?.end_byte ?? null,
        tokens: d?.tokens ?? null,
        terminal_state: d?.terminal_state ?? null,
        finish_reason: d?.finish_reason ?? null,
        tool_calls: d?.tool_calls_delivered ?? null,
        tool_call_bytes: d?.tool_call_bytes ?? null,
        reported_input_tokens: d?.reported_input_tokens ?? null,
        ended_at_ms: ended?.ended_at_ms ?? null,
        pending_deadline_at_ms: ended?.pending_deadline_at_ms ?? null,
        accounts: posting?.accounts ?? null,
        kinds: posting?.kinds ?? null,
        amounts: posting?.amounts ?? null,
        now: now_ms,
        accepted_model_hash: input.accepted_model_hash ?? null,
        end_request: input.end_request === true,
      });
      heads.delete(key);
      if (r.outcome === "already_settled") return alreadySettled();
      const written = (typeof r.settlement === "string" ? JSON.parse(r.settlement) : r.settlement) as Row;
      const settled = toSettlement({ ...written, receipt_envelope: byArrival ? input.receipt!.envelope : null });
      return { ok: true, settlement: settled, posting_id: r.posting_id === null ? null : num(r.posting_id) };
    },

    getSettlement: selectSettlement,

    // The row lock orders a claim and the previous owner's write: whichever commits first, the other
    // sees it (the adopter reads the row after its claim; a stale write after it is refused).
    async claimAttempt(request_id, attempt_n) {
      await sql`UPDATE settlements SET owner = NULLIF(current_setting('gateway.writer', true), '')
        WHERE request_id = ${request_id} AND attempt_n = ${attempt_n} AND label = 'pending'`;
    },

    async claimPending() {
      await sql`UPDATE settlements SET owner = NULLIF(current_setting('gateway.writer', true), '') WHERE label = 'pending'`;
    },

    // Waits for the writer's openings and reservations in flight (their lock), then refuses the rest.
    async writerReaped(writer, now_ms = clock()) {
      await sql`SELECT gateway_writer_reaped(${writer}, ${now_ms})`;
    },

    async writersReapedExcept(live, now_ms = clock()) {
      const [row] = await sql`SELECT gateway_writers_reaped_except(${sql.array([...live], "TEXT")}::text[], ${now_ms}) AS marked`;
      return num((row as Row).marked);
    },

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
      const r = await admit(input.account_id, {
        request_id: input.request_id,
        account_id: input.account_id,
        payer: input.payer,
        day: input.day,
        tokens: input.tokens,
        credits: input.credits,
        daily_token_limit: input.daily_token_limit ?? null,
        ledger_account: buyerAccount(input.account_id),
        now: now_ms,
        epoch,
      });
      switch (r.code as string) {
        case "ok":
          return { ok: true, reservation: heldReservation(input, now_ms) };
        case "duplicate_request":
          return { ok: false, code: "duplicate_request" };
        case "quota_exhausted":
          return { ok: false, code: "quota_exhausted", used_tokens: num(r.figure) };
        case "insufficient_balance":
          return { ok: false, code: "insufficient_balance", available_credits: num(r.figure) };
        default:
          throw new Error(`gateway_reserve answered ${String(r.code)}`);
      }
    },

    async markRequestEnded(request_id, now_ms = clock()) {
      await sql`SELECT gateway_end_request(${request_id}, ${now_ms})`;
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
        return postGrant(
          tx,
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
}
