// The per-attempt chunk meter at the edge of the request actor: seq order, the max_tokens cap, delivered
// tokens and UTF-8 bytes, and the once-per-window progress flag of the idle watchdog.
import { describe, expect, test } from "bun:test";
import { ChunkMeter, type ChunkVerdict } from "../../src/gateway/chunkMeter.ts";
import type { ChunkFrame } from "../../src/wire/frames.ts";

const frame = (seq: number, tokens: number, content?: string): ChunkFrame => ({
  type: "chunk",
  request_id: "req_1",
  attempt_n: 0,
  seq,
  tokens,
  ...(content === undefined ? {} : { content }),
});

type Row = [name: string, maxTokens: number, chunks: ChunkFrame[], verdicts: ChunkVerdict[], tokens: number, bytes: number];

describe("accept", () => {
  test.each<Row>([
    ["in-order chunks are relayed and counted", 100, [frame(0, 2, "Hel"), frame(1, 1, "lo ")], ["relay", "relay"], 3, 6],
    ["bytes are UTF-8 bytes, not characters", 100, [frame(0, 1, "wörld"), frame(1, 1, "€")], ["relay", "relay"], 2, 6 + 3],
    ["a chunk without content (tool calls, role) counts tokens, no bytes", 100, [frame(0, 1), frame(1, 2, "ab")], ["relay", "relay"], 3, 2],
    ["zero-token chunks are relayed", 1, [frame(0, 0, "a"), frame(1, 0, "b")], ["relay", "relay"], 0, 2],
    ["a skipped seq is a seq error, not counted", 100, [frame(0, 1, "a"), frame(2, 1, "c")], ["relay", "seq_error"], 1, 1],
    ["a repeated seq is a seq error", 100, [frame(0, 1, "a"), frame(0, 1, "a")], ["relay", "seq_error"], 1, 1],
    ["the first chunk must be seq 0", 100, [frame(1, 1, "a")], ["seq_error"], 0, 0],
    ["a chunk exactly reaching max_tokens is relayed", 5, [frame(0, 3, "abc"), frame(1, 2, "de")], ["relay", "relay"], 5, 5],
    ["a chunk past max_tokens is length-limited, not counted", 5, [frame(0, 3, "abc"), frame(1, 3, "def")], ["relay", "length_limited"], 3, 3],
    ["a first chunk past max_tokens is length-limited", 2, [frame(0, 3, "abc")], ["length_limited"], 0, 0],
    ["seq is checked before the cap", 2, [frame(0, 2, "ab"), frame(5, 9, "x")], ["relay", "seq_error"], 2, 2],
    ["a rejected chunk does not advance seq (the next in-order one would pass)", 5, [frame(0, 1, "a"), frame(1, 9, "xxxxxxxxx"), frame(1, 1, "b")], ["relay", "length_limited", "relay"], 2, 2],
    // The output-token bound: delivered content bytes + tool-call bytes + 4.
    ["one 'x' claiming 40 tokens passes the output bound", 64, [frame(0, 40, "x")], ["tokens_inflated"], 0, 0],
    ["up to bytes + 4 tokens are relayed", 64, [frame(0, 5, "x"), frame(1, 1, "y")], ["relay", "relay"], 6, 2],
    ["the bound is running: a later chunk passing it ends the attempt", 64, [frame(0, 2, "ab"), frame(1, 6, "c")], ["relay", "tokens_inflated"], 2, 2],
    ["multi-byte characters count their bytes", 64, [frame(0, 7, "€"), frame(1, 1, "")], ["relay", "tokens_inflated"], 7, 3],
    ["the bound is checked before the cap", 3, [frame(0, 40, "x")], ["tokens_inflated"], 0, 0],
  ])("%s", (_, maxTokens, chunks, verdicts, tokens, bytes) => {
    const meter = new ChunkMeter(maxTokens);
    expect(chunks.map((c) => meter.accept(c))).toEqual(verdicts);
    expect(meter.deliveredTokens).toBe(tokens);
    expect(meter.deliveredBytes).toBe(bytes);
  });

  test("tool-call names and arguments count toward the output bound (ids do not)", () => {
    const call = (seq: number, tokens: number): ChunkFrame => ({
      ...frame(seq, tokens),
      tool_calls: [{ index: 0, id: "call_0123456789", name: seq === 0 ? "get" : undefined, arguments: "{}" }].map(({ name, ...d }) => (name ? { ...d, name } : d)),
    });
    const meter = new ChunkMeter(64);
    // 3 + 2 bytes, + 4: 9 tokens fit; then 2 more bytes allow 2 more tokens, not 3.
    expect([meter.accept(call(0, 9)), meter.accept(call(1, 3)), meter.accept(call(1, 2))]).toEqual(["relay", "tokens_inflated", "relay"]);
    expect(meter.deliveredToolCallBytes).toBe(7);
    expect(ChunkMeter.inflatesFirst(call(0, 10))).toBe(true);
    expect(ChunkMeter.inflatesFirst(call(0, 9))).toBe(false);
  });

  test("started once a chunk was accepted", () => {
    const meter = new ChunkMeter(10);
    expect(meter.started).toBe(false);
    meter.accept(frame(3, 1, "bad"));
    expect(meter.started).toBe(false);
    meter.accept(frame(0, 1, "a"));
    expect(meter.started).toBe(true);
    expect(meter.expectedSeq).toBe(1);
  });

  test("discard forgets the delivered counts (the buffered output never reached the buyer)", () => {
    const meter = new ChunkMeter(10);
    meter.accept(frame(0, 2, "ab"));
    meter.discard();
    expect([meter.deliveredTokens, meter.deliveredBytes]).toEqual([0, 0]);
  });
});

describe("progress reporting", () => {
  test("only the first progress of a window is reported; a new window reports again", () => {
    const meter = new ChunkMeter(10);
    expect([meter.markProgress(), meter.markProgress(), meter.markProgress()]).toEqual([true, false, false]);
    meter.openWindow();
    expect([meter.markProgress(), meter.markProgress()]).toEqual([true, false]);
    meter.openWindow();
    meter.openWindow();
    expect(meter.markProgress()).toBe(true);
  });
});
