import { describe, expect, test } from "bun:test";
import { timeOrderedId } from "../../src/gateway/ids.ts";
import { messageId } from "../../src/http/messages/responders.ts";
import { responseId } from "../../src/http/responses/responders.ts";

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

test("response ids are as docs/quotas.md says: chatcmpl-req_<hex>, resp_<hex>, msg_<hex>", async () => {
  const hex = "0123456789abcdcdcdcdcdcd";
  expect(responseId(`req_${hex}`)).toBe(`resp_${hex}`);
  expect(messageId(`req_${hex}`)).toBe(`msg_${hex}`);
  const doc = await Bun.file(new URL("../../docs/quotas.md", import.meta.url)).text();
  expect(doc).toContain("`resp_<hex>` and `msg_<hex>`");
  expect(doc).not.toMatch(/resp_req_|msg_req_/);
});
