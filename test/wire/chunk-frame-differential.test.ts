// The chunk decoder (src/wire/chunkFrame.ts) against the general path (msgpackr + the compiled schema
// checkers): on every input, generated or mutated, it either declines (and the general path decides)
// or yields exactly the general path's frame — same keys in the same order, same values.
import { describe, expect, test } from "bun:test";
import { Packr } from "msgpackr";
import { decodeChunkFrame } from "../../src/wire/chunkFrame.ts";
import { decodeProviderFrame, decodeProviderFrameGeneral, encodeFrame } from "../../src/wire/codec.ts";
import { rng, type Rng } from "../support/seededRandom.ts";

// ---- a msgpack writer that can choose every encoding ----

const concat = (...parts: Uint8Array[]): Uint8Array => {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
};
const be = (n: number | bigint, bytes: number): number[] => {
  const out: number[] = [];
  let v = BigInt(n);
  for (let i = 0; i < bytes; i++) {
    out.unshift(Number(v & 0xffn));
    v >>= 8n;
  }
  return out;
};

type StrForm = "fix" | "8" | "16" | "32";
function strBytes(utf8: Uint8Array, form?: StrForm): Uint8Array {
  const n = utf8.length;
  const f = form ?? (n < 32 ? "fix" : n < 256 ? "8" : n < 65536 ? "16" : "32");
  const head = f === "fix" ? [0xa0 | n] : f === "8" ? [0xd9, n] : f === "16" ? [0xda, ...be(n, 2)] : [0xdb, ...be(n, 4)];
  return concat(Uint8Array.from(head), utf8);
}
const str = (s: string, form?: StrForm) => strBytes(new TextEncoder().encode(s), form);

type IntForm = "auto" | "u8" | "u16" | "u32" | "u64" | "i8" | "i16" | "i32" | "i64" | "f32" | "f64";
function intBytes(n: number, form: IntForm = "auto"): Uint8Array {
  switch (form) {
    case "auto":
      if (n >= 0 && n < 128) return Uint8Array.of(n);
      if (n >= 0 && n < 256) return Uint8Array.of(0xcc, n);
      if (n >= 0 && n < 65536) return Uint8Array.of(0xcd, ...be(n, 2));
      if (n >= 0 && n < 2 ** 32) return Uint8Array.of(0xce, ...be(n, 4));
      return Uint8Array.of(0xcf, ...be(n, 8));
    case "u8":
      return Uint8Array.of(0xcc, ...be(n, 1));
    case "u16":
      return Uint8Array.of(0xcd, ...be(n, 2));
    case "u32":
      return Uint8Array.of(0xce, ...be(n, 4));
    case "u64":
      return Uint8Array.of(0xcf, ...be(n, 8));
    case "i8":
      return Uint8Array.of(0xd0, ...be(BigInt.asUintN(8, BigInt(n)), 1));
    case "i16":
      return Uint8Array.of(0xd1, ...be(BigInt.asUintN(16, BigInt(n)), 2));
    case "i32":
      return Uint8Array.of(0xd2, ...be(BigInt.asUintN(32, BigInt(n)), 4));
    case "i64":
      return Uint8Array.of(0xd3, ...be(BigInt.asUintN(64, BigInt(n)), 8));
    case "f32": {
      const b = new Uint8Array(5);
      b[0] = 0xca;
      new DataView(b.buffer).setFloat32(1, n);
      return b;
    }
    case "f64": {
      const b = new Uint8Array(9);
      b[0] = 0xcb;
      new DataView(b.buffer).setFloat64(1, n);
      return b;
    }
  }
}

function mapBytes(entries: [Uint8Array, Uint8Array][], form: "fix" | "16" | "32" = "fix"): Uint8Array {
  const n = entries.length;
  const head = form === "fix" ? [0x80 | n] : form === "16" ? [0xde, ...be(n, 2)] : [0xdf, ...be(n, 4)];
  return concat(Uint8Array.from(head), ...entries.flat());
}

// ---- generated frames ----

const ALPHABETS = [
  "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,;:!?-_",
  '"\\/\b\f\n\r\t\u0000\u0001\u001f\u007f',
  "éàüßçñøÅ©®°±µ¶·¼½¾",
  "中文字符日本語한국어",
  "😀🎉👍🏽🧑‍💻𝕏𐍈🀄", // astral-plane code points (surrogate pairs in UTF-16)
  "\uFFFD\uFEFF\u2028\u2029\u200B",
];

