import { Database } from "bun:sqlite";
import { expect, test } from "bun:test";
import { existsSync, readFileSync } from "node:fs";
import { openStore } from "../../src/store/index.ts";
import { waitFor } from "../support/harness.ts";
import { eachBackend } from "./backends.ts";
import { tempDir } from "./temp-dir.ts";

const tmp = tempDir();

eachBackend((b) => {

test("a created key authenticates to its account and tier", async () => {
  const store = (await b.fresh()).store;
  const { account_id } = await store.createAccount({ tier: "paid", name: "Ada" });
  const { key_id, api_key } = await store.createApiKey({ account_id, label: "laptop" });
  expect(account_id).toMatch(/^acct_[a-z2-7]{24}$/);
  expect(key_id).toMatch(/^key_[a-z2-7]{24}$/);
  expect(await store.authenticateApiKey(api_key)).toEqual({ account_id, key_id, tier: "paid" });
  expect(await store.getAccount(account_id)).toMatchObject({ account_id, name: "Ada", tier: "paid" });
  await store.close();
});

test("a key carries at least 256 random bits after the service prefix", async () => {
  const store = (await b.fresh()).store;
  const { account_id } = await store.createAccount({ tier: "free" });
  const keys: string[] = [];
  for (let i = 0; i < 20; i++) keys.push((await store.createApiKey({ account_id })).api_key);
  for (const key of keys) {
    expect(key).toMatch(/^gw_[A-Za-z0-9_-]{43,}$/);
    expect(Buffer.from(key.slice(3), "base64url").length).toBeGreaterThanOrEqual(32);
  }
  expect(new Set(keys).size).toBe(keys.length);
  await store.close();
});

test("the key prefix is configurable and a key of another prefix is not ours", async () => {
  const path = await b.location();
  const store = await b.open(path, { keyPrefix: "acme" });
  const { account_id } = await store.createAccount({ tier: "free" });
  const { api_key } = await store.createApiKey({ account_id });
  expect(api_key.startsWith("acme_")).toBe(true);
  expect(await store.authenticateApiKey(api_key)).not.toBeNull();
  await store.close();
  const gw = await b.open(path);
  expect(await gw.authenticateApiKey(api_key)).toBeNull();
  await gw.close();
  await expect(b.open(path, { keyPrefix: "bad_prefix" })).rejects.toThrow();
});

test("unknown, altered and revoked keys do not authenticate", async () => {
  const store = (await b.fresh()).store;
  const { account_id } = await store.createAccount({ tier: "free" });
  const { key_id, api_key } = await store.createApiKey({ account_id });
  const other = await store.createApiKey({ account_id });
  expect(await store.authenticateApiKey("gw_" + "A".repeat(43))).toBeNull();
  expect(await store.authenticateApiKey(api_key.slice(0, -1) + (api_key.endsWith("A") ? "B" : "A"))).toBeNull();
  expect(await store.authenticateApiKey("")).toBeNull();

  expect(await store.revokeApiKey(key_id, 5_000)).toBe(true);
  expect(await store.authenticateApiKey(api_key)).toBeNull();
  // Revoking again still finds the key and keeps the first revocation time.
  expect(await store.revokeApiKey(key_id, 9_000)).toBe(true);
  expect((await store.listApiKeys(account_id)).find((k) => k.key_id === key_id)?.revoked_at_ms).toBe(5_000);
  expect(await store.revokeApiKey("key_doesnotexist")).toBe(false);
  // The account's other key is untouched.
  expect((await store.authenticateApiKey(other.api_key))?.key_id).toBe(other.key_id);
  await store.close();
});

test("listing shows the display prefix and never the key or its hash", async () => {
  const store = (await b.fresh()).store;
  const a = (await store.createAccount({ tier: "free" })).account_id;
  const other = (await store.createAccount({ tier: "paid" })).account_id;
  const ka = await store.createApiKey({ account_id: a, label: "ci" });
  await store.createApiKey({ account_id: other });
  expect(await store.listApiKeys()).toHaveLength(2);
  const [row] = await store.listApiKeys(a);
  expect(Object.keys(row!).sort()).toEqual(
    ["account_id", "created_at_ms", "display_prefix", "key_id", "label", "last_used_at_ms", "revoked_at_ms"].sort(),
  );
  expect(row).toMatchObject({ key_id: ka.key_id, label: "ci", revoked_at_ms: null });
  expect(ka.api_key.startsWith(row!.display_prefix)).toBe(true);
  expect((await store.listAccounts()).map((r) => r.account_id).sort()).toEqual([a, other].sort());
  await store.close();
});

test("last use is recorded at most once a minute per key", async () => {
  const store = (await b.fresh()).store;
  const { account_id } = await store.createAccount({ tier: "free" });
  const { key_id, api_key } = await store.createApiKey({ account_id });
  const lastUsed = async () => (await store.listApiKeys(account_id)).find((k) => k.key_id === key_id)!.last_used_at_ms;
  expect(await lastUsed()).toBeNull();
  await store.authenticateApiKey(api_key, 1_000_000);
  expect(await lastUsed()).toBe(1_000_000);
  await store.authenticateApiKey(api_key, 1_000_000 + 59_999);
  expect(await lastUsed()).toBe(1_000_000);
  await store.authenticateApiKey(api_key, 1_000_000 + 60_000);
  expect(await lastUsed()).toBe(1_060_000);
  await store.close();
});

test("a key for an unknown account is refused by the database", async () => {
  const store = (await b.fresh()).store;
  await expect(store.createApiKey({ account_id: "acct_missing" })).rejects.toThrow();
  expect(await store.getAccount("acct_missing")).toBeNull();
  await store.close();
});

test("the injected clock stamps rows when no time is passed", async () => {
  let now = 42_000;
  const store = (await b.fresh({ now: () => now })).store;
  const { account_id } = await store.createAccount({ tier: "free" });
  now = 43_000;
  await store.createApiKey({ account_id });
  expect((await store.getAccount(account_id))?.created_at_ms).toBe(42_000);
  expect((await store.listApiKeys(account_id))[0]?.created_at_ms).toBe(43_000);
  await store.close();
});

test("a key created or revoked through another connection takes effect without a restart", async () => {
  // The operator CLI and a running gateway share the store. SQLite: at once (a commit by another
  // connection changes data_version). PostgreSQL: within a second, by the change feed (LISTEN/NOTIFY)
  // that drops every store's cached lookups.
  const path = await b.location();
  const gateway = await b.open(path);
  const cli = await b.open(path);
  const { account_id } = await cli.createAccount({ tier: "free" });
  const { key_id, api_key } = await cli.createApiKey({ account_id });
  expect((await gateway.authenticateApiKey(api_key))?.key_id).toBe(key_id);
  await cli.revokeApiKey(key_id);
  if (b.name === "postgres") await waitFor(async () => (await gateway.authenticateApiKey(api_key)) === null, 1_000, "revocation seen");
  expect(await gateway.authenticateApiKey(api_key)).toBeNull();
  await cli.close();
  await gateway.close();
});
});

