// Shared pieces of the settlement end-to-end tests: buyers, the operator CLI as a child process, and
// the money rules of docs/ledger.md written out again here (so a shared bug in src/ledger cannot hide).
import { expect } from "bun:test";
import OpenAI from "openai";
import { flushTestGateways, MAIN, withBackendArgs, type TestGateway } from "../support/harness.ts";
import { utf8 } from "../support/scriptedProvider.ts";
import type { SettlementRow } from "../../src/store/index.ts";

export interface Buyer {
  accountId: string;
  apiKey: string;
  client: OpenAI;
}

/** A paid account with `credits` granted, and an SDK client for it. */
export async function paidBuyer(gw: TestGateway, credits: number): Promise<Buyer> {
  const { account_id } = await gw.gateway.store.createAccount({ name: "paid-buyer", tier: "paid" });
  const { api_key } = await gw.gateway.store.createApiKey({ account_id });
  expect((await gw.gateway.store.grantCredits(account_id, credits)).ok).toBe(true);
  return { accountId: account_id, apiKey: api_key, client: new OpenAI({ apiKey: api_key, baseURL: gw.baseURL, maxRetries: 0 }) };
}

/** The harness's free account, as a buyer. */
export function freeBuyer(gw: TestGateway): Buyer {
  return { accountId: gw.accountId, apiKey: gw.apiKey, client: new OpenAI({ apiKey: gw.apiKey, baseURL: gw.baseURL, maxRetries: 0 }) };
}

/** docs/receipts.md's prompt-token bound: UTF-8 bytes of every content + 8 per message + 16 (no tools). */
export const promptBound = (messages: readonly { content: string }[]) =>
  messages.reduce((n, m) => n + utf8(m.content) + 8, 16);

/** docs/ledger.md: debit rounded half up; provider floor(debit × 9000 / 10000); platform the rest. */
export function expectedCharge(promptTokens: number, completionTokens: number, promptRate: number, completionRate: number) {
  const micro = BigInt(promptTokens) * BigInt(promptRate) + BigInt(completionTokens) * BigInt(completionRate);
  const whole = micro / 1_000_000n;
  const debit = micro % 1_000_000n >= 500_000n ? whole + 1n : whole;
  const provider = (debit * 9000n) / 10000n;
  return { debit: Number(debit), provider: Number(provider), platform: Number(debit - provider) };
}

/** Runs `gateway ARGS…` as a child process (with the store and Redis URLs of the `--data-dir` it names). */
export function cli(args: string[]): { exitCode: number; stdout: string; stderr: string } {
  flushTestGateways();
  const r = Bun.spawnSync(["bun", MAIN, ...withBackendArgs(args)], { stdout: "pipe", stderr: "pipe" });
  return { exitCode: r.exitCode ?? -1, stdout: r.stdout.toString(), stderr: r.stderr.toString() };
}

/** `gateway ledger audit` on a data dir: exit code and the JSON report. */
export function ledgerAudit(dataDir: string): { exitCode: number; report: { clean: boolean; findings: unknown[]; totals: Record<string, number> } } {
  const r = cli(["ledger", "audit", "--data-dir", dataDir]);
  return { exitCode: r.exitCode, report: JSON.parse(r.stdout) };
}

export interface ReceiptLine {
  request_id: string;
  attempt_n: number;
  provider_id: string;
  label: string;
  reason: string | null;
  debit_credits: number;
  provider_credits: number;
}

/** `gateway receipts list --request-id ID --json`, one object per line. */
export function receiptsList(dataDir: string, requestId?: string): ReceiptLine[] {
  const r = cli(["receipts", "list", "--json", "--data-dir", dataDir, ...(requestId ? ["--request-id", requestId] : [])]);
  expect(r.exitCode).toBe(0);
  return r.stdout
    .split("\n")
    .filter((l) => l.trim() !== "")
    .map((l) => JSON.parse(l) as ReceiptLine);
}

/** Every ledger balance sums to zero (double entry). */
export async function expectLedgerBalanced(gw: TestGateway): Promise<void> {
  const sum = (await gw.gateway.store.ledgerBalances()).reduce((n, b) => n + b.balance, 0);
  expect(sum).toBe(0);
}

/** A settlement that has left `pending`. */
export async function settledRow(gw: TestGateway, requestId: string, attemptN = 0, timeoutMs = 5000): Promise<SettlementRow> {
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    const row = await gw.gateway.store.getSettlement(requestId, attemptN);
    if (row && row.label !== "pending") return row;
    if (performance.now() > deadline) throw new Error(`settlement ${requestId}#${attemptN} still ${row?.label ?? "missing"}`);
    await Bun.sleep(5);
  }
}