function text(r: Rng, maxLength: number): string {
  const alphabets = r.next() < 0.5 ? [ALPHABETS[0]!] : [r.pick(ALPHABETS), r.pick(ALPHABETS)];
  const n = r.int(maxLength + 1);
  let s = "";
  for (let i = 0; i < n; i++) {
    const chars = [...r.pick(alphabets)];
    s += r.pick(chars);
  }
  return s;
}

function requestId(r: Rng): string {
  switch (r.int(6)) {
    case 0:
      return "x".repeat(1 + r.int(128));
    case 1:
      return "😀".repeat(60 + r.int(6)); // 120..130 UTF-16 units around the 128 limit
    case 2:
      return "é".repeat(126 + r.int(5));
    default:
      return `req_${r.int(1e9).toString(36)}${text(r, 12)}` || "r";
  }
}

interface Fields {
  request_id: string;
  attempt_n: number;
  seq: number;
  tokens: number;
  content?: string;
}

function fields(r: Rng): Fields {
  const big = () => r.pick([0, 1, 127, 128, 255, 256, 65535, 65536, 2 ** 31, 2 ** 32 - 1, r.int(1e6)]);
  const f: Fields = { request_id: requestId(r), attempt_n: r.next() < 0.9 ? r.int(4) : r.pick([0, 127, 128, 255]), seq: r.next() < 0.7 ? r.int(100) : big(), tokens: r.next() < 0.8 ? r.int(3) : big() };
  if (r.next() < 0.85) {
    const roll = r.next();
    f.content = roll < 0.05 ? "x".repeat(70000) : roll < 0.15 ? text(r, 400) : text(r, 24);
  }
  return f;
}

const shuffle = <T>(r: Rng, xs: T[]): T[] => {
  for (let i = xs.length - 1; i > 0; i--) {
    const j = r.int(i + 1);
    [xs[i], xs[j]] = [xs[j]!, xs[i]!];
  }
  return xs;
};

type Entry = [Uint8Array, Uint8Array];
function entries(r: Rng, f: Fields): Entry[] {
  const es: Entry[] = [
    [str("type"), str("chunk")],
    [str("request_id"), str(f.request_id)],
    [str("attempt_n"), intBytes(f.attempt_n)],
    [str("seq"), intBytes(f.seq)],
    [str("tokens"), intBytes(f.tokens)],
  ];
  if (f.content !== undefined) es.push([str("content"), str(f.content)]);
  return r.next() < 0.5 ? es : shuffle(r, es);
}

// ---- mutations ----

const INVALID_UTF8 = [
  [0xc0, 0x80], // overlong NUL
  [0xed, 0xa0, 0x80], // an encoded lone surrogate
  [0xed, 0xbf, 0xbf],
  [0xe0, 0x80, 0x80], // overlong
  [0xf4, 0x90, 0x80, 0x80], // past U+10FFFF
  [0xf5, 0x80, 0x80, 0x80],
  [0xff],
  [0x80],
  [0xe2, 0x82], // truncated
  [0xf0, 0x9f, 0x98], // truncated astral
  [0xc3], // truncated at the end
  [0xef, 0xbb, 0xbf], // BOM (valid, but decoders differ on a leading one)
].map((b) => Uint8Array.from(b));

function brokenString(r: Rng): Uint8Array {
  const enc = new TextEncoder();
  const bad = r.pick(INVALID_UTF8);
  const before = enc.encode(text(r, 8));
  const after = enc.encode(text(r, r.next() < 0.3 ? 100 : 8));
  const parts = r.next() < 0.3 ? [bad, after] : [before, bad, after];
  return strBytes(concat(...parts));
}

