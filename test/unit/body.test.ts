import { describe, expect, test } from "bun:test";
import { jsonDepthExceeds, parseJsonBody, readBody, MAX_JSON_DEPTH } from "../../src/http/body.ts";

describe("jsonDepthExceeds", () => {
  test("counts brackets and braces, not those inside strings", () => {
    expect(jsonDepthExceeds(`{"a":[{"b":1}]}`, 3)).toBe(false);
    expect(jsonDepthExceeds(`{"a":[{"b":[1]}]}`, 3)).toBe(true);
    expect(jsonDepthExceeds(`{"a":"[[[[[[{{{{"}`, 1)).toBe(false);
    // An escaped quote does not end the string.
    expect(jsonDepthExceeds(`{"a":"\\"[[[["}`, 1)).toBe(false);
    expect(jsonDepthExceeds(`{"a":"\\\\"}`, 1)).toBe(false);
  });

  test("siblings do not add up", () => {
    expect(jsonDepthExceeds(`[${"[],".repeat(1000)}[]]`, 2)).toBe(false);
  });
});

describe("parseJsonBody", () => {
  const bytes = (s: string) => new TextEncoder().encode(s);
  test("accepts nesting up to the limit and refuses one level more", () => {
    const nested = (n: number) => "[".repeat(n) + "]".repeat(n);
    expect(parseJsonBody(bytes(nested(MAX_JSON_DEPTH))).ok).toBe(true);
    const over = parseJsonBody(bytes(nested(MAX_JSON_DEPTH + 1)));
    expect(over.ok ? null : over.error.code).toBe("invalid_request");
  });

  test("refuses invalid UTF-8 and invalid JSON as invalid_request", () => {
    const bad = parseJsonBody(new Uint8Array([0x7b, 0xff, 0x7d]));
    expect(bad.ok ? null : bad.error.code).toBe("invalid_request");
    const notJson = parseJsonBody(bytes("{nope"));
    expect(notJson.ok ? null : notJson.error.message).toContain("not valid JSON");
  });
});

describe("readBody", () => {
  const streamOf = (chunks: number[]) =>
    new ReadableStream<Uint8Array>({
      start(c) {
        for (const n of chunks) c.enqueue(new Uint8Array(n).fill(0x20));
        c.close();
      },
    });

  test("joins a chunked body under the limit", async () => {
    const body = await readBody(new Request("http://x/", { method: "POST", body: streamOf([3, 4, 5]) }), 12);
    expect(body?.byteLength).toBe(12);
  });

  test("stops at the limit whatever the framing", async () => {
    expect(await readBody(new Request("http://x/", { method: "POST", body: streamOf([8, 8]) }), 12)).toBeNull();
    const declared = new Request("http://x/", { method: "POST", body: "x".repeat(20), headers: { "content-length": "20" } });
    expect(await readBody(declared, 12)).toBeNull();
  });
});
