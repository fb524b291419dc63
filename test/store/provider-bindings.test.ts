import { expect, test } from "bun:test";
import { randomBytes } from "node:crypto";
import { eachBackend } from "./backends.ts";

const key = () => new Uint8Array(randomBytes(32));

eachBackend((b) => {
test("a provisional binding survives a reopen of the store", async () => {
  const path = await b.location();
  const k = key();
  const store = await b.open(path);
  expect(await store.getProviderBinding("mac-mini.1")).toBeNull();
  const bound = await store.bindProvisionalProvider("mac-mini.1", k, 1_000);
  expect(bound).toEqual({
    ok: true,
    binding: {
      provider_id: "mac-mini.1",
      public_key: k,
      pinned: false,
      banned: false,
      first_admitted_at_ms: 1_000,
      updated_at_ms: 1_000,
    },
  });
  await store.close();

  const reopened = await b.open(path);
  const binding = await reopened.getProviderBinding("mac-mini.1");
  expect(binding?.public_key).toEqual(k);
  expect(binding?.first_admitted_at_ms).toBe(1_000);
  await reopened.close();
});

test("an id is bound once: a second bind, with any key, changes nothing", async () => {
  const store = (await b.fresh()).store;
  const first = key();
  await store.bindProvisionalProvider("p1", first, 1_000);
  const again = await store.bindProvisionalProvider("p1", key(), 2_000);
  expect(again.ok).toBe(false);
  expect(again).toMatchObject({ code: "already_bound", binding: { public_key: first, first_admitted_at_ms: 1_000 } });
  expect(await store.countFirstAdmissionsSince(0)).toBe(1);
  await store.close();
});

test("first admissions are counted from a point in time; pins and bans are not admissions", async () => {
  const store = (await b.fresh()).store;
  await store.bindProvisionalProvider("a", key(), 1_000);
  await store.bindProvisionalProvider("b", key(), 2_000);
  await store.bindProvisionalProvider("c", key(), 3_000);
  await store.pinProvider("pinned-only", key(), 2_500);
  await store.banProvider("banned-only", 2_500);
  expect(await store.countFirstAdmissionsSince(0)).toBe(3);
  expect(await store.countFirstAdmissionsSince(2_000)).toBe(2);
  expect(await store.countFirstAdmissionsSince(3_001)).toBe(0);
  await store.close();
});

test("pin creates or rebinds to the operator's key; unpin keeps the binding", async () => {
  const store = (await b.fresh()).store;
  const provisional = key();
  const operatorKey = key();
  await store.bindProvisionalProvider("gpu-box", provisional, 1_000);

  const pinned = await store.pinProvider("gpu-box", operatorKey, 2_000);
  expect(pinned).toMatchObject({ public_key: operatorKey, pinned: true, banned: false, first_admitted_at_ms: 1_000 });

  const fresh = await store.pinProvider("new-box", key(), 2_000);
  expect(fresh).toMatchObject({ pinned: true, first_admitted_at_ms: null });

  const unpinned = await store.unpinProvider("gpu-box", 3_000);
  expect(unpinned).toMatchObject({ public_key: operatorKey, pinned: false, updated_at_ms: 3_000 });
  expect((await store.getProviderBinding("gpu-box"))?.public_key).toEqual(operatorKey);
  expect(await store.unpinProvider("never-seen")).toBeNull();
  // A pinned id that comes in later is already bound: not a first admission.
  expect((await store.bindProvisionalProvider("new-box", key(), 4_000)).ok).toBe(false);
  await expect(store.pinProvider("short-key", new Uint8Array(31))).rejects.toThrow();
  await store.close();
});

test("ban marks a known id and records an unknown one without a key", async () => {
  const store = (await b.fresh()).store;
  const k = key();
  await store.pinProvider("known", k, 1_000);
  expect(await store.banProvider("known", 2_000)).toMatchObject({ public_key: k, pinned: true, banned: true });
  expect(await store.banProvider("stranger", 2_000)).toEqual({
    provider_id: "stranger",
    public_key: null,
    pinned: false,
    banned: true,
    first_admitted_at_ms: null,
    updated_at_ms: 2_000,
  });
  // Pinning does not lift a ban; the operator's ban stands.
  expect((await store.pinProvider("stranger", key(), 3_000)).banned).toBe(true);
  expect((await store.listProviders()).map((p) => p.provider_id)).toEqual(["known", "stranger"]);
  await store.close();
});

test("unban lifts a ban and keeps the key and tier; an unknown id has nothing to unban", async () => {
  const store = (await b.fresh()).store;
  const k = key();
  await store.pinProvider("known", k, 1_000);
  await store.banProvider("known", 2_000);
  expect(await store.unbanProvider("known", 3_000)).toMatchObject({ public_key: k, pinned: true, banned: false, updated_at_ms: 3_000 });
  expect(await store.unbanProvider("nobody", 3_000)).toBeNull();
  await store.close();
});

test("bans survive a reopen", async () => {
  const path = await b.location();
  const store = await b.open(path);
  await store.bindProvisionalProvider("flaky", key(), 1_000);
  await store.banProvider("flaky", 2_000);
  await store.close();
  const reopened = await b.open(path);
  expect((await reopened.getProviderBinding("flaky"))?.banned).toBe(true);
  await reopened.close();
});

test("when two connections bind the same new id, the first key stays bound", async () => {
  const path = await b.location();
  const one = await b.open(path);
  const two = await b.open(path);
  const k1 = key();
  expect((await one.bindProvisionalProvider("contested", k1, 1_000)).ok).toBe(true);
  const second = await two.bindProvisionalProvider("contested", key(), 1_001);
  expect(second).toMatchObject({ ok: false, code: "already_bound", binding: { public_key: k1 } });
  expect(await two.countFirstAdmissionsSince(0)).toBe(1);
  await one.close();
  await two.close();
});
});
