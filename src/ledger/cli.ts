// `gateway receipts list|export` and `gateway ledger audit` (docs/operator.md). Exit codes as the other
// operator commands: 0 done, 1 failure (or audit findings), 64 usage. JSON on stdout.
import { parseFlags } from "../cli/flags.ts";
import type { OperatorContext } from "../cli/operator.ts";
import type { SettlementRow } from "../store/index.ts";
import { auditLedger, type CatalogLookup } from "./audit.ts";

const RECEIPTS_USAGE = [
  "usage: gateway receipts list [--request-id ID] [--json]",
  "       gateway receipts export --request-id ID --attempt N",
];
const LEDGER_USAGE = ["usage: gateway ledger audit [--json]"];

function usageError(ctx: OperatorContext, usage: readonly string[], message: string): number {
  ctx.stderr(`error: ${message}`);
  usage.forEach((l) => ctx.stderr(l));
  return 64;
}

/** One line of `receipts list --json` (docs/operator.md). */
export function receiptLine(s: SettlementRow) {
  return {
    request_id: s.request_id,
    attempt_n: s.attempt_n,
    provider_id: s.provider_id,
    label: s.label,
    reason: s.reason,
    debit_credits: s.debit_credits,
    provider_credits: s.provider_credits,
  };
}

/** Runs `gateway receipts …`; `argv` starts after the word `receipts`. */
export async function runReceiptsCommand(argv: readonly string[], ctx: OperatorContext): Promise<number> {
  const [word, ...rest] = argv;
  if (word === "list") {
    const p = parseFlags(rest, { "request-id": { kind: "string" }, json: { kind: "boolean" } });
    if (!p.ok) return usageError(ctx, RECEIPTS_USAGE, p.message);
    if (p.positionals.length > 0) return usageError(ctx, RECEIPTS_USAGE, `unexpected argument ${p.positionals[0]}`);
    const rows = (await ctx.store.listSettlements({ request_id: p.flags["request-id"] })).map(receiptLine);
    if (p.flags.json) rows.forEach((r) => ctx.stdout(JSON.stringify(r)));
    else {
      ctx.stdout("REQUEST_ID  ATTEMPT  PROVIDER  LABEL  REASON  DEBIT  PROVIDER_CREDITS");
      for (const r of rows) {
        ctx.stdout([r.request_id, r.attempt_n, r.provider_id, r.label, r.reason ?? "-", r.debit_credits, r.provider_credits].join("  "));
      }
    }
    return 0;
  }
  if (word === "export") {
    const p = parseFlags(rest, { "request-id": { kind: "string" }, attempt: { kind: "string" } });
    if (!p.ok) return usageError(ctx, RECEIPTS_USAGE, p.message);
    const request_id = p.flags["request-id"];
    const attemptText = p.flags.attempt;
    if (request_id === undefined || attemptText === undefined) return usageError(ctx, RECEIPTS_USAGE, "--request-id and --attempt are required");
    if (!/^\d{1,3}$/.test(attemptText)) return usageError(ctx, RECEIPTS_USAGE, "--attempt must be a whole number");
    const s = await ctx.store.getSettlement(request_id, Number(attemptText));
    if (s === null) {
      ctx.stderr(`error: unknown attempt ${request_id} #${attemptText}`);
      return 1;
    }
    if (s.receipt === null) {
      ctx.stderr(`error: no receipt stored for ${request_id} #${attemptText} (${s.label}${s.reason ? `: ${s.reason}` : ""})`);
      return 1;
    }
    ctx.stdout(s.receipt);
    return 0;
  }
  if (word === "help" || word === "--help") {
    RECEIPTS_USAGE.forEach((l) => ctx.stdout(l));
    return 0;
  }
  return usageError(ctx, RECEIPTS_USAGE, word === undefined ? "missing subcommand" : `unknown subcommand ${word}`);
}

/** Runs `gateway ledger …`. The catalog lookup is injected so the audit reads the catalog history however it is stored. */
export async function runLedgerCommand(
  argv: readonly string[],
  ctx: OperatorContext,
  deps: { catalogLookup: CatalogLookup },
): Promise<number> {
  const [word, ...rest] = argv;
  if (word === "audit") {
    const p = parseFlags(rest, { json: { kind: "boolean" } });
    if (!p.ok) return usageError(ctx, LEDGER_USAGE, p.message);
    if (p.positionals.length > 0) return usageError(ctx, LEDGER_USAGE, `unexpected argument ${p.positionals[0]}`);
    // The report is JSON whether or not --json is given: programs read it either way (docs/operator.md).
    const report = auditLedger(await ctx.store.ledgerAuditData(), deps.catalogLookup);
    ctx.stdout(JSON.stringify(report));
    return report.clean ? 0 : 1;
  }
  if (word === "help" || word === "--help") {
    LEDGER_USAGE.forEach((l) => ctx.stdout(l));
    return 0;
  }
  return usageError(ctx, LEDGER_USAGE, word === undefined ? "missing subcommand" : `unknown subcommand ${word}`);
}
