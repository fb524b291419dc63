// The receipt attack table (issue 4 acceptance): each forged or mismatched receipt, signed by the
// independent test signer, is quarantined by src/receipts with its documented reason — by the
// synchronous verifier, by the inline path (every rule but the signature, then the signature with
// WebCrypto) and by the gateway's judging thread (src/receipts/judge.ts), which must agree on every case.
import { afterAll, describe, expect, test } from "bun:test";
import { createPrivateKey } from "node:crypto";
import {
  checkReceipt,
  snapshotDigest,
  verdictWithSignature,
  verifyReceipt,
  verifySignatureAsync,
  SETTLEMENT_REASONS,
  type ReceiptJudgement,
  type VerifyReceiptInput,
} from "../../src/receipts/index.ts";
import { inlineJudge, judgedOf, workerJudge, type JudgedReceipt, type ReceiptJudge } from "../../src/receipts/judge.ts";
import { fieldsOf, keyFromSeed, outputHashOf, signFields, signReceipt, type Fields, type ReceiptValues } from "./independent-signer.ts";
import { golden, goldenEnvelope, goldenInput } from "./golden-case.ts";

const providerKey = createPrivateKey(keyFromSeed(Buffer.from(golden.provider_seed_hex, "hex")).export({ format: "pem", type: "pkcs8" }));
const otherKey = keyFromSeed(new Uint8Array(32).fill(0x33));
const d = golden.delivered;

/** The golden receipt's values, for the independent signer. */
function base(overrides: Partial<ReceiptValues> = {}): ReceiptValues {
  const s = golden.snapshot;
  return {
    request_id: golden.job.request_id,
    attempt_n: 0,
    provider_id: s.provider_id,
    key: providerKey,
    account_scope: s.account_scope,
    model_id: s.model_id,
    model_hash: golden.accepted_model_hash,
    expected_catalog_model_hash: s.expected_catalog_model_hash,
    catalog_id: s.catalog_id,
    catalog_body_digest: s.catalog_body_digest,
    route_snapshot_digest: golden.route_snapshot_digest,
    route_snapshot_mode: s.route_snapshot_mode,
    route_snapshot_policy_version: s.route_snapshot_policy_version,
    prompt_hash: s.prompt_hash,
    output_hash: golden.expected.output_hash,
    start: 0,
    end: d.end_byte,
    terminal_state: "normal_done",
    terminal_state_ts_unix_ms: golden.terminal_state_ts_unix_ms,
    issued_at_unix_ms: golden.issued_at_unix_ms,
    billable_input_tokens: 31,
    billable_output_tokens: 8,
    delivered_output_bytes: d.end_byte,
    observed_input_tokens: 31,
    observed_output_tokens: 8,
    ...overrides,
  };
}

const signed = (o: Partial<ReceiptValues> = {}) => signReceipt(base(o));
const withFields = (edit: (f: Fields) => Fields) => signFields(edit(fieldsOf(base())), providerKey);
// Changes one signature character well inside the base64 text (the last ones carry padding bits).
const flipSignatureChar = (env: string) => env.slice(0, -10) + (env.at(-10) === "A" ? "B" : "A") + env.slice(-9);

/** The gateway's path (src/gateway/settlements.ts): the checks now, the signature off the main thread. */
async function verifyReceiptAsync(input: VerifyReceiptInput): Promise<ReceiptJudgement> {
  const check = checkReceipt(input);
  if (check.signature === null) return check.verdict;
  return verdictWithSignature(check, await verifySignatureAsync(check.signature.envelope, check.signature.publicKey));
}

const thread = workerJudge((error) => {
  throw new Error(`the judging thread failed: ${error}`);
});
afterAll(() => thread.stop());
const judgeWith = (judge: ReceiptJudge, input: VerifyReceiptInput) =>
  new Promise<JudgedReceipt>((resolve) => void judge.judge(input, resolve));

/** The verdict by the synchronous verifier, and the same by both of the gateway's judges. */
async function judgedOnEveryPath(input: () => VerifyReceiptInput): Promise<ReceiptJudgement> {
  const verdict = verifyReceipt(input());
  expect(await verifyReceiptAsync(input())).toEqual(verdict);
  expect(await judgeWith(inlineJudge, input())).toEqual(judgedOf(verdict));
  expect(await judgeWith(thread, input())).toEqual(judgedOf(verdict));
  return verdict;
}

