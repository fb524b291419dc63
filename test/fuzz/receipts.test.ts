// Receipt verification against mutated receipts (the golden attempt of test/fixtures/receipts/):
// (a) the envelope text edited after signing never verifies; (b) a body field changed and re-signed
// with the provider's own key — what a dishonest provider can do — never verifies with more billable
// tokens than the honest receipt, and never verifies with the attempt's identity or output changed.
// No mutation may move money: a verified mutated receipt never bills more than the honest one.
import { describe, test } from "bun:test";
import { sign } from "node:crypto";
import fc from "fast-check";
import { canonicalize } from "../../src/receipts/jcs.ts";
import { verifyReceipt } from "../../src/receipts/verify.ts";
import { goldenEnvelope, goldenInput, goldenProviderKey } from "../receipts/golden-case.ts";
import { runs } from "./runs.ts";

const honest = verifyReceipt(goldenInput());
if (honest.label !== "verified") throw new Error("the golden receipt no longer verifies");
const honestUsage = honest.receipt.usage;
const body: Record<string, unknown> = JSON.parse(Buffer.from(goldenEnvelope.split(".")[0]!, "base64").toString("utf8"));

/** Fields binding the attempt's identity and output: any change must not verify. */
const BOUND = [
  "request_id", "attempt_n", "provider_id", "provider_receipt_key_id", "account_scope", "model_id", "model_hash",
  "expected_catalog_model_hash", "catalog_id", "catalog_body_digest", "route_snapshot_digest", "route_snapshot_mode",
  "route_snapshot_policy_version", "prompt_hash", "output_hash", "output_prefix_start_byte", "output_prefix_end_byte",
  "terminal_state", "receipt_version", "signature_key_alg",
];

const value = fc.oneof(
  fc.integer({ min: 0, max: 2 ** 40 }),
  fc.integer({ min: -5, max: 5 }),
  fc.string({ maxLength: 70 }),
  fc.constantFrom("normal_done", "buyer_cancel", "provider_error", "ab".repeat(32), "", null, true, 1.5, [], {}),
);

const signBody = (b: unknown): string => {
  const text = Buffer.from(canonicalize(b), "utf8");
  return `${text.toString("base64")}.${sign(null, text, goldenProviderKey).toString("base64")}`;
};

function checkMoney(envelope: string, changedBound: boolean): void {
  const verdict = verifyReceipt(goldenInput({ envelope }));
  if (verdict.label !== "verified") return;
  if (changedBound) throw new Error(`verified with a bound field changed: ${envelope}`);
  const u = verdict.receipt.usage;
  if (u.billable_input_tokens > honestUsage.billable_input_tokens || u.billable_output_tokens > honestUsage.billable_output_tokens) {
    throw new Error(`a mutated receipt bills more: ${JSON.stringify(u)}`);
  }
}

describe("receipt verification against mutated receipts (fuzzed)", () => {
  test("envelope text edited after signing never verifies", () => {
    const edit = fc.record({ at: fc.nat(), kind: fc.constantFrom("replace", "delete", "insert"), ch: fc.string({ minLength: 1, maxLength: 1, unit: "binary-ascii" }) });
    fc.assert(
      fc.property(fc.array(edit, { minLength: 1, maxLength: 3 }), (edits) => {
        let text = goldenEnvelope;
        for (const e of edits) {
          const at = e.at % text.length;
          text = e.kind === "replace" ? text.slice(0, at) + e.ch + text.slice(at + 1) : e.kind === "delete" ? text.slice(0, at) + text.slice(at + 1) : text.slice(0, at) + e.ch + text.slice(at);
        }
        if (text === goldenEnvelope) return;
        if (verifyReceipt(goldenInput({ envelope: text })).label === "verified") throw new Error(`edited envelope verified: ${text}`);
      }),
      runs(500),
    );
  }, 3_600_000);

  test("a field changed and re-signed by the provider never moves money", () => {
    const fields = Object.keys(body);
    const usageFields = Object.keys(body.usage as object);
    const change = fc.oneof(
      fc.record({ field: fc.constantFrom(...fields), value }),
      fc.record({ field: fc.constantFrom(...usageFields.map((f) => `usage.${f}`)), value }),
    );
    fc.assert(
      fc.property(fc.array(change, { minLength: 1, maxLength: 3 }), (changes) => {
        const mutated: Record<string, unknown> = structuredClone(body);
        let changedBound = false;
        for (const { field, value: v } of changes) {
          if (field.startsWith("usage.")) {
            if (typeof mutated.usage !== "object" || mutated.usage === null) continue;
            (mutated.usage as Record<string, unknown>)[field.slice(6)] = v;
          }
          else mutated[field] = v;
          if (BOUND.includes(field) && JSON.stringify(v) !== JSON.stringify(body[field])) changedBound = true;
        }
        let envelope: string;
        try {
          envelope = signBody(mutated);
        } catch {
          return; // not JSON-expressible: no provider could send it
        }
        checkMoney(envelope, changedBound);
      }),
      runs(500),
    );
  }, 3_600_000);

  test("fields added or removed never verify", () => {
    fc.assert(
      fc.property(fc.oneof(fc.constantFrom(...Object.keys(body)).map((k) => ({ drop: k })), fc.record({ add: fc.string({ minLength: 1, maxLength: 20 }), value })), (m) => {
        const mutated: Record<string, unknown> = structuredClone(body);
        if ("drop" in m) delete mutated[m.drop];
        else {
          if (m.add in mutated) return;
          mutated[m.add] = m.value;
        }
        if (verifyReceipt(goldenInput({ envelope: signBody(mutated) })).label === "verified") throw new Error(`verified with ${JSON.stringify(m)}`);
      }),
      runs(300),
    );
  }, 3_600_000);
});