// SQLite only: the file's bytes are inspected directly.
test("only the key's hash is stored: the raw key appears nowhere in the database files", async () => {
  const path = tmp.path("hash-only.db");
  const store = openStore(path);
  const { account_id } = store.createAccount({ tier: "free" });
  const { api_key } = store.createApiKey({ account_id });
  expect(store.authenticateApiKey(api_key)).not.toBeNull();

  const files = [path, `${path}-wal`].filter(existsSync).map((f) => readFileSync(f));
  const secretPart = api_key.slice(api_key.indexOf("_") + 1);
  const rawBytes = Buffer.from(secretPart, "base64url");
  const check = () => {
    // Positive control: the display prefix is stored in clear, so the byte search does see rows.
    expect(files.some((bytes) => bytes.includes(Buffer.from(api_key.slice(0, 11))))).toBe(true);
    for (const bytes of files) {
      expect(bytes.includes(Buffer.from(api_key))).toBe(false);
      expect(bytes.includes(Buffer.from(secretPart))).toBe(false);
      expect(bytes.includes(rawBytes)).toBe(false);
    }
  };
  check();
  store.close(); // the last close checkpoints the WAL into the main file
  files.splice(0, files.length, ...[path, `${path}-wal`].filter(existsSync).map((f) => readFileSync(f)));
  check();

  const raw = new Database(path, { readonly: true });
  const row = raw.query("SELECT key_hash, display_prefix FROM api_keys").get() as {
    key_hash: Uint8Array;
    display_prefix: string;
  };
  expect(row.key_hash.length).toBe(32);
  expect(row.display_prefix).toBe(api_key.slice(0, 11));
  raw.close();
});

