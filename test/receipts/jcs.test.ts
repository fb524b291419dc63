// RFC 8785 (JCS) against the RFC's own published examples and the RFC author's test data
// (cyberphone/json-canonicalization testdata/). Expected outputs are copied from those texts, never
// computed by the code under test.
import { describe, expect, test } from "bun:test";
import { canonicalBytes, canonicalize, inCanonicalOrder, JcsError } from "../../src/receipts/jcs.ts";

describe("RFC 8785 §3.2.2 / §3.2.4: the main example", () => {
  // The input text as printed in the RFC (JSON.parse reads the numbers as IEEE doubles, as the RFC assumes).
  const input = `{
    "numbers": [333333333.33333329, 1E30, 4.50,
                2e-3, 0.000000000000000000000000001],
    "string": "\\u20ac$\\u000F\\u000aA'\\u0042\\u0022\\u005c\\\\\\"\\/",
    "literals": [null, true, false]
  }`;
  const expected = `{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\\u000f\\nA'B\\"\\\\\\\\\\"/"}`;

  test("canonical text", () => {
    expect(canonicalize(JSON.parse(input))).toBe(expected);
  });

  test("canonical UTF-8 bytes, as printed in §3.2.4", () => {
    const hex = `
      7b 22 6c 69 74 65 72 61 6c 73 22 3a 5b 6e 75 6c 6c 2c 74 72
      75 65 2c 66 61 6c 73 65 5d 2c 22 6e 75 6d 62 65 72 73 22 3a
      5b 33 33 33 33 33 33 33 33 33 2e 33 33 33 33 33 33 33 2c 31
      65 2b 33 30 2c 34 2e 35 2c 30 2e 30 30 32 2c 31 65 2d 32 37
      5d 2c 22 73 74 72 69 6e 67 22 3a 22 e2 82 ac 24 5c 75 30 30
      30 66 5c 6e 41 27 42 5c 22 5c 5c 5c 5c 5c 22 2f 22 7d`.replace(/\s+/g, "");
    expect(Buffer.from(canonicalBytes(JSON.parse(input))).toString("hex")).toBe(hex);
  });
});

test("RFC 8785 §3.2.3: members sorted by UTF-16 code units (emoji surrogates before U+FB33)", () => {
  const input = `{
    "\\u20ac": "Euro Sign",
    "\\r": "Carriage Return",
    "\\ufb33": "Hebrew Letter Dalet With Dagesh",
    "1": "One",
    "\\ud83d\\ude00": "Emoji: Grinning Face",
    "\\u0080": "Control",
    "\\u00f6": "Latin Small Letter O With Diaeresis"
  }`;
  const expected =
    '{"\\r":"Carriage Return","1":"One","\u0080":"Control","\u00f6":"Latin Small Letter O With Diaeresis",' +
    '"\u20ac":"Euro Sign","\ud83d\ude00":"Emoji: Grinning Face","\ufb33":"Hebrew Letter Dalet With Dagesh"}';
  expect(canonicalize(JSON.parse(input))).toBe(expected);
});

