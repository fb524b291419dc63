// A settlement refers to its deciding receipt's row in the arrival log instead of storing the envelope
// a second time: every reader still gets the envelope, and rows settled the old way (the
// envelope in the settlement row itself) read as before.
import { Database } from "bun:sqlite";
import { describe, expect, test } from "bun:test";
import { openStore, type Store } from "../../src/store/index.ts";
import { attempt } from "./attempt-fixture.ts";
import { tempDir } from "../store/temp-dir.ts";

const tmp = tempDir();
const verified = { label: "verified" as const, reason: null, billed: { prompt_tokens: 30, completion_tokens: 4 } };
const ENVELOPE = `${"a".repeat(1500)}.${"s".repeat(88)}`;

function fresh(name: string): { store: Store; path: string } {
  const path = tmp.path(name);
  const store = openStore(path, { now: () => 1_000 });
  store.grantCredits("acct_1", 1_000);
  return { store, path };
}

const raw = (path: string, request_id: string) => {
  const db = new Database(path, { readonly: true });
  try {
    return {
      settlement: db.query("SELECT receipt, receipt_id FROM settlements WHERE request_id = ?").get(request_id) as { receipt: string | null; receipt_id: number | null },
      log: db.query("SELECT id, envelope, disposition FROM receipts_received WHERE request_id = ?").all(request_id) as { id: number; envelope: string; disposition: string }[],
    };
  } finally {
    db.close();
  }
};

describe("the deciding receipt is stored once", () => {
  test("settled by its arrival row: the envelope lives in the log only, and every reader gets it", () => {
    const { store, path } = fresh("once.db");
    store.recordRouteSnapshot(attempt("r1"));
    const arrival_id = store.recordReceiptArrival({ request_id: "r1", attempt_n: 0, provider_id: "p", envelope: ENVELOPE, disposition: "judged" }, 1_400);
    expect(arrival_id).toBeGreaterThan(0);
    const result = store.settleAttempt({ request_id: "r1", attempt_n: 0, ...verified, receipt: { envelope: ENVELOPE, received_at_ms: 1_400, arrival_id } }, 1_600);
    expect(result.ok).toBe(true);
    if (!result.ok) return;
    expect(result.settlement.receipt).toBe(ENVELOPE);
    expect(store.getSettlement("r1", 0)).toEqual(result.settlement);
    expect(store.listSettlements({ request_id: "r1" })).toEqual([result.settlement]);
    expect(store.listSettlements({ label: "verified" }).map((s) => s.receipt)).toEqual([ENVELOPE]);
    expect(store.ledgerAuditData().settlements.map((s) => s.receipt)).toEqual([ENVELOPE]);
    store.flushCommits();
    const stored = raw(path, "r1");
    expect(stored.settlement).toEqual({ receipt: null, receipt_id: arrival_id });
    expect(stored.log).toEqual([{ id: arrival_id, envelope: ENVELOPE, disposition: "judged" }]);
    store.close();
  });

  test("a later duplicate arrival does not change which envelope decided", () => {
    const { store } = fresh("dup.db");
    store.recordRouteSnapshot(attempt("r1"));
    const arrival_id = store.recordReceiptArrival({ request_id: "r1", attempt_n: 0, provider_id: "p", envelope: ENVELOPE, disposition: "judged" }, 1_400);
    store.settleAttempt({ request_id: "r1", attempt_n: 0, ...verified, receipt: { envelope: ENVELOPE, received_at_ms: 1_400, arrival_id } }, 1_600);
    store.recordReceiptArrival({ request_id: "r1", attempt_n: 0, provider_id: "p", envelope: "other.sig", disposition: "after_final" }, 1_700);
    expect(store.getSettlement("r1", 0)!.receipt).toBe(ENVELOPE);
    store.close();
  });

  test("settled with the envelope itself (no arrival row): stored in the settlement row, read back the same", () => {
    const { store, path } = fresh("inline.db");
    store.recordRouteSnapshot(attempt("r1"));
    const result = store.settleAttempt({ request_id: "r1", attempt_n: 0, ...verified, receipt: { envelope: ENVELOPE, received_at_ms: 1_400 } }, 1_600);
    expect(result.ok && result.settlement.receipt).toBe(ENVELOPE);
    expect(store.getSettlement("r1", 0)!.receipt).toBe(ENVELOPE);
    store.flushCommits();
    expect(raw(path, "r1").settlement).toEqual({ receipt: ENVELOPE, receipt_id: null });
    store.close();
  });
});