function wrongValue(r: Rng): Uint8Array {
  return r.pick([
    () => Uint8Array.of(0xc0), // nil
    () => Uint8Array.of(0xc2), // false
    () => Uint8Array.of(0xc1), // never used
    () => Uint8Array.of(0xff), // -1
    () => intBytes(-1, "i8"),
    () => intBytes(5, "i8"),
    () => intBytes(300, "i16"),
    () => intBytes(7, "i32"),
    () => intBytes(7, "i64"),
    () => intBytes(3, "f32"),
    () => intBytes(3, "f64"),
    () => intBytes(3.5, "f64"),
    () => intBytes(2 ** 53 + 2, "f64"),
    () => intBytes(1e300, "f64"),
    () => intBytes(7, "u64"),
    () => intBytes(2 ** 60, "u64"),
    () => intBytes(0, "u8"),
    () => intBytes(1, "u16"),
    () => intBytes(255, "u32"),
    () => str("chunk"),
    () => str("7"),
    () => str(""),
    () => str("chunk", "8"),
    () => Uint8Array.of(0xc4, 2, 1, 2), // bin
    () => Uint8Array.of(0x90), // []
    () => Uint8Array.of(0x80), // {}
    () => Uint8Array.of(0xd4, 0x00, 0x00), // fixext: msgpackr's undefined
    () => Uint8Array.of(0xd6, 0xff, 0, 0, 0, 1), // timestamp ext
    () => Uint8Array.of(0x41), // a fixint in msgpackr's record range
    () => brokenString(r),
  ])();
}

const KEYS = ["type", "request_id", "attempt_n", "seq", "tokens", "content"] as const;

function mutate(r: Rng, f: Fields): Uint8Array {
  const es = entries(r, f);
  switch (r.int(14)) {
    case 0: {
      // truncate
      const whole = mapBytes(es);
      return whole.subarray(0, r.int(whole.length));
    }
    case 1: {
      // flip bytes
      const whole = mapBytes(es).slice();
      for (let k = 1 + r.int(3); k > 0; k--) whole[r.int(whole.length)] = r.next() < 0.5 ? r.int(256) : whole[r.int(whole.length)]! ^ (1 << r.int(8));
      return whole;
    }
    case 2: {
      // an extra key
      const key = r.pick(["tool_calls", "extra", "__proto__", "Type", "content ", "typ", "seqq", ""]);
      const value = key === "tool_calls" ? Uint8Array.of(0x91, 0x81, 0xa5, ...new TextEncoder().encode("index"), 0x00) : wrongValue(r);
      es.splice(r.int(es.length + 1), 0, [str(key), value]);
      return mapBytes(es);
    }
    case 3: {
      // a duplicate key, same or different value
      const dup = r.pick(es);
      es.splice(r.int(es.length + 1), 0, [dup[0], r.next() < 0.5 ? dup[1] : wrongValue(r)]);
      return mapBytes(es);
    }
    case 4: {
      // a wrong value for one key
      const i = r.int(es.length);
      es[i] = [es[i]![0], wrongValue(r)];
      return mapBytes(es);
    }
    case 5: {
      // another integer encoding of a valid number (floats and signed forms decode to the same number)
      const i = es.findIndex(([k]) => ["attempt_n", "seq", "tokens"].some((name) => k.length === name.length + 1 && new TextDecoder().decode(k.subarray(1)) === name));
      const key = new TextDecoder().decode(es[i]![0].subarray(1)) as "attempt_n" | "seq" | "tokens";
      es[i] = [es[i]![0], intBytes(f[key], r.pick(["u8", "u16", "u32", "u64", "i16", "i32", "i64", "f32", "f64"] as const))];
      return mapBytes(es);
    }
    case 6:
      // trailing bytes
      return concat(mapBytes(es), r.pick([Uint8Array.of(0), Uint8Array.of(0xc0), str("x"), mapBytes(es)]));
    case 7:
      // the same map with a wider header
      return mapBytes(es, r.pick(["16", "32"] as const));
    case 8: {
      // a missing key
      es.splice(r.int(es.length), 1);
      return mapBytes(es);
    }
    case 9: {
      // a key in a wider string form, or not a string at all
      const i = r.int(es.length);
      const name = new TextDecoder().decode(es[i]![0].subarray(1));
      es[i] = [r.next() < 0.7 ? str(name, r.pick(["8", "16", "32"] as const)) : intBytes(r.int(5)), es[i]![1]];
      return mapBytes(es);
    }
    case 10: {
      // invalid UTF-8 in request_id or content
      const key = r.next() < 0.5 ? "request_id" : "content";
      const i = es.findIndex(([k]) => new TextDecoder().decode(k.subarray(1)) === key);
      const entry: Entry = [str(key), brokenString(r)];
      if (i >= 0) es[i] = entry;
      else es.push(entry);
      return mapBytes(es);
    }
    case 11:
      // another frame type with a chunk's fields
      es[es.findIndex(([k]) => k.length === 5 && k[1] === 0x74)] = [str("type"), str(r.pick(["end", "accepted", "receipt", "heartbeat", "chunks", "Chunk"]))];
      return mapBytes(es);
    case 12: {
      // a string length that runs past the end, or a map that claims more entries
      const whole = mapBytes(es).slice();
      whole[0] = 0x80 | Math.min(15, es.length + 1 + r.int(3));
      return whole;
    }
    default: {
      // a key spelled with one byte changed (same length)
      const i = r.int(es.length);
      const k = es[i]![0].slice();
      const at = 1 + r.int(k.length - 1);
      k[at] = k[at]! ^ (1 << r.int(7));
      es[i] = [k, es[i]![1]];
      return mapBytes(es);
    }
  }
}

