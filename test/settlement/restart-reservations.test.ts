// After a crash no request is still running: a reservation held for a request that had not reached
// (or was between) provider attempts is released at start, not held forever.
import { expect, test } from "bun:test";
import { rmSync } from "node:fs";
import { join } from "node:path";
import { createSettlements } from "../../src/gateway/settlements.ts";
import { buildRateCard } from "../../src/ledger/index.ts";
import { silentLog } from "../../src/log.ts";
import { asyncStore } from "../../src/store/asyncStore.ts";
import { openStore } from "../../src/store/index.ts";
import { tempDir } from "../support/harness.ts";

test("resumePending releases held reservations of requests the crash cut before any attempt", async () => {
  const dir = tempDir();
  try {
    const path = join(dir, "gateway.db");
    const before = openStore(path);
    const { account_id } = before.createAccount({ tier: "free" });
    const day = "2026-11-22";
    expect(before.reserve({ request_id: "req_aa", account_id, payer: "promotion", day, tokens: 500, credits: 500, daily_token_limit: 1000 }).ok).toBe(true);
    // The quota is held: a second request of 600 tokens does not fit beside it.
    expect(before.reserve({ request_id: "req_bb", account_id, payer: "promotion", day, tokens: 600, credits: 600, daily_token_limit: 1000 })).toMatchObject({
      ok: false,
      code: "quota_exhausted",
    });
    before.close();

    const store = openStore(path);
    const card = buildRateCard();
    if (!card.ok) throw new Error(card.message);
    const settlements = createSettlements({
      store: asyncStore(store),
      now: Date.now,
      mode: "enforce",
      pendingDeadlineMs: 300_000,
      gatewaySecret: new Uint8Array(32),
      catalog: () => null,
      rateCard: () => card.card,
      sendToProvider: () => {},
      log: silentLog,
    });
    await settlements.resumePending();
    expect((await store.getReservation("req_aa"))?.state).toBe("released");
    expect((await store.reserve({ request_id: "req_cc", account_id, payer: "promotion", day, tokens: 600, credits: 600, daily_token_limit: 1000 })).ok).toBe(true);
    settlements.stop();
    await store.close();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
