// The prompt-token bound (docs/receipts.md) against the independent vectors (test/fixtures/receipts/prompt-bounds.json,
// made by generate.ts from the independent rule, never from src/receipts): assistant tool calls count,
// so a tool-heavy conversation's honest prompt count is not refused as `input_tokens_inflated`.
import { expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { promptTokenBound as httpBound } from "../../src/http/chat/normalize.ts";
import { promptTokenBound } from "../../src/receipts/index.ts";
import type { JobMessage } from "../../src/wire/frames.ts";
import { FIXTURES } from "./golden-case.ts";

interface BoundCase {
  name: string;
  messages: JobMessage[];
  tools?: unknown[];
  bound: number;
}
const { cases } = JSON.parse(readFileSync(join(FIXTURES, "prompt-bounds.json"), "utf8")) as { cases: BoundCase[] };

test.each(cases.map((c) => [c.name, c] as const))("%s", (_name, c) => {
  expect(promptTokenBound(c.messages, c.tools)).toBe(c.bound);
  // Admission (the HTTP layer) and verification use the one rule.
  expect(httpBound(c.messages, c.tools)).toBe(c.bound);
});

test("the vectors include a conversation whose tool calls the bound must count", () => {
  const withCalls = cases.find((c) => c.messages.some((m) => m.role === "assistant" && m.tool_calls?.length));
  expect(withCalls).toBeDefined();
  const withoutCalls = withCalls!.messages.map(({ tool_calls: _calls, ...m }) => m);
  expect(withCalls!.bound).toBeGreaterThan(promptTokenBound(withoutCalls, withCalls!.tools));
});
