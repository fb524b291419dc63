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
    ["a rejected chunk does not advance seq (the next in-order one would pass)", 5, [frame(0, 1, "a"), frame(1, 9, "x"), frame(1, 1, "b")], ["relay", "length_limited", "relay"], 2, 2],
  ])("%s", (_, maxTokens, chunks, verdicts, tokens, bytes) => {
    const meter = new ChunkMeter(maxTokens);
    expect(chunks.map((c) => meter.accept(c))).toEqual(verdicts);
    expect(meter.deliveredTokens).toBe(tokens);
    expect(meter.deliveredBytes).toBe(bytes);
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