test("the untouched golden receipt verifies (the table's baseline)", () => {
  expect(verifyReceipt(goldenInput({ envelope: signed() })).label).toBe("verified");
});

// Name, the verifier input, the expected reason.
const attacks: [string, () => VerifyReceiptInput, string][] = [
  ["bad signature", () => goldenInput({ envelope: flipSignatureChar(goldenEnvelope) }), "bad_signature"],
  ["payload altered after signing", () => {
    const [payload, sig] = signed().split(".");
    const text = Buffer.from(payload!, "base64").toString("utf8").replace('"billable_output_tokens":8', '"billable_output_tokens":7');
    return goldenInput({ envelope: `${Buffer.from(text).toString("base64")}.${sig}` });
  }, "bad_signature"],
  ["signed with another provider's key (its own key id)", () => goldenInput({ envelope: signed({ key: otherKey }) }), "wrong_key"],
  ["signed with another provider's key, claiming this provider's key id", () =>
    goldenInput({ envelope: signFields(fieldsOf(base()), otherKey) }), "bad_signature"],
  ["model_hash not in the catalog (and measured so at accept)", () =>
    goldenInput({ envelope: signed({ model_hash: "b".repeat(64) }), acceptedModelHash: "b".repeat(64) }), "model_hash_not_in_catalog"],
  ["model_hash ≠ the accepted measurement", () => goldenInput({ envelope: signed({ model_hash: "c".repeat(64) }) }), "measurement_mismatch"],
  ["receipt claims the catalog hash, provider measured another at accept", () =>
    goldenInput({ acceptedModelHash: "d".repeat(64) }), "measurement_mismatch"],
  ["never accepted (no measurement)", () => goldenInput({ acceptedModelHash: null }), "measurement_mismatch"],
  ["output_hash of other text with the same byte length", () => {
    const other = outputHashOf({ content: "Hallo 👋 Grüsse".slice(0, 14) + "e", finish_reason: "tool_calls", start: 0, end: d.end_byte, terminal_state: "normal_done", tool_calls: d.tool_calls });
    return goldenInput({ envelope: signed({ output_hash: other }) });
  }, "output_mismatch"],
  ["output_hash without the delivered tool call", () => {
    const other = outputHashOf({ content: d.content, finish_reason: "tool_calls", start: 0, end: d.end_byte, terminal_state: "normal_done", tool_calls: null });
    return goldenInput({ envelope: signed({ output_hash: other }) });
  }, "output_mismatch"],
  ["byte range beyond what was delivered", () =>
    goldenInput({ envelope: signed({ end: d.end_byte + 10, delivered_output_bytes: d.end_byte + 10 }) }), "byte_range"],
  ["delivered_output_bytes disagreeing with the range", () => goldenInput({ envelope: signed({ delivered_output_bytes: d.end_byte + 1 }) }), "byte_range"],
  ["prefix claimed to start later", () => goldenInput({ envelope: signed({ start: 3, delivered_output_bytes: d.end_byte - 3 }) }), "byte_range"],
  ["observed output tokens above delivered", () =>
    goldenInput({ envelope: signed({ observed_output_tokens: 9, billable_output_tokens: 9 }) }), "output_tokens_inflated"],
  ["billable output tokens above delivered", () => goldenInput({ envelope: signed({ billable_output_tokens: 9 }) }), "output_tokens_inflated"],
  ["one 'x' claiming 40 tokens: billable output above delivered bytes + tool-call bytes + 4", () => {
    const output_hash = outputHashOf({ content: "x", finish_reason: "stop", start: 0, end: 1, terminal_state: "normal_done", tool_calls: null });
    return goldenInput({
      envelope: signed({ output_hash, end: 1, delivered_output_bytes: 1, billable_output_tokens: 40, observed_output_tokens: 40 }),
      // A record that counted the 40 tokens (no edge check): the verifier's bound still refuses them.
      delivered: { output_hash, start_byte: 0, end_byte: 1, tokens: 40, terminal_state: "normal_done", tool_calls_delivered: false, tool_call_bytes: 0 },
    });
  }, "output_tokens_inflated"],
  ["observed output tokens below delivered", () =>
    goldenInput({ envelope: signed({ observed_output_tokens: 7, billable_output_tokens: 7 }) }), "output_tokens_mismatch"],
  ["prompt tokens above the gateway's bound", () => {
    const over = golden.snapshot.prompt_token_bound + 1;
    return goldenInput({ envelope: signed({ billable_input_tokens: over, observed_input_tokens: over }) });
  }, "input_tokens_inflated"],
  ["billable prompt above observed", () => goldenInput({ envelope: signed({ billable_input_tokens: 32 }) }), "billable_above_observed"],
  ["normal_done billing less than observed", () => goldenInput({ envelope: signed({ billable_input_tokens: 30 }) }), "billable_not_observed"],
  ["replayed onto another request", () =>
    goldenInput({ expected: { ...goldenInput().expected, request_id: "req_other" } }), "replayed"],
  ["replayed onto another attempt", () => goldenInput({ expected: { ...goldenInput().expected, attempt_n: 1 } }), "replayed"],
  ["replayed onto another account", () => goldenInput({ expected: { ...goldenInput().expected, account_scope: "e".repeat(64) } }), "replayed"],
  ["replayed onto another provider id (same key)", () => goldenInput({ expected: { ...goldenInput().expected, provider_id: "prov-other" } }), "replayed"],
  ["route_snapshot_digest of another snapshot", () => goldenInput({ envelope: signed({ route_snapshot_digest: "f".repeat(64) }) }), "echo_mismatch"],
  ["prompt_hash not the job's", () => goldenInput({ envelope: signed({ prompt_hash: "0".repeat(64) }) }), "echo_mismatch"],
  ["route_snapshot_mode flipped to observe", () => goldenInput({ envelope: signed({ route_snapshot_mode: "observe" }) }), "echo_mismatch"],
  ["missing field", () => goldenInput({ envelope: withFields((f) => f.filter(([k]) => k !== "catalog_id")) }), "field_set"],
  ["extra field", () => goldenInput({ envelope: withFields((f) => [...f, ["zz_extra", "1"]]) }), "field_set"],
  ["extra usage field", () =>
    goldenInput({ envelope: withFields((f) => f.map(([k, v]): [string, string] => (k === "usage" ? [k, v.replace(/}$/, ',"x":1}')] : [k, v]))) }),
    "field_set"],
  ["receipt_version other than 4", () =>
    goldenInput({ envelope: withFields((f) => f.map(([k, v]): [string, string] => (k === "receipt_version" ? [k, '"3"'] : [k, v]))) }),
    "field_invalid"],
  ["not canonical (whitespace)", () =>
    goldenInput({ envelope: withFields((f) => f.map(([k, v]): [string, string] => (k === "attempt_n" ? [k, ` ${v}`] : [k, v]))) }),
    "not_canonical"],
  ["not canonical (duplicate key)", () => goldenInput({ envelope: withFields((f) => [["account_scope", '"x"'], ...f]) }), "not_canonical"],
  ["not canonical (members out of order)", () => goldenInput({ envelope: withFields((f) => [...f].reverse()) }), "not_canonical"],
  ["not an envelope", () => goldenInput({ envelope: "hello" }), "malformed"],
  ["unpadded base64", () => goldenInput({ envelope: goldenEnvelope.replace(/=+$/, "") }), "malformed"],
  ["issued before the request started (−60 s)", () =>
    goldenInput({ envelope: signed({ issued_at_unix_ms: golden.snapshot.request_started_at_unix_ms - 60_001 }) }), "issued_at_out_of_window"],
  ["issued after arrival (+60 s)", () => goldenInput({ envelope: signed({ issued_at_unix_ms: golden.arrival_unix_ms + 60_001 }) }), "issued_at_out_of_window"],
  ["arrived after the pending deadline", () => goldenInput({ pendingDeadlineMs: golden.arrival_unix_ms - 1 }), "late"],
  ["terminal state not how the gateway saw it end", () => goldenInput({ envelope: signed({ terminal_state: "provider_error" }) }), "terminal_state_mismatch"],
];