// ---- the comparison ----

function sameFrame(fast: object, general: object): void {
  expect(Object.keys(fast)).toEqual(Object.keys(general));
  for (const k of Object.keys(general)) {
    const a = (fast as Record<string, unknown>)[k];
    const b = (general as Record<string, unknown>)[k];
    expect(typeof a).toBe(typeof b);
    expect(Object.is(a, b)).toBe(true);
  }
  expect(Object.getPrototypeOf(fast)).toBe(Object.getPrototypeOf(general));
}

/** Compares both paths on `bytes` as a Buffer at an offset (what Bun's WebSocket hands over) and as a plain Uint8Array. */
function compare(bytes: Uint8Array): "fast" | "general" {
  const pool = Buffer.alloc(bytes.length + 16, 0xc1);
  pool.set(bytes, 7);
  const buffer = pool.subarray(7, 7 + bytes.length);
  const plain = new Uint8Array(bytes);
  let handled: "fast" | "general" = "general";
  for (const input of [buffer, plain]) {
    const general = decodeProviderFrameGeneral(input);
    const fast = decodeChunkFrame(input);
    if (fast !== undefined) {
      handled = "fast";
      expect(general.ok).toBe(true);
      if (general.ok) sameFrame(fast, general.frame);
    }
    // The entry point decides exactly as the general path does.
    expect(decodeProviderFrame(input)).toEqual(general);
  }
  return handled;
}

