import { describe, expect, test } from "bun:test";
import { timeOrderedId } from "../../src/gateway/ids.ts";

describe("time-ordered request ids", () => {
  test("req_ + 24 hex digits: 12 of milliseconds, then 12 of the random bytes", () => {
    const id = timeOrderedId("req_", () => 0x0123456789ab, (n) => new Uint8Array(n).fill(0xcd))();
    expect(id).toBe("req_0123456789abcdcdcdcdcdcd");
  });

  test("ids made later sort after earlier ones, whatever their random half", () => {
    let t = 1_795_000_000_000;
    let r = 255;
    const make = timeOrderedId("req_", () => t, (n) => new Uint8Array(n).fill(r));
    const ids: string[] = [];
    for (let i = 0; i < 50; i++) {
      ids.push(make());
      t += 1 + (i % 3);
      r = (r * 7 + 13) % 256;
    }
    expect([...ids].sort()).toEqual(ids);
    for (const id of ids) expect(id).toMatch(/^req_[0-9a-f]{24}$/);
  });

  test("ids of one millisecond differ by their random half", () => {
    let seed = 1;
    const make = timeOrderedId("req_", () => 42, (n) => Uint8Array.from({ length: n }, () => (seed = (seed * 48271) % 2147483647) & 0xff));
    const ids = new Set(Array.from({ length: 1000 }, make));
    expect(ids.size).toBe(1000);
  });
});
