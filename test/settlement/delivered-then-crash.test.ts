// A response delivered in full, then a gateway crash (SIGKILL) before its receipt arrived: the
// delivered record is persisted before the last byte reaches the buyer (before `[DONE]`, before a
// non-streaming body), so after the restart the attempt waits for its receipt and settles normally —
// the provider is paid. The kill comes the moment the buyer has the last byte.
import { afterAll, expect, test } from "bun:test";
import { rmSync } from "node:fs";
import { modelHash, spawnGatewayProcess, tempDir, testBackends, waitForRoutable, type GatewayProcess } from "../support/harness.ts";
import { ScriptedProvider, type Script } from "../support/scriptedProvider.ts";
import { cli, expectedCharge, ledgerAudit, receiptsList } from "./support.ts";

const MODEL = "crash-model";
const SEED = new Uint8Array(32).fill(0x44);
const INPUT_TOKENS = 5;
const dataDir = tempDir("gw-delivered-crash-");
// In cluster mode: this dir\'s PostgreSQL and Redis URLs, for the operator commands and every restart.
await testBackends(dataDir);
const cleanup: (() => Promise<void> | void)[] = [() => rmSync(dataDir, { recursive: true, force: true })];
afterAll(async () => {
  for (const c of cleanup.reverse()) await c();
});

function setUpDataDir(): string {
  expect(cli(["catalog", "init", "--data-dir", dataDir]).exitCode).toBe(0);
  expect(cli(["catalog", "add", "--model-id", MODEL, "--model-hash", modelHash(MODEL), "--data-dir", dataDir]).exitCode).toBe(0);
  const created = cli(["accounts", "create", "--tier", "paid", "--name", "crash-buyer", "--data-dir", dataDir]);
  const { account_id, api_key } = JSON.parse(created.stdout) as { account_id: string; api_key: string };
  expect(cli(["credits", "grant", "--account", account_id, "--credits", "100000", "--data-dir", dataDir]).exitCode).toBe(0);
  return api_key;
}

async function startServe(): Promise<GatewayProcess> {
  const gw = await spawnGatewayProcess(dataDir, ["--settlement-mode", "enforce", "--pending-deadline-ms", "20000"]);
  cleanup.push(() => gw.kill());
  return gw;
}

/** Every chunk and `end`, but the receipt is withheld until after the restart. */
const withholding: Script = (a) => {
  a.accept();
  a.chunk("All ", 2);
  a.chunk("delivered.", 1);
  a.end({ receipt: null });
};

const body = (stream: boolean) => JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "Finish, then crash." }], max_tokens: 16, stream });

/** Sends one request and SIGKILLs the gateway the moment the buyer holds the response's last byte. */
async function deliverThenKill(gw: GatewayProcess, apiKey: string, stream: boolean): Promise<string> {
  const res = await fetch(`${gw.baseURL}/chat/completions`, { method: "POST", headers: { authorization: `Bearer ${apiKey}`, "content-type": "application/json" }, body: body(stream) });
  expect(res.status).toBe(200);
  const reader = res.body!.getReader();
  const decoder = new TextDecoder();
  let text = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (value) text += decoder.decode(value, { stream: true });
    // The last byte of each kind of response: `[DONE]`, or the JSON body's closing brace.
    if (stream ? text.includes("data: [DONE]\n\n") : text.trimEnd().endsWith("}") && safeJson(text)) break;
    if (done) break;
  }
  gw.proc.kill("SIGKILL");
  await gw.proc.exited;
  return text;
}

const safeJson = (text: string) => {
  try {
    JSON.parse(text);
    return true;
  } catch {
    return false;
  }
};

test("delivered in full, then SIGKILL: after a restart each attempt waits for its receipt and settles verified", async () => {
  const apiKey = setUpDataDir();
  const charge = expectedCharge(INPUT_TOKENS, 3, 1_000_000, 1_000_000);
  for (const stream of [true, false]) {
    const gw = await startServe();
    const provider = await ScriptedProvider.connect({ url: gw.wsUrl, id: "crash-prov", seed: SEED, models: [MODEL], inputTokens: INPUT_TOKENS, script: withholding });
    cleanup.push(() => provider.close());
    await waitForRoutable(gw.url);
    const text = await deliverThenKill(gw, apiKey, stream);
    expect(text).toContain("delivered.");
    const job = provider.lastJob();
    await provider.close();

    const again = await startServe();
    expect(again.events.find((e) => e.event === "settlements_resumed")).toMatchObject({ resumed: 1, interrupted: 0 });
    const back = await ScriptedProvider.connect({ url: again.wsUrl, id: "crash-prov", seed: SEED, models: [MODEL], inputTokens: INPUT_TOKENS });
    cleanup.push(() => back.close());
    back.send({ type: "receipt", request_id: job.request_id, attempt_n: 0, receipt: provider.attempt(job.request_id).receipt() });
    expect(await back.waitForSettled(job.request_id)).toMatchObject({ label: "verified", provider_credits: charge.provider });
    await back.close();
    await again.kill();
  }
  expect(receiptsList(dataDir).map((l) => [l.label, l.reason, l.debit_credits])).toEqual([
    ["verified", null, charge.debit],
    ["verified", null, charge.debit],
  ]);
  expect(ledgerAudit(dataDir).report.findings).toEqual([]);
}, 60_000);

