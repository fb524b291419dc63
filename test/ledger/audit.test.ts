// `gateway ledger audit` and `gateway receipts list|export`: a verified golden settlement audits clean;
// a posting tampered with behind the triggers' back is found; the commands' output and exit codes.
import { Database } from "bun:sqlite";
import { describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { parseHistoryLine } from "../../src/catalog/history.ts";
import { auditLedger, type CatalogLookup } from "../../src/ledger/audit.ts";
import { runLedgerCommand, runReceiptsCommand } from "../../src/ledger/cli.ts";
import { canonicalize } from "../../src/receipts/jcs.ts";
import { openStore, type Store } from "../../src/store/index.ts";
import { asyncStore } from "../../src/store/asyncStore.ts";
import { tempDir } from "../store/temp-dir.ts";
import { golden, goldenEnvelope, goldenHistoryPath } from "../receipts/golden-case.ts";

const tmp = tempDir();

const lookup: CatalogLookup = (id) => {
  for (const line of readFileSync(goldenHistoryPath, "utf8").trim().split("\n")) {
    const parsed = parseHistoryLine(line);
    if (parsed.ok && parsed.feed.body.catalog_id === id) return { body_digest: parsed.feed.digest, models: parsed.feed.body.models };
  }
  return undefined;
};

/** A store holding the golden attempt, settled verified with the golden receipt, as the gateway would. */
function settledGolden(): { store: Store; path: string } {
  const path = tmp.path("audit.db");
  const store = openStore(path, { now: () => golden.arrival_unix_ms });
  const s = golden.snapshot;
  const rid = s.request_id;
  store.grantCredits("acct_golden", 1_000);
  store.reserve({ request_id: rid, account_id: "acct_golden", payer: "buyer", day: "2026-01-01", tokens: s.prompt_token_bound + s.max_tokens, credits: 100 });
  store.recordRouteSnapshot({
    request_id: rid,
    attempt_n: 0,
    provider_id: s.provider_id,
    account_id: "acct_golden",
    payer: "buyer",
    mode: "enforce",
    snapshot_json: canonicalize(s),
    digest: golden.route_snapshot_digest,
    rates: { prompt_credits_per_million: s.prompt_credits_per_million, completion_credits_per_million: s.completion_credits_per_million, provider_share_bps: s.provider_share_bps },
  });
  store.recordAcceptedMeasurement(rid, 0, golden.accepted_model_hash);
  const d = golden.delivered;
  store.recordAttemptEnd(
    rid,
    0,
    {
      output_hash: golden.expected.output_hash,
      start_byte: d.start_byte,
      end_byte: d.end_byte,
      tokens: d.tokens,
      terminal_state: d.terminal_state,
      finish_reason: d.finish_reason,
      tool_calls_delivered: true,
      tool_call_bytes: 8 + 6 + 6,
      reported_input_tokens: 31,
    },
    golden.arrival_unix_ms + 300_000,
  );
  store.markRequestEnded(rid);
  const settled = store.settleAttempt({
    request_id: rid,
    attempt_n: 0,
    label: "verified",
    reason: null,
    receipt: { envelope: goldenEnvelope, received_at_ms: golden.arrival_unix_ms },
    billed: { prompt_tokens: 31, completion_tokens: 8 },
  });
  if (!settled.ok) throw new Error(settled.code);
  return { store, path };
}

function ctxFor(store: Store) {
  const out: string[] = [];
  const err: string[] = [];
  return { ctx: { store: asyncStore(store), stdout: (l: string) => out.push(l), stderr: (l: string) => err.push(l) }, out, err };
}

describe("ledger audit", () => {
  test("a verified settlement with its receipt, snapshot and catalog audits clean", () => {
    const { store } = settledGolden();
    const report = auditLedger(store.ledgerAuditData(), lookup);
    expect(report.findings).toEqual([]);
    expect(report).toMatchObject({ clean: true, checked: { verified_receipts: 1, settlements: 1, postings: 2 } });
    expect(report.totals).toEqual({ debit_credits: 11, provider_credits: 9, platform_credits: 2, sum_of_all_entries: 0 });
    store.close();
  });

  test("an entry changed behind the triggers' back is found (unbalanced and not matching the settlement)", () => {
    const { store, path } = settledGolden();
    store.close();
    const db = new Database(path);
    db.run("DROP TRIGGER ledger_entries_no_update");
    db.run("UPDATE ledger_entries SET amount = amount + 5 WHERE account_id = 'provider:prov-golden'");
    db.close();
    const reopened = openStore(path);
    const kinds = auditLedger(reopened.ledgerAuditData(), lookup).findings.map((f) => f.kind);
    expect(kinds).toContain("unbalanced_posting");
    expect(kinds).toContain("posting_mismatch");
    reopened.close();
  });

  test("a balanced but redirected posting is found", () => {
    const { store, path } = settledGolden();
    store.close();
    const db = new Database(path);
    db.run("DROP TRIGGER ledger_entries_no_update");
    db.run("INSERT INTO ledger_accounts (id, kind, created_at_ms) VALUES ('provider:thief', 'provider', 0)");
    db.run("UPDATE ledger_entries SET account_id = 'provider:thief' WHERE account_id = 'provider:prov-golden'");
    db.close();
    const reopened = openStore(path);
    expect(auditLedger(reopened.ledgerAuditData(), lookup).findings.map((f) => f.kind)).toEqual(["posting_mismatch"]);
    reopened.close();
  });

  test("a stored receipt that no longer verifies, or a snapshot edited after the fact, is found", () => {
    const { store, path } = settledGolden();
    store.close();
    const db = new Database(path);
    db.run("DROP TRIGGER settlements_final");
    db.run("UPDATE settlements SET delivered_tokens = 7");
    db.run("UPDATE route_snapshots SET snapshot = replace(snapshot, '\"max_tokens\":64', '\"max_tokens\":65')");
    db.close();
    const reopened = openStore(path);
    expect(auditLedger(reopened.ledgerAuditData(), lookup).findings.map((f) => f.kind)).toContain("snapshot_tampered");
    reopened.close();
  });

  test("a catalog missing from the history is a finding", () => {
    const { store } = settledGolden();
    expect(auditLedger(store.ledgerAuditData(), () => undefined).findings.map((f) => f.kind)).toEqual(["catalog_unknown"]);
    store.close();
  });

  test("CLI: exit 0 and a JSON report when clean, 1 when not", async () => {
    const { store, path } = settledGolden();
    const clean = ctxFor(store);
    expect(await runLedgerCommand(["audit"], clean.ctx, { catalogLookup: lookup })).toBe(0);
    expect(JSON.parse(clean.out[0]!)).toMatchObject({ clean: true });
    store.close();

    const db = new Database(path);
    db.run("DROP TRIGGER ledger_entries_no_delete");
    db.run("DELETE FROM ledger_entries WHERE account_id = 'platform'");
    db.close();
    const reopened = openStore(path);
    const dirty = ctxFor(reopened);
    expect(await runLedgerCommand(["audit", "--json"], dirty.ctx, { catalogLookup: lookup })).toBe(1);
    expect(JSON.parse(dirty.out[0]!).clean).toBe(false);
    expect(await runLedgerCommand(["audit", "--bogus"], dirty.ctx, { catalogLookup: lookup })).toBe(64);
    reopened.close();
  });
});

describe("receipts list / export", () => {
  test("list --json: one line per attempt with label, reason, debit and provider credit", async () => {
    const { store } = settledGolden();
    store.recordRouteSnapshot({
      request_id: "r2",
      attempt_n: 0,
      provider_id: "prov-b",
      account_id: "acct_golden",
      payer: "buyer",
      mode: "enforce",
      snapshot_json: "{}",
      digest: "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a", // sha256("{}")
      rates: { prompt_credits_per_million: 1, completion_credits_per_million: 1, provider_share_bps: 9000 },
    });
    store.settleAttempt({ request_id: "r2", attempt_n: 0, label: "zero_settled", reason: "nothing_delivered" });
    const { ctx, out } = ctxFor(store);
    expect(await runReceiptsCommand(["list", "--json"], ctx)).toBe(0);
    // Same creation time (the store's fixed clock): ordered by request id then.
    expect(out.map((l) => JSON.parse(l))).toEqual([
      { request_id: "r2", attempt_n: 0, provider_id: "prov-b", label: "zero_settled", reason: "nothing_delivered", debit_credits: 0, provider_credits: 0 },
      { request_id: golden.snapshot.request_id, attempt_n: 0, provider_id: "prov-golden", label: "verified", reason: null, debit_credits: 11, provider_credits: 9 },
    ]);
    const one = ctxFor(store);
    expect(await runReceiptsCommand(["list", "--request-id", "r2", "--json"], one.ctx)).toBe(0);
    expect(one.out).toHaveLength(1);
    store.close();
  });

  test("export prints the stored envelope; unknown attempts and missing receipts fail", async () => {
    const { store } = settledGolden();
    const ok = ctxFor(store);
    expect(await runReceiptsCommand(["export", "--request-id", golden.snapshot.request_id, "--attempt", "0"], ok.ctx)).toBe(0);
    expect(ok.out).toEqual([goldenEnvelope]);
    const missing = ctxFor(store);
    expect(await runReceiptsCommand(["export", "--request-id", "nope", "--attempt", "0"], missing.ctx)).toBe(1);
    expect(await runReceiptsCommand(["export", "--request-id", "nope"], missing.ctx)).toBe(64);
    store.close();
  });
});
