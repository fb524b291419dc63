// Sticky routing's pure parts: the header rule, the key, and the in-memory map's TTL, LRU and purge.
import { expect, test } from "bun:test";
import { conversationKey, conversationTag } from "../../src/gateway/sticky.ts";
import { createMemoryStickyMap } from "../../src/store/sticky.ts";

test.each([
  ["abc", "abc"],
  ["A-z_0.9:x", "A-z_0.9:x"],
  ["x".repeat(128), "x".repeat(128)],
  ["", "invalid"],
  ["x".repeat(129), "invalid"],
  ["has space", "invalid"],
  ["ünïcode", "invalid"],
  ["a/b", "invalid"],
  ["new\nline", "invalid"],
])("tag %p → %p", (value, expected) => {
  expect(conversationTag(value)).toBe(expected);
});

test("no header: no tag", () => expect(conversationTag(null)).toBeNull());

test("the key binds secret, account and tag, and never contains the tag", () => {
  const secret = new Uint8Array(32).fill(7);
  const k = conversationKey(secret, "acct_1", "conv-42");
  expect(k).toMatch(/^[0-9a-f]{64}$/);
  expect(k).not.toContain("conv-42");
  expect(conversationKey(secret, "acct_2", "conv-42")).not.toBe(k);
  expect(conversationKey(secret, "acct_1", "conv-43")).not.toBe(k);
  expect(conversationKey(new Uint8Array(32).fill(8), "acct_1", "conv-42")).not.toBe(k);
  // No ambiguity between (account, tag) splits.
  expect(conversationKey(secret, "a", "b:c")).not.toBe(conversationKey(secret, "a:b", "c"));
});

test("entries expire after the idle TTL; a read or a write refreshes it", async () => {
  const map = createMemoryStickyMap({ idleTtlMs: 1_000 });
  await map.set("k", "A", "p1", 0);
  expect(await map.get("k", 999)).toBe("p1");
  expect(await map.get("k", 1_998)).toBe("p1");
  expect(await map.get("k", 2_998)).toBeNull();
  await map.set("k", "A", "p2", 3_000);
  await map.set("k", "A", "p3", 3_500);
  expect(await map.get("k", 4_400)).toBe("p3");
  expect(map.size()).toBe(1);
});

test("purge drops exactly the caller's live entries and says how many", async () => {
  const map = createMemoryStickyMap({ idleTtlMs: 1_000 });
  await map.set("a1", "A", "p", 0);
  await map.set("a2", "A", "p", 500);
  await map.set("b1", "B", "p", 500);
  expect(await map.purgeAccount("A", 1_200)).toBe(1); // a1 expired at 1000
  expect(await map.get("a2", 1_200)).toBeNull();
  expect(await map.get("b1", 1_200)).toBe("p");
  expect(await map.purgeAccount("A", 1_200)).toBe(0);
});

test("bounded: the least recently used entry goes first", async () => {
  const map = createMemoryStickyMap({ idleTtlMs: 60_000, maxEntries: 2 });
  await map.set("a", "A", "p", 0);
  await map.set("b", "A", "p", 1);
  await map.get("a", 2);
  await map.set("c", "A", "p", 3);
  expect(map.size()).toBe(2);
  expect(await map.get("b", 4)).toBeNull();
  expect(await map.get("a", 4)).toBe("p");
});
