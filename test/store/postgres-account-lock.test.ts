// Settlements do not take the account's lock (docs/decisions.md, "Settlements do not take the account's
// lock"): two stores (two nodes) admit and settle one paid account's requests at once, the balance
// running out under them. Admission must never hold more than the balance less the other holds, in
// any snapshot, and the ledger must audit clean afterwards.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { SQL } from "bun";
import { auditLedger, catalogLookupFrom } from "../../src/ledger/audit.ts";
import type { AsyncStore } from "../../src/store/asyncStore.ts";
import { openPostgresStore } from "../../src/store/postgres/index.ts";
import { snapshotDigest } from "../../src/receipts/index.ts";
import { canonicalize } from "../../src/receipts/jcs.ts";
import { attempt } from "../ledger/attempt-fixture.ts";
import { golden } from "../receipts/golden-case.ts";
import { postgresMissing, sharedPostgres } from "../support/postgres.ts";

const GRANT = 60_000;
const HOLD = 1_000;
const WORKERS_PER_NODE = 12;

describe.skipIf(postgresMissing !== null)("one account's admissions and settlements on two nodes", () => {
  let nodes: AsyncStore[];
  let side: SQL;
  beforeAll(async () => {
    const url = await (await sharedPostgres()).freshDatabase();
    nodes = await Promise.all([0, 1].map(() => openPostgresStore(url, { maxConnections: 8 })));
    side = new SQL(url, { max: 1 });
    await nodes[0]!.grantCredits("acct_1", GRANT);
  });
  afterAll(async () => {
    await side.close();
    await Promise.all(nodes.map((n) => n.close()));
  });

  test("concurrent reservations and settlements never hold or spend more than the balance; audit clean", async () => {
    // Observe mode, quarantined: charged without a receipt to re-verify (the audit's money checks only).
    const open = (store: AsyncStore, request_id: string) => {
      const snapshot = { ...golden.snapshot, request_id, attempt_n: 0, route_snapshot_mode: "observe" as const };
      return store.recordRouteSnapshot(attempt(request_id, 0, { mode: "observe", snapshot_json: canonicalize(snapshot), digest: snapshotDigest(snapshot) }));
    };
    let n = 0;
    let settled = 0;
    let charged = 0;
    let refusals = 0;
    const worker = async (store: AsyncStore, w: number) => {
      // Runs until the account is spent down to less than one hold (a refusal while other requests
      // hold the rest is tried again).
      for (;;) {
        const request_id = `r${w}-${++n}`;
        const r = await store.reserve({ request_id, account_id: "acct_1", payer: "buyer", day: "2026-11-27", tokens: 10, credits: HOLD });
        if (!r.ok) {
          expect(r.code).toBe("insufficient_balance");
          refusals++;
          if ((await store.ledgerBalance("buyer:acct_1")) < HOLD) return;
          await Bun.sleep(1);
          continue;
        }
        await open(store, request_id);
        // Most charges spend their whole hold (1,000 credits), one in five 800: every charge stays
        // inside its request's hold, as the gateway's do, so one admission too many overdraws.
        const prompt_tokens = n % 5 === 0 ? 1_000 : 2_000;
        const out = await store.settleAttempt({
          request_id,
          attempt_n: 0,
          label: "quarantined",
          reason: "bench",
          billed: { prompt_tokens, completion_tokens: 1_000 },
          end_request: true,
        });
        if (!out.ok) throw new Error(`settle ${request_id}: ${out.code}`);
        settled++;
        charged += out.settlement.debit_credits;
      }
    };
    // Balance less holds in one statement, sampled while the workers run: never below zero.
    let lowest = Infinity;
    let samples = 0;
    let running = true;
    const sampler = (async () => {
      while (running) {
        const [row] = await side`SELECT COALESCE((SELECT balance FROM ledger_account_totals WHERE account_id = 'buyer:acct_1'), 0)
          - COALESCE((SELECT held_credits FROM reservation_holds WHERE account_id = 'acct_1'), 0) AS free`;
        lowest = Math.min(lowest, Number((row as { free: string | number }).free));
        samples++;
      }
    })();
    await Promise.all(nodes.flatMap((store, i) => Array.from({ length: WORKERS_PER_NODE }, (_, k) => worker(store, i * 100 + k))));
    running = false;
    await sampler;

    expect(samples).toBeGreaterThan(10);
    expect(lowest).toBeGreaterThanOrEqual(0);
    // Spent down to less than one hold, never below zero, and every credit accounted for.
    const balance = await nodes[1]!.ledgerBalance("buyer:acct_1");
    expect(balance).toBe(GRANT - charged);
    expect(balance).toBeGreaterThanOrEqual(0);
    expect(balance).toBeLessThan(HOLD);
    expect(settled).toBeGreaterThanOrEqual(GRANT / HOLD);
    expect(refusals).toBeGreaterThanOrEqual(2 * WORKERS_PER_NODE);
    expect(await nodes[0]!.availableCredits("acct_1")).toBe(balance);
    const report = auditLedger(await nodes[0]!.ledgerAuditData(), catalogLookupFrom(() => undefined));
    expect(report.findings).toEqual([]);
    expect(report.clean).toBe(true);
    expect(report.checked.reservations).toBe(settled);
  }, 60_000);
});
