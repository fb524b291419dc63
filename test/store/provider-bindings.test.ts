import { expect, test } from "bun:test";
import { randomBytes } from "node:crypto";
import { openStore } from "../../src/store/index.ts";
import { tempDir } from "./temp-dir.ts";

const tmp = tempDir();
const key = () => new Uint8Array(randomBytes(32));

test("a provisional binding survives a reopen of the store", () => {
  const path = tmp.path("durable.db");
  const k = key();
  const store = openStore(path);
  expect(store.getProviderBinding("mac-mini.1")).toBeNull();
  const bound = store.bindProvisionalProvider("mac-mini.1", k, 1_000);
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
  store.close();

  const reopened = openStore(path);
  const binding = reopened.getProviderBinding("mac-mini.1");
  expect(binding?.public_key).toEqual(k);
  expect(binding?.first_admitted_at_ms).toBe(1_000);
  reopened.close();
});

test("an id is bound once: a second bind, with any key, changes nothing", () => {
  const store = openStore(tmp.path("bind-once.db"));
  const first = key();
  store.bindProvisionalProvider("p1", first, 1_000);
  const again = store.bindProvisionalProvider("p1", key(), 2_000);
  expect(again.ok).toBe(false);
  expect(again).toMatchObject({ code: "already_bound", binding: { public_key: first, first_admitted_at_ms: 1_000 } });
  expect(store.countFirstAdmissionsSince(0)).toBe(1);
  store.close();
});

test("first admissions are counted from a point in time; pins and bans are not admissions", () => {
  const store = openStore(tmp.path("count.db"));
  store.bindProvisionalProvider("a", key(), 1_000);
  store.bindProvisionalProvider("b", key(), 2_000);
  store.bindProvisionalProvider("c", key(), 3_000);
  store.pinProvider("pinned-only", key(), 2_500);
  store.banProvider("banned-only", 2_500);
  expect(store.countFirstAdmissionsSince(0)).toBe(3);
  expect(store.countFirstAdmissionsSince(2_000)).toBe(2);
  expect(store.countFirstAdmissionsSince(3_001)).toBe(0);
  store.close();
});

test("pin creates or rebinds to the operator's key; unpin keeps the binding", () => {
  const store = openStore(tmp.path("pin.db"));
  const provisional = key();
  const operatorKey = key();
  store.bindProvisionalProvider("gpu-box", provisional, 1_000);

  const pinned = store.pinProvider("gpu-box", operatorKey, 2_000);
  expect(pinned).toMatchObject({ public_key: operatorKey, pinned: true, banned: false, first_admitted_at_ms: 1_000 });

  const fresh = store.pinProvider("new-box", key(), 2_000);
  expect(fresh).toMatchObject({ pinned: true, first_admitted_at_ms: null });

  const unpinned = store.unpinProvider("gpu-box", 3_000);
  expect(unpinned).toMatchObject({ public_key: operatorKey, pinned: false, updated_at_ms: 3_000 });
  expect(store.getProviderBinding("gpu-box")?.public_key).toEqual(operatorKey);
  expect(store.unpinProvider("never-seen")).toBeNull();
  // A pinned id that comes in later is already bound: not a first admission.
  expect(store.bindProvisionalProvider("new-box", key(), 4_000).ok).toBe(false);
  expect(() => store.pinProvider("short-key", new Uint8Array(31))).toThrow();
  store.close();
});

test("ban marks a known id and records an unknown one without a key", () => {
  const store = openStore(tmp.path("ban.db"));
  const k = key();
  store.pinProvider("known", k, 1_000);
  expect(store.banProvider("known", 2_000)).toMatchObject({ public_key: k, pinned: true, banned: true });
  expect(store.banProvider("stranger", 2_000)).toEqual({
    provider_id: "stranger",
    public_key: null,
    pinned: false,
    banned: true,
    first_admitted_at_ms: null,
    updated_at_ms: 2_000,
  });
  // Pinning does not lift a ban; the operator's ban stands.
  expect(store.pinProvider("stranger", key(), 3_000).banned).toBe(true);
  expect(store.listProviders().map((p) => p.provider_id)).toEqual(["known", "stranger"]);
  store.close();
});

test("bans survive a reopen", () => {
  const path = tmp.path("ban-durable.db");
  const store = openStore(path);
  store.bindProvisionalProvider("flaky", key(), 1_000);
  store.banProvider("flaky", 2_000);
  store.close();
  const reopened = openStore(path);
  expect(reopened.getProviderBinding("flaky")?.banned).toBe(true);
  reopened.close();
});

test("when two connections bind the same new id, the first key stays bound", () => {
  const path = tmp.path("race.db");
  const one = openStore(path);
  const two = openStore(path);
  const k1 = key();
  expect(one.bindProvisionalProvider("contested", k1, 1_000).ok).toBe(true);
  const second = two.bindProvisionalProvider("contested", key(), 1_001);
  expect(second).toMatchObject({ ok: false, code: "already_bound", binding: { public_key: k1 } });
  expect(two.countFirstAdmissionsSince(0)).toBe(1);
  one.close();
  two.close();
});