describe("RFC 8785 Appendix B: number serialization", () => {
  // IEEE 754 bit patterns and their canonical text, as tabulated in the RFC.
  const vectors: [string, string][] = [
    ["0000000000000000", "0"],
    ["8000000000000000", "0"],
    ["0000000000000001", "5e-324"],
    ["8000000000000001", "-5e-324"],
    ["7fefffffffffffff", "1.7976931348623157e+308"],
    ["ffefffffffffffff", "-1.7976931348623157e+308"],
    ["4340000000000000", "9007199254740992"],
    ["c340000000000000", "-9007199254740992"],
    ["4430000000000000", "295147905179352830000"],
    ["44b52d02c7e14af5", "9.999999999999997e+22"],
    ["44b52d02c7e14af6", "1e+23"],
    ["44b52d02c7e14af7", "1.0000000000000001e+23"],
    ["444b1ae4d6e2ef4e", "999999999999999700000"],
    ["444b1ae4d6e2ef4f", "999999999999999900000"],
    ["444b1ae4d6e2ef50", "1e+21"],
    ["3eb0c6f7a0b5ed8c", "9.999999999999997e-7"],
    ["3eb0c6f7a0b5ed8d", "0.000001"],
    ["41b3de4355555553", "333333333.3333332"],
    ["41b3de4355555554", "333333333.33333325"],
    ["41b3de4355555555", "333333333.3333333"],
    ["41b3de4355555556", "333333333.3333334"],
    ["41b3de4355555557", "333333333.33333343"],
    ["becbf647612f3696", "-0.0000033333333333333333"],
    ["43143ff3c1cb0959", "1424953923781206.2"],
  ];
  const fromBits = (hex: string) => new DataView(Buffer.from(hex, "hex").buffer).getFloat64(0, false);

  test.each(vectors)("%s → %s", (bits, text) => {
    expect(canonicalize(fromBits(bits))).toBe(text);
  });

  test.each([["7fffffffffffffff"], ["7ff0000000000000"], ["fff0000000000000"]])("%s (NaN/Infinity) is an error", (bits) => {
    expect(() => canonicalize(fromBits(bits))).toThrow(JcsError);
  });
});

describe("cyberphone/json-canonicalization testdata", () => {
  test("values.json", () => {
    const input = `{
  "numbers": [1E30, 4.50, 333333333.33333329, 2e-3, 0.000000000000000000000000001],
  "escaping": "\\u20ac$\\u000F\\u000aA'\\u0042\\u0022\\u005c\\\\\\"\\/",
  "literals": [null, true, false]
}`;
    expect(canonicalize(JSON.parse(input))).toBe(
      `{"escaping":"€$\\u000f\\nA'B\\"\\\\\\\\\\"/","literals":[null,true,false],"numbers":[1e+30,4.5,333333333.3333333,0.002,1e-27]}`,
    );
  });

  test("weird.json: non-ASCII keys, U+007F written as is, `</script>`", () => {
    const input = `{
  "\\u20ac": "Euro Sign",
  "1": "One",
  "\\u0080": "Control\\u007f",
  "\\ud83d\\ude02": "Smiley",
  "\\u00f6": "Latin Small Letter O With Diaeresis",
  "\\ufb33": "Hebrew Letter Dalet With Dagesh",
  "</script>": "Browser Challenge"
}`;
    expect(canonicalize(JSON.parse(input))).toBe(
      '{"1":"One","</script>":"Browser Challenge","\u0080":"Control\u007f","\u00f6":"Latin Small Letter O With Diaeresis",' +
        '"\u20ac":"Euro Sign","\ud83d\ude02":"Smiley","\ufb33":"Hebrew Letter Dalet With Dagesh"}',
    );
  });
});

describe("outside I-JSON is refused, never silently changed", () => {
  test.each<[string, unknown]>([
    ["lone high surrogate", "\ud800"],
    ["lone low surrogate key", { "\udc00": 1 }],
    ["undefined member", { a: undefined }],
    ["sparse array hole", [1, , 2]], // eslint-disable-line no-sparse-arrays
    ["bigint", 1n],
    ["Date", new Date(0)],
    ["function", () => 1],
  ])("%s", (_name, value) => {
    expect(() => canonicalize(value)).toThrow(JcsError);
    // Also inside an object whose members need sorting (the writer's path, not JSON.stringify's).
    expect(() => canonicalize({ z: 0, a: [value] })).toThrow(JcsError);
  });

  test("control characters use the short escapes or lowercase \\u00xx", () => {
    expect(canonicalize("\b\t\n\f\r\u0000\u001f\u007f")).toBe('"\\b\\t\\n\\f\\r\\u0000\\u001f\u007f"');
  });

  test("nesting deeper than the limit is refused", () => {
    let deep: unknown = 1;
    for (let i = 0; i < 300; i++) deep = [deep];
    expect(() => canonicalize(deep)).toThrow(JcsError);
  });
});

