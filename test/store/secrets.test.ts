import { expect, test } from "bun:test";
import { openStore } from "../../src/store/index.ts";
import { tempDir } from "./temp-dir.ts";

const tmp = tempDir();

test("a secret is generated once and read back after a reopen", () => {
  const path = tmp.path("secrets.db");
  const store = openStore(path);
  const secret = store.getOrCreateSecret("gateway_hmac", 32);
  expect(secret.length).toBe(32);
  expect(store.getOrCreateSecret("gateway_hmac", 32)).toEqual(secret);
  expect(store.getOrCreateSecret("other", 32)).not.toEqual(secret);
  store.close();

  const reopened = openStore(path);
  expect(reopened.getOrCreateSecret("gateway_hmac", 32)).toEqual(secret);
  // Asking for a different length is a caller bug, never a silent new secret.
  expect(() => reopened.getOrCreateSecret("gateway_hmac", 64)).toThrow();
  reopened.close();
});

test("secrets come from the injected randomness", () => {
  const store = openStore(tmp.path("seeded.db"), { randomBytes: (n) => new Uint8Array(n).fill(7) });
  expect(store.getOrCreateSecret("s", 4)).toEqual(new Uint8Array([7, 7, 7, 7]));
  store.close();
});