describe("receipt attacks → quarantined", () => {
  test.each(attacks)("%s", async (_name, input, reason) => {
    expect(await judgedOnEveryPath(input)).toMatchObject({ label: "quarantined", reason });
  });

  test("every reason used is in the documented list", () => {
    for (const [, , reason] of attacks) expect(SETTLEMENT_REASONS as readonly string[]).toContain(reason);
  });
});

describe("the signature keeps its place in the rule order (every path)", () => {
  const forged = (input: VerifyReceiptInput) => ({ ...input, envelope: flipSignatureChar(input.envelope) });
  test.each([
    ["forged and replayed → bad_signature", () => forged(goldenInput({ expected: { ...goldenInput().expected, request_id: "req_other" } })), "bad_signature"],
    ["forged and issued out of window → bad_signature", () => forged(goldenInput({ envelope: signed({ issued_at_unix_ms: 0 }) })), "bad_signature"],
    ["forged and a measurement mismatch → bad_signature", () => forged(goldenInput({ acceptedModelHash: null })), "bad_signature"],
    ["forged and late → late", () => forged(goldenInput({ pendingDeadlineMs: golden.arrival_unix_ms - 1 })), "late"],
    ["forged and another key → wrong_key", () => forged(goldenInput({ envelope: signed({ key: otherKey }) })), "wrong_key"],
  ] as const)("%s", async (_name, input, reason) => {
    expect(await judgedOnEveryPath(input)).toMatchObject({ label: "quarantined", reason });
  });

  test("the golden receipt verifies on every path, its billable usage read from it", async () => {
    expect((await judgedOnEveryPath(() => goldenInput())).label).toBe("verified");
    expect(await judgeWith(thread, goldenInput())).toEqual({ verdict: { label: "verified" }, billable: { prompt_tokens: 31, completion_tokens: 8 } });
  });
});

