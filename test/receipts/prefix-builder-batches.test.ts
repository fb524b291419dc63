// DeliveredPrefixBuilder hashes content in batches: the hash, byte range and refusals must be
// exactly those of hashing the whole delivered text at once, for any chunking.
import { describe, expect, test } from "bun:test";
import { DeliveredPrefixBuilder, outputHash, type DeliveredChunk } from "../../src/receipts/index.ts";
import { JcsError } from "../../src/receipts/jcs.ts";
import { outputHashOf } from "./independent-signer.ts";

const PIECES = ["a", "ö", "€", "😀", "𝕏", '"', "\\", "\n", "\u0000", "\u001f", "\u007f", "\u2028", "\ufeff", "\ufffd", "中文", "</script>", " token"];

/** `n` chunks of 1–4 pieces each, from a seeded walk over PIECES. */
function chunks(n: number, seed: number): DeliveredChunk[] {
  let s = seed;
  const next = () => (s = (Math.imul(s, 1103515245) + 12345) >>> 0) >>> 8;
  return Array.from({ length: n }, () => {
    let content = "";
    for (let k = 1 + (next() % 4); k > 0; k--) content += PIECES[next() % PIECES.length];
    return { content, tokens: next() % 3 };
  });
}

describe("batched prefix hashing", () => {
  test.each([
    ["a few chunks", 5],
    ["just under one batch", 400],
    ["many small chunks over several batches", 5000],
  ])("%s: the same hash as outputHash of the joined text, and as an independent hasher", (_, n) => {
    const cs = chunks(n, n);
    const builder = new DeliveredPrefixBuilder(3);
    let delivered = "";
    for (const c of cs) {
      builder.add(c);
      delivered += c.content ?? "";
      // The running count is exact between batches too.
      expect(builder.deliveredBytes).toBe(Buffer.byteLength(delivered));
    }
    const end = 3 + Buffer.byteLength(delivered);
    const prefix = builder.finish("normal_done", "stop");
    expect(prefix.end_byte).toBe(end);
    expect(prefix.tokens).toBe(cs.reduce((t, c) => t + c.tokens, 0));
    const whole = { content: delivered, finish_reason: "stop", output_prefix_end_byte: end, output_prefix_start_byte: 3, terminal_state: "normal_done" as const, tool_calls: null };
    expect(prefix.output_hash).toBe(outputHash(whole));
    expect(prefix.output_hash).toBe(outputHashOf({ content: delivered, finish_reason: "stop", start: 3, end, terminal_state: "normal_done", tool_calls: null }));
  });

  test("one chunk larger than a batch, between small ones", () => {
    const cs: DeliveredChunk[] = [{ content: "x", tokens: 1 }, { content: "😀é".repeat(3000), tokens: 1 }, { content: "y", tokens: 1 }];
    const builder = new DeliveredPrefixBuilder(0);
    for (const c of cs) builder.add(c);
    const content = cs.map((c) => c.content).join("");
    const end = Buffer.byteLength(content);
    expect(builder.finish("buyer_cancel", null).output_hash).toBe(
      outputHash({ content, finish_reason: null, output_prefix_end_byte: end, output_prefix_start_byte: 0, terminal_state: "buyer_cancel", tool_calls: null }),
    );
  });

  test("a surrogate pair split over two chunks is refused at the first half, as per-chunk escaping refused it", () => {
    const builder = new DeliveredPrefixBuilder(0);
    builder.add({ content: "ok", tokens: 1 });
    expect(() => builder.add({ content: "a\ud83d", tokens: 1 })).toThrow(JcsError);
    expect(() => builder.add({ content: "\ude00b", tokens: 1 })).toThrow(JcsError);
    // The refused chunks were not counted.
    expect(builder.deliveredBytes).toBe(2);
    expect(builder.deliveredTokens).toBe(1);
  });
});
