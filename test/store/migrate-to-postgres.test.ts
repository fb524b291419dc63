// Moving up: `gateway store migrate --to postgres://…` copies a single node's SQLite store with a mixed
// history — paid and free traffic, a quarantine, a buyer cancel, a failover — into an empty PostgreSQL
// database; `gateway ledger audit` against the copy is clean and every balance matches to the credit.
// Real gateway, real provider frames and receipts, real PostgreSQL (test/support/postgres.ts).
import { afterAll, beforeAll, expect, test } from "bun:test";
import OpenAI from "openai";
import { openPostgresStore } from "../../src/store/postgres/index.ts";
import { flushTestGateways, MAIN, startTestGateway, waitFor, waitForReadyProviders, type TestGateway } from "../support/harness.ts";
import { postgresMissing, sharedPostgres } from "../support/postgres.ts";
import { ScriptedProvider, type Script } from "../support/scriptedProvider.ts";
import { freeBuyer, paidBuyer, type Buyer } from "../settlement/support.ts";

const MODEL = "mig-model";
const INPUT_TOKENS = 5;

let gw: TestGateway;
let first: ScriptedProvider;
let second: ScriptedProvider;
let paid: Buyer;

/** What the first provider does, by the buyer's message. */
const scripts: Record<string, Script> = {
  honest: (a) => {
    a.accept();
    a.chunk("Paid ", 1);
    a.chunk("answer.", 2);
    a.end();
  },
  quarantine: (a) => {
    a.accept();
    a.chunk("Forged.", 2);
    a.end({ receipt: { mutateEnvelope: (e) => e.slice(0, -2) + (e.endsWith("AA") ? "BB" : "AA") } });
  },
  cancel: async (a) => {
    a.accept();
    a.chunk("Cut ", 1);
    const cancel = await a.cancelled(20_000);
    a.end({ terminal_state: "buyer_cancel", receipt: { terminal_state: "buyer_cancel", boundBytes: cancel.delivered_output_bytes } });
  },
  failover: (a) => a.decline("queue_full"),
};
const honestSecond: Script = (a) => {
  a.accept();
  a.chunk("Second ", 1);
  a.chunk("serves.", 2);
  a.end();
};

const run = (args: string[]) => {
  flushTestGateways();
  const r = Bun.spawnSync(["bun", MAIN, ...args], { stdout: "pipe", stderr: "pipe" });
  return { exitCode: r.exitCode ?? -1, stdout: r.stdout.toString(), stderr: r.stderr.toString() };
};

beforeAll(async () => {
  if (postgresMissing !== null) return;
  await sharedPostgres();
  gw = await startTestGateway({ settlementMode: "enforce" }, { catalog: [MODEL] });
  const scriptOf = (a: Parameters<Script>[0]) => scripts[String(a.job.messages[0]?.content)] ?? scripts.honest!;
  first = await ScriptedProvider.connect({ url: gw.wsUrl, id: "a-first", models: [MODEL], inputTokens: INPUT_TOKENS, script: (a) => scriptOf(a)(a) });
  second = await ScriptedProvider.connect({ url: gw.wsUrl, id: "b-second", models: [MODEL], inputTokens: INPUT_TOKENS, script: honestSecond });
  await waitForReadyProviders(gw, 2);
  paid = await paidBuyer(gw, 1_000_000);
}, 120_000);

afterAll(async () => {
  await first?.close();
  await second?.close();
  await gw?.close();
});

async function streamText(client: OpenAI, content: string): Promise<string> {
  const stream = await client.chat.completions.create({ model: MODEL, messages: [{ role: "user", content }], stream: true, max_tokens: 16 });
  let text = "";
  for await (const c of stream) text += c.choices[0]?.delta.content ?? "";
  return text;
}

test.skipIf(postgresMissing !== null)(
  "a mixed SQLite history moves to PostgreSQL: audit clean on the copy, every balance identical",
  async () => {
    // Paid and free traffic, streaming and not.
    expect(await streamText(paid.client, "honest")).toBe("Paid answer.");
    const free = freeBuyer(gw);
    const body = await free.client.chat.completions.create({ model: MODEL, messages: [{ role: "user", content: "honest" }], max_tokens: 16 });
    expect(body.choices[0]?.message.content).toBe("Paid answer.");
    // A forged receipt: quarantined, never charged.
    expect(await streamText(paid.client, "quarantine")).toBe("Forged.");
    // A failover: the first provider declines, the second serves.
    expect(await streamText(paid.client, "failover")).toBe("Second serves.");
    // A buyer cancel mid-stream: charged the delivered prefix only.
    const controller = new AbortController();
    const stream = await paid.client.chat.completions.create(
      { model: MODEL, messages: [{ role: "user", content: "cancel" }], stream: true, max_tokens: 16 },
      { signal: controller.signal },
    );
    try {
      for await (const c of stream) if (c.choices[0]?.delta.content) controller.abort();
    } catch {
      // The SDK may end the iteration or throw on abort; either way the buyer is gone.
    }
    expect(controller.signal.aborted).toBe(true);

    await waitFor(async () => (await gw.gateway.store.listSettlements({ label: "pending" })).length === 0, 30_000, "every attempt settled");
    const sqlite = await gw.gateway.store.ledgerAuditData();
    const labels = new Set(sqlite.settlements.map((s) => s.label));
    expect([...labels].sort()).toEqual(["quarantined", "verified", "zero_settled"]);
    expect(sqlite.settlements.some((s) => s.delivered?.terminal_state === "buyer_cancel")).toBe(true);
    expect(sqlite.settlements.some((s) => s.payer === "promotion" && s.debit_credits > 0)).toBe(true);

    const url = await (await sharedPostgres()).emptyDatabase();
    const migrated = run(["store", "migrate", "--to", url, "--data-dir", gw.dataDir]);
    expect(migrated.stderr).toBe("");
    expect(migrated.exitCode).toBe(0);
    expect(JSON.parse(migrated.stdout)).toMatchObject({ migrated: true });
    // A database that already holds a store is refused: nothing is overwritten or merged.
    const again = run(["store", "migrate", "--to", url, "--data-dir", gw.dataDir]);
    expect(again.exitCode).toBe(1);
    expect(again.stderr).toContain("empty database");

    const audit = run(["ledger", "audit", "--database-url", url, "--data-dir", gw.dataDir]);
    expect(audit.exitCode).toBe(0);
    expect(JSON.parse(audit.stdout)).toMatchObject({ clean: true, findings: [] });

    const copy = await openPostgresStore(url);
    try {
      expect(await copy.ledgerBalances()).toEqual(await gw.gateway.store.ledgerBalances());
      expect(await copy.availableCredits(paid.accountId)).toBe(await gw.gateway.store.availableCredits(paid.accountId));
      const copied = await copy.ledgerAuditData();
      expect(copied.postings).toEqual(sqlite.postings);
      expect(copied.settlements).toEqual(sqlite.settlements);
      expect(copied.reservations).toEqual(sqlite.reservations);
      expect(await copy.listAccounts()).toEqual(await gw.gateway.store.listAccounts());
      expect(await copy.listApiKeys()).toEqual(await gw.gateway.store.listApiKeys());
      expect(await copy.listCatalogHistory()).toEqual(await gw.gateway.store.listCatalogHistory());
      // The copied keys still authenticate, and new ids continue after the copied ones.
      const granted = await copy.grantCredits(paid.accountId, 1);
      expect(granted.ok && granted.posting_id).toBe(Math.max(...sqlite.postings.map((p) => p.id)) + 1);
    } finally {
      await copy.close();
    }
  },
  180_000,
);