describe("window edges are inclusive", () => {
  test.each([
    ["request start − 60 s", golden.snapshot.request_started_at_unix_ms - 60_000],
    ["arrival + 60 s", golden.arrival_unix_ms + 60_000],
  ])("%s verifies", (_n, issued) => {
    expect(verifyReceipt(goldenInput({ envelope: signed({ issued_at_unix_ms: issued }) })).label).toBe("verified");
  });
});

describe("observe mode, uncatalogued model: never verified", () => {
  test("expected hash \"\" → model_hash_not_in_catalog", () => {
    const snapshot = { ...golden.snapshot, route_snapshot_mode: "observe" as const, catalog_id: "", catalog_body_digest: "", expected_catalog_model_hash: "" };
    const digest = snapshotDigest(snapshot);
    const envelope = signed({ route_snapshot_mode: "observe", catalog_id: "", catalog_body_digest: "", expected_catalog_model_hash: "", route_snapshot_digest: digest });
    expect(verifyReceipt(goldenInput({ envelope, snapshot, snapshotDigest: digest }))).toMatchObject({
      label: "quarantined",
      reason: "model_hash_not_in_catalog",
    });
  });
});

describe("partial output (buyer cancel after the first chunk)", () => {
  const content = "Hallo ";
  const end = Buffer.byteLength(content);
  const hash = outputHashOf({ content, finish_reason: null, start: 0, end, terminal_state: "buyer_cancel", tool_calls: null });
  const partial = (o: Partial<ReceiptValues>) =>
    signed({ output_hash: hash, end, delivered_output_bytes: end, terminal_state: "buyer_cancel", observed_output_tokens: 2, billable_output_tokens: 2, ...o });
  const input = (envelope: string) =>
    goldenInput({ envelope, delivered: { output_hash: hash, start_byte: 0, end_byte: end, tokens: 2, terminal_state: "buyer_cancel" } });

  test("a receipt binding exactly the delivered prefix verifies (partial charge)", () => {
    expect(verifyReceipt(input(partial({}))).label).toBe("verified");
  });
  test("billing less than observed is allowed for a partial", () => {
    expect(verifyReceipt(input(partial({ billable_input_tokens: 20, billable_output_tokens: 1 }))).label).toBe("verified");
  });
  test("the full output's receipt does not settle a cancelled prefix", () => {
    expect(verifyReceipt(input(signed()))).toMatchObject({ label: "quarantined", reason: "terminal_state_mismatch" });
  });
  test("the whole output claimed under buyer_cancel → byte_range", () => {
    expect(verifyReceipt(input(signed({ terminal_state: "buyer_cancel" })))).toMatchObject({ label: "quarantined", reason: "byte_range" });
  });
});
