// A request is charged at the price it was admitted at. Its reservation's hold was computed from the
// admission's rates; a catalog signed while the request runs may move its model to a dearer rate-card
// row, and the failover attempt dispatched after that must still be priced at the admission's row, so
// that the charge stays within the hold (docs/ledger.md, "Reservations").
import { afterAll, beforeAll, expect, test } from "bun:test";
import { catalogModel, modelHash, startTestGateway, waitFor, waitForReadyProviders, type TestGateway } from "../support/harness.ts";
import { ScriptedProvider, type Script } from "../support/scriptedProvider.ts";
import { cli, ledgerAudit, paidBuyer, settledRow } from "./support.ts";

const MODEL = "moving-model";
const PREMIUM = { slug: "premium", prompt_credits_per_million: 10_000_000, completion_credits_per_million: 10_000_000 };
const messages = [{ role: "user" as const, content: "Price me." }];

let gw: TestGateway;
const providers: ScriptedProvider[] = [];
let releaseFirst!: () => void;
const firstHeld = new Promise<void>((r) => (releaseFirst = r));
let firstArrived!: () => void;
const firstJob = new Promise<void>((r) => (firstArrived = r));

// The first attempt waits (the catalog changes meanwhile), then fails before its first byte; the
// failover attempt, on the other provider, answers.
let held = false;
const script: Script = async (a) => {
  if (!held) {
    held = true;
    firstArrived();
    await firstHeld;
    a.decline("queue_full");
    return;
  }
  a.accept();
  a.chunk("Hello", 1);
  a.chunk(" there", 1);
  a.end();
};

beforeAll(async () => {
  gw = await startTestGateway({ settlementMode: "enforce", rateCard: JSON.stringify([PREMIUM]) }, { catalog: [catalogModel(MODEL)] });
  for (const id of ["price-a", "price-b"]) providers.push(await ScriptedProvider.connect({ url: gw.wsUrl, id, models: [MODEL], script, inputTokens: 5 }));
  await waitForReadyProviders(gw, 2);
});

afterAll(async () => {
  for (const p of providers) await p.close();
  await gw.close();
});

test("a catalog signed mid-request moves the model to a dearer row: the failover attempt is charged at the admitted row, within the hold", async () => {
  const buyer = await paidBuyer(gw, 1_000_000);
  const answer = buyer.client.chat.completions.create({ model: MODEL, messages, max_tokens: 2 });
  await firstJob;
  const requestId = providers.flatMap((p) => p.jobs)[0]!.request_id;
  const hold = (await gw.gateway.store.getReservation(requestId))!.credits;

  // Another process moves the model to the premium row; the running gateway loads the new catalog.
  const moved = cli(["catalog", "add", "--model-id", MODEL, "--model-hash", modelHash(MODEL), "--rate-card-row", "premium", "--replace", "--data-dir", gw.dataDir]);
  expect(moved.exitCode).toBe(0);
  await waitFor(() => gw.gateway.catalog.current()?.body.models.find((m) => m.model_id === MODEL)?.rate_card_row === "premium", 8000, "the premium catalog in force");

  releaseFirst();
  const completion = await answer;
  expect(completion.choices[0]?.message.content).toBe("Hello there");

  const served = await settledRow(gw, requestId, 1);
  expect(served.label).toBe("verified");
  // The admission's row (default: 1,000,000 credits a million tokens each way), not premium's.
  expect(served.rates).toEqual({ prompt_credits_per_million: 1_000_000, completion_credits_per_million: 1_000_000, provider_share_bps: 9000 });
  expect(served.debit_credits).toBe(5 + 2);
  // The hold: the prompt bound (9 bytes + 8 + 16) and max_tokens at the admission's row. Priced at the
  // premium row instead, this attempt would have cost (5 + 2) × 10 = 70.
  expect(hold).toBe(33 + 2);
  expect(served.debit_credits).toBeLessThanOrEqual(hold);
  await waitFor(async () => (await gw.gateway.store.getReservation(requestId))?.state === "finalised", 5000, "the reservation to resolve");
  expect((await gw.gateway.store.getReservation(requestId))!.used_credits).toBe(served.debit_credits);

  // A request admitted after the change is priced at the new row.
  const after = await buyer.client.chat.completions.create({ model: MODEL, messages, max_tokens: 2 });
  expect(after.choices[0]?.message.content).toBe("Hello there");
  const laterId = providers.flatMap((p) => p.jobs).at(-1)!.request_id;
  const later = await settledRow(gw, laterId, 0);
  expect(later.rates.prompt_credits_per_million).toBe(PREMIUM.prompt_credits_per_million);
  expect(later.debit_credits).toBe((5 + 2) * 10);
  expect(ledgerAudit(gw.dataDir).report.clean).toBe(true);
});