// canonicalize writes a value whose objects already list their members in canonical order with
// JSON.stringify, and sorts members itself otherwise: both paths must give the one canonical text.
describe("members already in canonical order (JSON.stringify) and not (sorted here) give one text", () => {
  // A deterministic generator: nested objects and arrays of strings (ASCII, non-ASCII, astral,
  // controls), numbers, literals; member names include integer-like ones, which every object
  // enumerates first in numeric order ("10" after "9"), not in canonical order ("10" before "9").
  let seed = 42;
  const next = (n: number) => {
    seed = (seed * 1103515245 + 12345) % 2 ** 31;
    return seed % n;
  };
  const NAMES = ["a", "b", "B", "_", "aa", "1", "9", "10", "01", "é", "\u20ac", "\ud83d\ude00", "\ufb33", "\r", "a b", "-1"];
  const STRINGS = ["", "x", "\"q\"", "back\\slash", "\u0000\u001f\u007f", "€", "\ud83d\ude02", "line\nbreak"];
  const NUMBERS = [0, -0, 1, -1.5, 1e21, 1e-7, 333333333.3333333, Number.MAX_SAFE_INTEGER];
  const value = (depth: number): unknown => {
    const kind = depth > 3 ? next(3) : next(5);
    if (kind === 0) return STRINGS[next(STRINGS.length)];
    if (kind === 1) return NUMBERS[next(NUMBERS.length)];
    if (kind === 2) return [null, true, false][next(3)];
    if (kind === 3) return Array.from({ length: next(4) }, () => value(depth + 1));
    const o: Record<string, unknown> = {};
    for (let i = next(6); i > 0; i--) o[NAMES[next(NAMES.length)]!] = value(depth + 1);
    return o;
  };
  /** The same value with every object's members inserted in `order` (by name). */
  const rebuilt = (v: unknown, order: (names: string[]) => string[]): unknown => {
    if (Array.isArray(v)) return v.map((x) => rebuilt(x, order));
    if (v === null || typeof v !== "object") return v;
    const o: Record<string, unknown> = {};
    for (const k of order(Object.keys(v))) o[k] = rebuilt((v as Record<string, unknown>)[k], order);
    return o;
  };
  const cases = Array.from({ length: 300 }, () => ({ 0: value(0) })[0]);

  test("sorted, reversed and parsed-back copies of 300 values canonicalise alike", () => {
    for (const v of cases) {
      const text = canonicalize(v);
      expect(canonicalize(rebuilt(v, (names) => names.sort()))).toBe(text);
      expect(canonicalize(rebuilt(v, (names) => names.sort().reverse()))).toBe(text);
      // A canonical text parses back with its members in canonical order, except integer-like names.
      expect(canonicalize(JSON.parse(text))).toBe(text);
      expect(JSON.parse(text)).toEqual(JSON.parse(JSON.stringify(v)));
    }
  });

  test("inCanonicalOrder: true only when every object enumerates its members sorted", () => {
    expect(inCanonicalOrder({ a: 1, b: { c: [{ d: 1, e: 2 }] } })).toBe(true);
    expect(inCanonicalOrder({ b: 1, a: 2 })).toBe(false);
    expect(inCanonicalOrder({ a: [{ y: 1, x: 2 }] })).toBe(false);
    // Enumerated as "9", "10": canonical order is "10", "9".
    expect(inCanonicalOrder({ 10: "ten", 9: "nine" })).toBe(false);
    expect(canonicalize({ 10: "ten", 9: "nine", a: 0 })).toBe('{"10":"ten","9":"nine","a":0}');
    expect(inCanonicalOrder(JSON.parse('{"1":0,"2":0,"a":0}'))).toBe(true);
  });
});
