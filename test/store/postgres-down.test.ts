// PostgreSQL stopped for 5 s under light load: buyers get a clear retryable 503, no process crashes,
// nothing is half-written, service is full again once the database is back (no restart), and the
// ledger audit is clean. A real gateway on a private PostgreSQL (test/support/postgres.ts).
import { afterAll, beforeAll, expect, test } from "bun:test";
import { auditLedger, catalogLookupFrom } from "../../src/ledger/audit.ts";
import { startTestGateway, waitFor, waitForReadyProviders, type TestGateway } from "../support/harness.ts";
import { postgresMissing, startPostgres, type PostgresServer } from "../support/postgres.ts";
import { ScriptedProvider, honestScript } from "../support/scriptedProvider.ts";

const MODEL = "down-model";
let pg: PostgresServer;
let gw: TestGateway;
let provider: ScriptedProvider;

beforeAll(async () => {
  if (postgresMissing !== null) return;
  pg = await startPostgres();
  gw = await startTestGateway({ settlementMode: "enforce", databaseUrl: await pg.freshDatabase() }, { catalog: [MODEL] });
  provider = await ScriptedProvider.connect({ url: gw.wsUrl, id: "down-prov", models: [MODEL], inputTokens: 5, script: honestScript });
  await waitForReadyProviders(gw, 1);
}, 120_000);

afterAll(async () => {
  await provider?.close();
  await gw?.close();
  pg?.destroy();
});

const ask = () =>
  fetch(`${gw.baseURL}/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${gw.apiKey}`, "content-type": "application/json" },
    body: JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "still there?" }], max_tokens: 8 }),
  });

test.skipIf(postgresMissing !== null)(
  "database down for 5 s: retryable 503s, then full service without a restart, audit clean",
  async () => {
    expect((await ask()).status).toBe(200);

    pg.stop();
    const downSince = performance.now();
    const during: { status: number; body: { error?: { code?: string; retryable?: boolean } } }[] = [];
    while (performance.now() - downSince < 5000) {
      const r = await ask();
      during.push({ status: r.status, body: (await r.json()) as never });
      await Bun.sleep(250);
    }
    expect(during.length).toBeGreaterThan(0);
    for (const r of during) {
      expect(r.status).toBe(503);
      expect(r.body.error).toMatchObject({ code: "coordinator_unavailable", retryable: true });
    }
    expect(gw.gateway.store.health()).toMatchObject({ backend: "postgres", up: false });
    const health = await fetch(`${gw.url}/healthz`);
    expect(health.status).toBe(503);
    expect(await health.json()).toMatchObject({ ok: false, store: { backend: "postgres", up: false } });
    expect(await (await fetch(`${gw.url}/metrics`)).text()).toContain("gateway_store_up 0");

    pg.start();
    // Service returns by itself: the pool reconnects on the next use.
    await waitFor(async () => (await ask()).status === 200, 30_000, "service back");
    for (let i = 0; i < 3; i++) expect((await ask()).status).toBe(200);
    await waitFor(() => gw.gateway.store.health().up, 10_000, "the store reports up");
    expect(await (await fetch(`${gw.url}/healthz`)).json()).toMatchObject({ ok: true, store: { backend: "postgres", up: true } });
    expect(await (await fetch(`${gw.url}/metrics`)).text()).toContain("gateway_store_up 1");

    await waitFor(async () => (await gw.gateway.store.listSettlements({ label: "pending" })).length === 0, 30_000, "every attempt settled");
    const history = new Map((await gw.gateway.store.listCatalogHistory()).map((e) => [e.catalog_id, e]));
    const report = auditLedger(await gw.gateway.store.ledgerAuditData(), catalogLookupFrom((id) => history.get(id)));
    expect(report.findings).toEqual([]);
    expect(report.clean).toBe(true);
    // Nothing half-written: every reservation resolved, none of the refused requests left a row.
    const data = await gw.gateway.store.ledgerAuditData();
    expect(data.reservations.every((r) => r.state !== "held")).toBe(true);
    expect(data.settlements.every((s) => s.label === "verified")).toBe(true);
  },
  180_000,
);
