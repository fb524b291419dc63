import { expect, test } from "bun:test";
import { eachBackend } from "./backends.ts";


eachBackend((b) => {
test("a secret is generated once and read back after a reopen", async () => {
  const path = await b.location();
  const store = await b.open(path);
  const secret = await store.getOrCreateSecret("gateway_hmac", 32);
  expect(secret.length).toBe(32);
  expect(await store.getOrCreateSecret("gateway_hmac", 32)).toEqual(secret);
  expect(await store.getOrCreateSecret("other", 32)).not.toEqual(secret);
  await store.close();

  const reopened = await b.open(path);
  expect(await reopened.getOrCreateSecret("gateway_hmac", 32)).toEqual(secret);
  // Asking for a different length is a caller bug, never a silent new secret.
  await expect(reopened.getOrCreateSecret("gateway_hmac", 64)).rejects.toThrow();
  await reopened.close();
});

test("secrets come from the injected randomness", async () => {
  const store = (await b.fresh({ randomBytes: (n) => new Uint8Array(n).fill(7) })).store;
  expect(await store.getOrCreateSecret("s", 4)).toEqual(new Uint8Array([7, 7, 7, 7]));
  await store.close();
});
});
