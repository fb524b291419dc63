// The golden receipt (test/fixtures/receipts/, made by the independent signer) against src/receipts:
// every hash src computes equals the fixture's, the gateway verifier accepts it, the provider runtime's
// signer reproduces it byte for byte, and the stand-alone verifier calls it valid.
import { describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { parseHistoryLine } from "../../src/catalog/history.ts";
import { priceUsage } from "../../src/ledger/money.ts";
import {
  accountScope,
  createReceiptSigner,
  DeliveredPrefixBuilder,
  deliveredPrefixOf,
  jobRouteOf,
  outputHash,
  parseEnvelope,
  promptHash,
  receiptKeyId,
  routeSnapshotChecker,
  snapshotDigest,
  ToolCallAssembler,
  verifyReceipt,
} from "../../src/receipts/index.ts";
import { verifyStandalone } from "../../src/receipts/standalone.ts";
import { golden, goldenEnvelope, goldenHistoryPath, goldenInput, goldenProviderKey, goldenPublicKey } from "./golden-case.ts";

describe("src/receipts computes the golden hashes", () => {
  test("prompt_hash", () => {
    expect(promptHash(golden.job)).toBe(golden.expected.prompt_hash);
  });

  test("route snapshot: valid schema, digest", () => {
    expect(routeSnapshotChecker.Check(golden.snapshot)).toBe(true);
    expect(snapshotDigest(golden.snapshot)).toBe(golden.route_snapshot_digest);
  });

  test("account_scope and provider_receipt_key_id", () => {
    expect(accountScope(new TextEncoder().encode(golden.gateway_secret_utf8), golden.account_id)).toBe(golden.expected.account_scope);
    expect(receiptKeyId(goldenPublicKey)).toBe(golden.provider_receipt_key_id);
  });

  test("tool-call deltas assemble into the delivered calls", () => {
    const assembler = new ToolCallAssembler();
    for (const c of golden.chunks) if (c.tool_calls) assembler.add(c.tool_calls);
    expect(assembler.result()).toEqual(golden.delivered.tool_calls);
  });

  test("output_hash: from the whole object and streamed chunk by chunk", () => {
    const d = golden.delivered;
    expect(
      outputHash({
        content: d.content,
        finish_reason: d.finish_reason,
        output_prefix_end_byte: d.end_byte,
        output_prefix_start_byte: d.start_byte,
        terminal_state: d.terminal_state,
        tool_calls: d.tool_calls,
      }),
    ).toBe(golden.expected.output_hash);
    const streamed = deliveredPrefixOf(golden.chunks, d.terminal_state, d.finish_reason);
    expect(streamed).toEqual({
      output_hash: golden.expected.output_hash,
      start_byte: 0,
      end_byte: d.end_byte,
      tokens: d.tokens,
      terminal_state: d.terminal_state,
      finish_reason: d.finish_reason,
      tool_calls_delivered: true,
      // "get_time" + '{"tz":' + '"UTC"}': the tool-call names and arguments the chunks carry.
      tool_call_bytes: 8 + 6 + 6,
    });
  });
});

describe("the golden envelope", () => {
  test("parses with exactly the v0.4 field set", () => {
    const parsed = parseEnvelope(goldenEnvelope);
    expect(parsed.ok).toBe(true);
  });

  test("the gateway verifier accepts it", () => {
    expect(verifyReceipt(goldenInput()).label).toBe("verified");
  });

  test("the provider runtime's signer reproduces it byte for byte (Ed25519 is deterministic)", () => {
    const signer = createReceiptSigner(goldenProviderKey, golden.snapshot.provider_id);
    const job = { ...golden.job, route: jobRouteOf(golden.snapshot) };
    const prefix = deliveredPrefixOf(golden.chunks, golden.delivered.terminal_state, golden.delivered.finish_reason);
    const envelope = signer.sign({
      job,
      model_hash: golden.accepted_model_hash,
      prefix,
      observed_input_tokens: golden.observed_input_tokens,
      terminal_state_ts_unix_ms: golden.terminal_state_ts_unix_ms,
      issued_at_unix_ms: golden.issued_at_unix_ms,
    });
    expect(envelope).toBe(goldenEnvelope);
  });

  test("the stand-alone verifier calls it valid against the catalog history", () => {
    const history = readFileSync(goldenHistoryPath, "utf8")
      .trim()
      .split("\n")
      .map((line) => {
        const parsed = parseHistoryLine(line);
        if (!parsed.ok) throw new Error(parsed.message);
        return {
          catalog_id: parsed.feed.body.catalog_id,
          body_digest: parsed.feed.digest,
          issued_at_ms: parsed.feed.issued_at_ms,
          models: parsed.feed.body.models,
        };
      });
    expect(verifyStandalone({ envelope: goldenEnvelope, providerPublicKey: goldenPublicKey, history })).toEqual(
      golden.expected.verify_receipt as never,
    );
  });

  test("its billable usage prices to the fixture's charge at the snapshot's rates", () => {
    const parsed = parseEnvelope(goldenEnvelope);
    if (!parsed.ok) throw new Error(parsed.code);
    const u = parsed.envelope.body.usage;
    expect(priceUsage(u.billable_input_tokens, u.billable_output_tokens, golden.snapshot)).toEqual({ ok: true, charge: golden.expected.charge });
  });
});

test("DeliveredPrefixBuilder streams the same hash as outputHash for awkward text", () => {
  const pieces = ["", "\u0000\u001f\"\\", "€😀\ufb33", "\u007f</script>", "line\nbreak\r\ttab"];
  const builder = new DeliveredPrefixBuilder(7);
  for (const p of pieces) builder.add({ content: p, tokens: 1 });
  const content = pieces.join("");
  const end = 7 + Buffer.byteLength(content);
  expect(builder.finish("buyer_cancel", null).output_hash).toBe(
    outputHash({ content, finish_reason: null, output_prefix_end_byte: end, output_prefix_start_byte: 7, terminal_state: "buyer_cancel", tool_calls: null }),
  );
});
