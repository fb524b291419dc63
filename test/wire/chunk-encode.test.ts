// The hand-written chunk encoder (src/wire/chunkEncode.ts) writes exactly the bytes of the general
// encoder (msgpackr, src/wire/codec.ts encodeFrame) for chunk frames built as the provider builds them
// (src/provider/attempt.ts: type, request_id, attempt_n, seq, tokens, then content / tool_calls).
import { describe, expect, test } from "bun:test";
import { encodeChunkFrame } from "../../src/wire/chunkEncode.ts";
import { decodeProviderFrame, encodeFrame } from "../../src/wire/codec.ts";
import type { ChunkFrame, ToolCallDelta } from "../../src/wire/frames.ts";
import { rng, type Rng } from "../support/seededRandom.ts";

// Code units chosen to hit every branch of UTF-8 encoding, including lone and reversed surrogates.
const UNITS = ["a", "Z", " ", "\n", '"', "\\", "\u0000", "\u007f", "\u0080", "é", "\u07ff", "\u0800", "€", "中", "\uffff", "😀", "\ud800", "\udfff", "\udc00\ud800"];
const LENGTHS = [0, 1, 2, 15, 16, 31, 32, 33, 63, 64, 65, 85, 86, 100, 255, 256, 257, 1000, 21_845, 21_846, 65_535, 65_536, 70_000];

function text(r: Rng, length: number): string {
  const mode = r.int(4);
  let s = "";
  while (s.length < length) s += mode === 0 ? "x" : mode === 1 ? r.pick(UNITS.slice(0, 4)) : r.pick(UNITS);
  return s.slice(0, length);
}

const NUMBERS = [0, 1, 31, 32, 63, 64, 127, 128, 255, 256, 65_535, 65_536, 2 ** 32 - 1, 2 ** 32, 2 ** 53 - 1, -0, -1, -32, -33, -128, -129, -32_768, -32_769, 1.5, Number.NaN, Number.POSITIVE_INFINITY];
const number = (r: Rng) => (r.int(3) === 0 ? r.pick(NUMBERS) : r.int(3) === 0 ? r.int(2 ** 32) : r.int(300));

/** A chunk frame as attempt.ts builds it: same keys, same order, absent (not undefined) optionals. */
function frame(r: Rng): ChunkFrame {
  const f: ChunkFrame = { type: "chunk", request_id: text(r, r.pick([1, 26, 31, 32, 40, 64, 70])), attempt_n: number(r), seq: number(r), tokens: number(r) };
  if (r.int(8) !== 0) f.content = text(r, r.int(3) === 0 ? r.pick(LENGTHS) : r.int(40));
  if (r.int(16) === 0) {
    const calls: ToolCallDelta[] = [{ index: r.int(4) }];
    if (r.int(2) === 0) calls[0]!.id = text(r, 10);
    if (r.int(2) === 0) calls[0]!.arguments = text(r, r.int(80));
    f.tool_calls = calls;
  }
  return f;
}

describe("encodeChunkFrame", () => {
  test("byte-identical to encodeFrame over generated frames", () => {
    for (let seed = 1; seed <= 20_000; seed++) {
      const f = frame(rng(seed));
      const fast = Buffer.from(encodeChunkFrame(f)).toString("hex");
      const general = Buffer.from(encodeFrame(f)).toString("hex");
      if (fast !== general) throw new Error(`seed ${seed}: ${fast} != ${general}`);
    }
    // ~2 s alone; more on a machine busy with the rest of the suite.
  }, 30_000);

  test("earlier frames stay intact while later ones are encoded", () => {
    const r = rng(7);
    const frames = Array.from({ length: 2000 }, () => frame(r));
    const encoded = frames.map((f) => encodeChunkFrame(f));
    frames.forEach((f, i) => expect(Buffer.from(encoded[i]!).equals(Buffer.from(encodeFrame(f)))).toBe(true));
  });

  test("the gateway decodes a typical frame back to the same chunk", () => {
    const f: ChunkFrame = { type: "chunk", request_id: "req_01HZY3", attempt_n: 0, seq: 41, tokens: 1, content: "hello, wörld 😀" };
    const decoded = decodeProviderFrame(encodeChunkFrame(f));
    expect(decoded).toEqual({ ok: true, frame: f });
  });
});