describe("chunk decoder vs the general path", () => {
  test("valid generated frames (any key order, every string and integer size) take the fast path", () => {
    const r = rng(1);
    let fast = 0;
    const n = 4000;
    for (let i = 0; i < n; i++) {
      const f = fields(r);
      const bytes = mapBytes(entries(r, f));
      const general = decodeProviderFrameGeneral(bytes);
      const handled = compare(bytes);
      // Declined only where the schema fails (request_id length) or a leading BOM makes decoders differ.
      const mustHandle = general.ok && !(f.content ?? "").startsWith("\uFEFF") && !f.request_id.startsWith("\uFEFF");
      if (mustHandle) expect(handled).toBe("fast");
      if (handled === "fast") fast++;
    }
    expect(fast).toBeGreaterThan(n * 0.6);
  });

  test("frames msgpackr's own packer writes take the fast path", () => {
    const r = rng(2);
    // The provider runtime's encoder, and a default one.
    const packers = [encodeFrame, (v: object) => new Packr({ useRecords: false }).pack(v)];
    for (let i = 0; i < 2000; i++) {
      const f = fields(r);
      if (!(f.request_id.length <= 128) || (f.content ?? "").startsWith("\uFEFF")) continue;
      const frame = { type: "chunk" as const, ...f };
      expect(compare(r.pick(packers)(frame))).toBe("fast");
    }
  });

  test("mutated frames: declined, or exactly the general path's frame", () => {
    const r = rng(3);
    const counts = { fast: 0, general: 0 };
    for (let i = 0; i < 20000; i++) counts[compare(mutate(r, fields(r)))]++;
    // Some mutations leave a valid plain frame (e.g. an integer's wider unsigned form).
    expect(counts.fast).toBeGreaterThan(0);
    expect(counts.general).toBeGreaterThan(counts.fast);
  }, 30_000);

  test("every truncation of a frame is declined", () => {
    const r = rng(4);
    for (let i = 0; i < 200; i++) {
      const whole = mapBytes(entries(r, fields(r)));
      const limit = Math.min(whole.length, 600);
      for (let cut = 0; cut < limit; cut++) {
        expect(decodeChunkFrame(whole.subarray(0, cut))).toBeUndefined();
        compare(whole.subarray(0, cut));
      }
    }
  }, 30_000);

  test("every single-byte value at every position: declined, or the general path's frame", () => {
    const r = rng(5);
    for (let i = 0; i < 3; i++) {
      const whole = mapBytes(entries(r, { ...fields(r), request_id: `req_${i}`, content: text(r, 6) }));
      for (let at = 0; at < whole.length; at++) {
        for (let v = 0; v < 256; v++) {
          const copy = whole.slice();
          copy[at] = v;
          compare(copy);
        }
      }
    }
  }, 30_000);

  test.each([
    ["astral content", { content: "😀𝕏🀄" }],
    ["astral request_id at 128 units", { request_id: "😀".repeat(64) }],
    ["empty content", { content: "" }],
    ["content with every escape", { content: '"\\\n\r\t\b\f\u0000\u001f\u2028' }],
    ["U+FFFD in content", { content: "a\uFFFDb" }],
    ["max uint32 counts", { seq: 2 ** 32 - 1, tokens: 2 ** 32 - 1 }],
  ])("%s", (_, overrides) => {
    const f: Fields = { request_id: "req_1", attempt_n: 1, seq: 3, tokens: 1, content: "hi", ...overrides };
    expect(compare(mapBytes(entries(rng(6), f)))).toBe("fast");
  });

  // Inputs whose general-path result could match anyway are still declined: the fast path takes only
  // the plain shape, so it never has to reproduce msgpackr's handling of anything else.
  const base = (): Entry[] => entries(rng(8), { request_id: "req_1", attempt_n: 1, seq: 3, tokens: 1, content: "hi" });
  const withValue = (key: string, value: Uint8Array): Uint8Array => mapBytes(base().map(([k, v]) => [k, new TextDecoder().decode(k.subarray(1)) === key ? value : v]));
  test.each([
    ["a duplicate key", mapBytes([...base().slice(0, 5), [str("seq"), intBytes(3)]])],
    ["a float attempt_n", withValue("attempt_n", intBytes(1, "f64"))],
    ["a float32 seq", withValue("seq", intBytes(3, "f32"))],
    ["a signed tokens", withValue("tokens", intBytes(1, "i8"))],
    ["a uint64 seq", withValue("seq", intBytes(3, "u64"))],
    ["a 0xc1 content", withValue("content", Uint8Array.of(0xc1))],
    ["an ext content", withValue("content", Uint8Array.of(0xd4, 0, 0))],
    ["a str8 type", withValue("type", str("chunk", "8"))],
    ["trailing bytes", concat(mapBytes(base()), Uint8Array.of(0xc0))],
    ["a map32 header", mapBytes(base(), "32")],
    ["tool_calls", mapBytes([...base().slice(0, 5), [str("tool_calls"), Uint8Array.of(0x90)]])],
    ...INVALID_UTF8.map((bad, i) => [`invalid or BOM UTF-8 #${i}`, withValue("content", strBytes(concat(bad, str("ok").subarray(1))))] as const),
  ])("%s is declined", (_, bytes) => {
    expect(decodeChunkFrame(bytes)).toBeUndefined();
    compare(bytes);
  });

  test.each([
    ["a BOM-led content", { content: "\uFEFFhello" }],
    ["an empty request_id", { request_id: "" }],
    ["a 129-unit request_id", { request_id: "x".repeat(129) }],
    ["an astral request_id of 130 units", { request_id: "😀".repeat(65) }],
    ["attempt_n 256", { attempt_n: 256 }],
  ])("%s is left to the general path", (_, overrides) => {
    const f: Fields = { request_id: "req_1", attempt_n: 1, seq: 3, tokens: 1, content: "hi", ...overrides };
    expect(compare(mapBytes(entries(rng(7), f)))).toBe("general");
  });
});
