// The runtime's receipts against the real gateway in enforce mode: a real `gateway provider` process
// advertises the catalog model, a completed request and a request cancelled mid-stream both settle
// `verified`, the provider's `settled` frames land in its earnings log, and `gateway provider
// earnings` totals them.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { runProviderCommand } from "../../src/provider/cli.ts";
import { spawnProvider, startTestGateway, waitFor, waitForReadyProviders, type ProviderProcess, type TestGateway } from "../support/harness.ts";

let gw: TestGateway;
let provider: ProviderProcess;

beforeAll(async () => {
  gw = await startTestGateway({ settlementMode: "enforce" }, { catalog: ["test-model"] });
  provider = spawnProvider(gw, { id: "prov-settle", tokensPerSecond: 100 });
  await waitForReadyProviders(gw, 1);
});

afterAll(async () => {
  await provider.kill();
  await gw.close();
});

const chat = (body: Record<string, unknown>, signal?: AbortSignal) =>
  fetch(`${gw.baseURL}/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${gw.apiKey}`, "content-type": "application/json" },
    body: JSON.stringify({ model: "test-model", messages: [{ role: "user", content: "Tell me about rivers." }], ...body }),
    signal,
  });

test("completed and cancelled attempts settle verified; the provider's earnings log and command show them", async () => {
  const done = await chat({ max_tokens: 12 });
  expect(done.status).toBe(200);
  const doneId = done.headers.get("x-request-id")!;

  const abort = new AbortController();
  const stream = await chat({ max_tokens: 400, stream: true }, abort.signal);
  const reader = stream.body!.getReader();
  await reader.read();
  await reader.read();
  abort.abort();
  const cancelled = await provider.waitForEvent("cancel_received");

  const settledOf = (id: unknown) => provider.waitForEvent("settled", (e) => e.request_id === id, 5000);
  expect(await settledOf(doneId)).toMatchObject({ label: "verified", reason: null });
  const partial = await settledOf(cancelled.request_id);
  expect(partial).toMatchObject({ label: "verified", reason: null });
  expect(partial.provider_credits as number).toBeGreaterThan(0);

  const keyDir = join(gw.dataDir, "provider-keys");
  const file = join(keyDir, "earnings.jsonl");
  const lines = () => (existsSync(file) ? readFileSync(file, "utf8").trim().split("\n").filter(Boolean) : []);
  await waitFor(() => lines().length >= 2, 5000, "two earnings lines"); // appended just after the log line
  expect(lines().map((l) => JSON.parse(l).provider_id)).toEqual(["prov-settle", "prov-settle"]);

  const out: string[] = [];
  const code = await runProviderCommand(["earnings", "--key-file", join(keyDir, "prov-settle.key"), "--json"], {
    stdout: (l) => out.push(l),
    stderr: () => {},
  });
  expect(code).toBe(0);
  const summary = JSON.parse(out[0]!) as { by_label: { verified: { attempts: number; provider_credits: number } }; quarantine_reasons: object };
  expect(summary.by_label.verified.attempts).toBe(2);
  expect(summary.by_label.verified.provider_credits).toBe((await settledOf(doneId)).provider_credits as number + (partial.provider_credits as number));
  expect(summary.quarantine_reasons).toEqual({});
}, 20_000);
