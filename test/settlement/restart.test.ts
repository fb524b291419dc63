// Pending settlements survive a crash: a `gateway serve` child process is killed with SIGKILL while
// attempts wait for receipts (the scripted provider withholds them) and while one stream is still
// running. After a restart on the same data dir: a late `receipt` frame from the reconnected provider
// settles its attempt `verified` (judged against the persisted snapshot and delivered record), an
// attempt without one is quarantined at its persisted deadline, the attempt cut mid-stream is
// `interrupted` — every reservation is finalised or released and `gateway ledger audit` is clean.
import { afterAll, expect, test } from "bun:test";
import { rmSync } from "node:fs";
import OpenAI from "openai";
import { databasePath } from "../../src/compositionRoot.ts";
import { openStore } from "../../src/store/index.ts";
import { embeddedOnly, modelHash, spawnGatewayProcess, tempDir, testBackends, waitFor, waitForRoutable, type GatewayProcess } from "../support/harness.ts";
import { ScriptedProvider, type Script } from "../support/scriptedProvider.ts";
import { cli, expectedCharge, ledgerAudit, receiptsList } from "./support.ts";

const MODEL = "restart-model";
const messages = [{ role: "user" as const, content: "Survive this." }];
const SEED = new Uint8Array(32).fill(0x42);
const PENDING_DEADLINE_MS = 6000;
const GRANT = 100_000;
const INPUT_TOKENS = 5;

const dataDir = tempDir("gw-restart-");
// In cluster mode: this dir\'s PostgreSQL and Redis URLs, for the operator commands and every restart.
await testBackends(dataDir);
const cleanup: (() => Promise<void> | void)[] = [() => rmSync(dataDir, { recursive: true, force: true })];
afterAll(async () => {
  for (const c of cleanup.reverse()) await c();
});

function setUpDataDir(): { accountId: string; apiKey: string } {
  expect(cli(["catalog", "init", "--data-dir", dataDir]).exitCode).toBe(0);
  expect(cli(["catalog", "add", "--model-id", MODEL, "--model-hash", modelHash(MODEL), "--data-dir", dataDir]).exitCode).toBe(0);
  const created = cli(["accounts", "create", "--tier", "paid", "--name", "restart-buyer", "--data-dir", dataDir]);
  expect(created.exitCode).toBe(0);
  const { account_id, api_key } = JSON.parse(created.stdout) as { account_id: string; api_key: string };
  expect(cli(["credits", "grant", "--account", account_id, "--credits", String(GRANT), "--data-dir", dataDir]).exitCode).toBe(0);
  return { accountId: account_id, apiKey: api_key };
}

async function startServe(): Promise<GatewayProcess> {
  const gw = await spawnGatewayProcess(dataDir, ["--settlement-mode", "enforce", "--pending-deadline-ms", String(PENDING_DEADLINE_MS)]);
  cleanup.push(() => gw.kill());
  return gw;
}

/** Chunks, then `end` without its receipt (withheld). */
const withholding: Script = (a) => {
  a.accept();
  a.chunk("Still ", 2);
  a.chunk("here.", 1);
  a.end({ receipt: null });
};

test.skipIf(embeddedOnly("reads the reservations of the SQLite file after the restart (a cluster node's restart: delivered-then-crash.test.ts, test/cluster/node-failure.test.ts)"))("SIGKILL with settlements pending: after restart they resolve, reservations resolve, audit clean", async () => {
  const { accountId, apiKey } = setUpDataDir();
  const first = await startServe();
  const plan: Script[] = [
    withholding, // A: its receipt comes after the restart
    withholding, // B: its receipt never comes
    (a) => {
      // C: still streaming when the gateway dies
      a.accept();
      a.chunk("Cut ", 1);
    },
  ];
  const provider = await ScriptedProvider.connect({ url: first.wsUrl, id: "restart-prov", seed: SEED, models: [MODEL], inputTokens: INPUT_TOKENS, script: (a) => plan.shift()!(a) });
  await waitForRoutable(first.url);
  const client = new OpenAI({ apiKey, baseURL: first.baseURL, maxRetries: 0 });

  for (let i = 0; i < 2; i++) {
    const done = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 16 });
    expect(done.choices[0]?.message.content).toBe("Still here.");
  }
  const [jobA, jobB] = provider.jobs;
  const stream = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 16, stream: true });
  const iterator = stream[Symbol.asyncIterator]();
  expect((await iterator.next()).value?.choices[0]?.delta.content).toBe("Cut ");
  const jobC = provider.jobs[2]!;
  const readRest = (async () => {
    try {
      for (let r = await iterator.next(); !r.done; r = await iterator.next());
    } catch {}
  })();

  const beforeKill = receiptsList(dataDir);
  expect(beforeKill.map((l) => [l.request_id, l.label])).toEqual([
    [jobA!.request_id, "pending"],
    [jobB!.request_id, "pending"],
    [jobC.request_id, "pending"],
  ]);

  await first.kill();
  expect(first.proc.signalCode).toBe("SIGKILL");
  await readRest;
  await provider.close();

  // Restart on the same data dir; the provider reconnects with the same key and re-sends A's receipt.
  const second = await startServe();
  expect(second.events.find((e) => e.event === "settlements_resumed")).toMatchObject({ resumed: 2, interrupted: 1 });
  const back = await ScriptedProvider.connect({ url: second.wsUrl, id: "restart-prov", seed: SEED, models: [MODEL], inputTokens: INPUT_TOKENS });
  cleanup.push(() => back.close());
  const attemptA = provider.attempt(jobA!.request_id);
  back.send({ type: "receipt", request_id: jobA!.request_id, attempt_n: 0, receipt: attemptA.receipt() });
  expect(await back.waitForSettled(jobA!.request_id)).toMatchObject({ label: "verified", provider_credits: expectedCharge(INPUT_TOKENS, 3, 1e6, 1e6).provider });
  // B waits out its persisted deadline.
  expect(await back.waitForSettled(jobB!.request_id, 0, PENDING_DEADLINE_MS + 5000)).toMatchObject({ label: "quarantined", reason: "no_receipt" });

  const charge = expectedCharge(INPUT_TOKENS, 3, 1_000_000, 1_000_000);
  expect(receiptsList(dataDir).map((l) => [l.request_id, l.label, l.reason, l.debit_credits])).toEqual([
    [jobA!.request_id, "verified", null, charge.debit],
    [jobB!.request_id, "quarantined", "no_receipt", 0],
    [jobC.request_id, "quarantined", "interrupted", 0],
  ]);
  const audit = ledgerAudit(dataDir);
  expect(audit.report.findings).toEqual([]);
  expect(audit.exitCode).toBe(0);

  // Reservations: A finalised at its charge, B and C released; nothing left held.
  await second.kill();
  const store = openStore(databasePath(dataDir));
  try {
    expect(store.getReservation(jobA!.request_id)).toMatchObject({ state: "finalised", used_credits: charge.debit });
    expect(store.getReservation(jobB!.request_id)).toMatchObject({ state: "released", used_credits: 0 });
    expect(store.getReservation(jobC.request_id)).toMatchObject({ state: "released", used_credits: 0 });
    expect(store.ledgerBalance(`buyer:${accountId}`)).toBe(GRANT - charge.debit);
    expect(store.availableCredits(accountId)).toBe(GRANT - charge.debit);
    expect(store.ledgerBalance("provider:restart-prov")).toBe(charge.provider);
  } finally {
    store.close();
  }
  expect(provider.errors).toEqual([]);
  expect(back.errors).toEqual([]);
}, 40_000);
