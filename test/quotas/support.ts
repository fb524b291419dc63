// Shared pieces of the quota tests: a scripted provider whose answers wait behind a gate the test
// opens, buyers, and raw HTTP helpers that keep the refusal's status and headers in view.
import { expect } from "bun:test";
import OpenAI from "openai";
import type { TestGateway } from "../support/harness.ts";
import type { Script, ScriptedAttempt } from "../support/scriptedProvider.ts";

/** A script that accepts at once and answers only when `open()` is called (or at once once opened). */
export class Gate {
  private waiters: (() => void)[] = [];
  private opened = false;

  /** How a released attempt answers; tests change it between requests. */
  answer: (a: ScriptedAttempt) => void = honestAnswer;

  readonly script: Script = async (a) => {
    a.accept();
    if (!this.opened) await new Promise<void>((resolve) => this.waiters.push(resolve));
    this.answer(a);
  };

  /** Lets every held attempt (and every later one) answer. */
  open(): void {
    this.opened = true;
    for (const w of this.waiters.splice(0)) w();
  }

  /** Holds later attempts again. */
  close(): void {
    this.opened = false;
  }

  get held(): number {
    return this.waiters.length;
  }
}

export const ANSWER = ["Hello", ", ", "world", "!"];

/** Four chunks of one token, then `end` with an honest receipt. */
export function honestAnswer(a: ScriptedAttempt): void {
  for (const c of ANSWER) a.chunk(c, 1);
  a.end();
}

export interface Account {
  accountId: string;
  apiKey: string;
}

export async function newAccount(gw: TestGateway, tier: "free" | "paid", credits = 0): Promise<Account> {
  const store = gw.gateway.store;
  const { account_id } = await store.createAccount({ name: `${tier}-buyer`, tier });
  const { api_key } = await store.createApiKey({ account_id });
  if (credits > 0) expect((await store.grantCredits(account_id, credits)).ok).toBe(true);
  return { accountId: account_id, apiKey: api_key };
}

/** The official SDK, without its automatic retries (a 429 must reach the test). */
export const sdk = (gw: TestGateway, apiKey: string) => new OpenAI({ apiKey, baseURL: gw.baseURL, maxRetries: 0 });

/** POST /v1/chat/completions with fetch: status, headers and JSON body, nothing hidden by a client. */
export async function chat(
  gw: TestGateway,
  token: string,
  body: Record<string, unknown>,
  headers: Record<string, string> = {},
): Promise<{ status: number; headers: Headers; json: Record<string, any> }> {
  const response = await fetch(`${gw.baseURL}/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json", ...headers },
    body: JSON.stringify(body),
  });
  return { status: response.status, headers: response.headers, json: (await response.json()) as Record<string, any> };
}

/** The quota_exhausted answer of docs/buyer-api.md for daily quota or concurrency: 429, retryable, headers. */
export function expectQuota429(r: { status: number; headers: Headers; json: Record<string, any> }, scope: string): void {
  expect(r.status).toBe(429);
  expect(r.json.error).toMatchObject({ code: "quota_exhausted", type: "rate_limit_error", retryable: true });
  expect(r.headers.get("x-ratelimit-scope")).toBe(scope);
  for (const h of ["x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset", "retry-after"]) {
    expect(r.headers.get(h)).toMatch(/^\d+$/);
  }
  expect(r.headers.get("x-should-retry")).toBeNull();
}

/** docs/receipts.md's prompt-token bound of one user message: UTF-8 bytes + 8 + 16. */
export const boundOf = (content: string) => Buffer.byteLength(content, "utf8") + 8 + 16;

export const day = () => new Date().toISOString().slice(0, 10);
