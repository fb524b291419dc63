import { afterEach, beforeEach, expect, test } from "bun:test";
import { randomBytes } from "node:crypto";
import { runAccountsCommand, runKeysCommand, runProvidersCommand } from "../../src/cli/operator.ts";
import type { AsyncStore } from "../../src/store/asyncStore.ts";
import { eachBackend } from "./backends.ts";

eachBackend((b) => {
let store: AsyncStore;
let out: string[];
let err: string[];
const ctx = () => ({ store, stdout: (l: string) => out.push(l), stderr: (l: string) => err.push(l) });
const jsonLines = () => out.map((l) => JSON.parse(l) as Record<string, unknown>);
const reset = () => {
  out = [];
  err = [];
};

beforeEach(async () => {
  store = (await b.fresh()).store;
  reset();
});
afterEach(() => store.close());

test("accounts create prints the account id and a working first key", async () => {
  expect(await runAccountsCommand(["create", "--tier", "paid", "--name=Ada Lovelace"], ctx())).toBe(0);
  expect(out).toHaveLength(1);
  const created = JSON.parse(out[0]!);
  expect(Object.keys(created)).toEqual(["account_id", "api_key"]);
  expect(created.api_key).toMatch(/^gw_[A-Za-z0-9_-]{43}$/);
  expect(await store.authenticateApiKey(created.api_key)).toMatchObject({ account_id: created.account_id, tier: "paid" });
  expect((await store.getAccount(created.account_id))?.name).toBe("Ada Lovelace");
});

test("accounts create --env prints shell exports of the id and the key", async () => {
  expect(await runAccountsCommand(["create", "--env"], ctx())).toBe(0);
  expect(out).toHaveLength(2);
  const [id, key] = out.map((l) => /^export ([A-Z_]+)=([A-Za-z0-9_-]+)$/.exec(l)!);
  expect([id![1], key![1]]).toEqual(["ACCOUNT_ID", "GATEWAY_API_KEY"]);
  expect((await store.authenticateApiKey(key![2]!))?.account_id).toBe(id![2]!);
});

test("accounts create defaults to the free tier and rejects other tiers", async () => {
  expect(await runAccountsCommand(["create"], ctx())).toBe(0);
  expect((await store.getAccount(JSON.parse(out[0]!).account_id))?.tier).toBe("free");
  reset();
  expect(await runAccountsCommand(["create", "--tier", "gold"], ctx())).toBe(64);
  expect(out).toEqual([]);
  expect(err.join("\n")).toContain("usage:");
});

test("accounts set-tier moves an account and its keys, announces the change, and refuses unknown accounts and tiers", async () => {
  await runAccountsCommand(["create", "--tier", "free"], ctx());
  const { account_id, api_key } = JSON.parse(out[0]!) as { account_id: string; api_key: string };
  expect((await store.authenticateApiKey(api_key))?.tier).toBe("free");
  reset();
  const changes: unknown[] = [];
  expect(await runAccountsCommand(["set-tier", account_id, "--tier", "paid"], { ...ctx(), changed: (c: unknown) => void changes.push(c) })).toBe(0);
  expect(jsonLines()).toEqual([expect.objectContaining({ account_id, tier: "paid" })]);
  expect(changes).toEqual([{ kind: "tier_changed" }]);
  // The key follows at once: its next lookup sees the new tier.
  expect((await store.authenticateApiKey(api_key))?.tier).toBe("paid");
  reset();
  expect(await runAccountsCommand(["set-tier", "acct_missing", "--tier", "paid"], ctx())).toBe(1);
  expect(err.join("\n")).toContain("unknown account acct_missing");
  reset();
  expect(await runAccountsCommand(["set-tier", account_id, "--tier", "gold"], ctx())).toBe(64);
  expect(await runAccountsCommand(["set-tier", account_id], ctx())).toBe(64);
  expect((await store.getAccount(account_id))?.tier).toBe("paid");
});

test("accounts list --json prints one object per line", async () => {
  await runAccountsCommand(["create", "--name", "one"], ctx());
  await runAccountsCommand(["create", "--tier", "paid"], ctx());
  reset();
  expect(await runAccountsCommand(["list", "--json"], ctx())).toBe(0);
  const rows = jsonLines();
  expect(rows).toHaveLength(2);
  for (const row of rows) {
    expect(Object.keys(row).sort()).toEqual(["account_id", "active_keys", "balance_credits", "created_at_ms", "name", "spent_credits_today", "tier", "tokens_today"]);
  }
  expect(rows.map((r) => r.tier).sort()).toEqual(["free", "paid"]);
});

test("keys create, list and revoke", async () => {
  await runAccountsCommand(["create"], ctx());
  const { account_id, api_key: first } = JSON.parse(out[0]!);
  reset();

  expect(await runKeysCommand(["create", "--account", account_id, "--label", "ci"], ctx())).toBe(0);
  const created = JSON.parse(out[0]!);
  expect(Object.keys(created)).toEqual(["key_id", "api_key"]);
  expect((await store.authenticateApiKey(created.api_key))?.key_id).toBe(created.key_id);
  reset();

  expect(await runKeysCommand(["list", "--account", account_id, "--json"], ctx())).toBe(0);
  const rows = jsonLines();
  expect(rows).toHaveLength(2);
  for (const row of rows) {
    expect(row).not.toHaveProperty("key_hash");
    expect(row).not.toHaveProperty("api_key");
  }
  // Nothing printed by a listing can be used as a key.
  expect(out.join("\n")).not.toContain(created.api_key);
  expect(out.join("\n")).not.toContain(first);
  reset();

  expect(await runKeysCommand(["revoke", created.key_id], ctx())).toBe(0);
  expect(JSON.parse(out[0]!)).toEqual({ key_id: created.key_id, revoked: true });
  expect(await store.authenticateApiKey(created.api_key)).toBeNull();
  expect(await store.authenticateApiKey(first)).not.toBeNull();
});

test("keys commands fail cleanly on unknown ids and bad usage", async () => {
  expect(await runKeysCommand(["revoke", "key_nope"], ctx())).toBe(1);
  expect(err.join("\n")).toContain("unknown key key_nope");
  reset();
  expect(await runKeysCommand(["create", "--account", "acct_nope"], ctx())).toBe(1);
  expect(await runKeysCommand(["list", "--account", "acct_nope", "--json"], ctx())).toBe(1);
  expect(out).toEqual([]);
  expect(await runKeysCommand(["create"], ctx())).toBe(64);
  expect(await runKeysCommand(["revoke"], ctx())).toBe(64);
  expect(await runKeysCommand(["revoke", "a", "b"], ctx())).toBe(64);
  expect(await runKeysCommand(["list", "--verbose"], ctx())).toBe(64);
});

test("unknown subcommands and flags are usage errors with exit 64", async () => {
  expect(await runAccountsCommand([], ctx())).toBe(64);
  expect(await runAccountsCommand(["delete"], ctx())).toBe(64);
  expect(await runAccountsCommand(["create", "--colour", "red"], ctx())).toBe(64);
  expect(await runProvidersCommand(["list", "--all"], ctx())).toBe(64);
  expect(await runKeysCommand(["rotate"], ctx())).toBe(64);
  expect(out).toEqual([]);
  expect(err.filter((l) => l.startsWith("usage:")).length).toBe(5);
  reset();
  expect(await runProvidersCommand(["--help"], ctx())).toBe(0);
  expect(out[0]).toStartWith("usage:");
});

test("providers pin, unpin, ban and list", async () => {
  const raw = randomBytes(32);
  const b64 = raw.toString("base64");
  expect(await runProvidersCommand(["pin", "studio.m2-ultra", "--public-key", b64], ctx())).toBe(0);
  expect(JSON.parse(out[0]!)).toMatchObject({ provider_id: "studio.m2-ultra", public_key: b64, pinned: true, banned: false });
  expect((await store.getProviderBinding("studio.m2-ultra"))?.public_key).toEqual(new Uint8Array(raw));
  reset();

  expect(await runProvidersCommand(["unpin", "studio.m2-ultra"], ctx())).toBe(0);
  expect(JSON.parse(out[0]!)).toMatchObject({ pinned: false, public_key: b64 });
  expect(await runProvidersCommand(["ban", "spammer_9"], ctx())).toBe(0);
  reset();

  expect(await runProvidersCommand(["list", "--json"], ctx())).toBe(0);
  expect(jsonLines()).toEqual([
    expect.objectContaining({ provider_id: "spammer_9", public_key: null, pinned: false, banned: true }),
    expect.objectContaining({ provider_id: "studio.m2-ultra", public_key: b64, pinned: false, banned: false }),
  ]);
  reset();
  expect(await runProvidersCommand(["list"], ctx())).toBe(0);
  expect(out[0]).toStartWith("PROVIDER_ID");
  expect(out).toHaveLength(3);
});

test("providers pin validates the id and the key", async () => {
  const good = randomBytes(32).toString("base64");
  const cases: string[][] = [
    ["pin", "has space", "--public-key", good],
    ["pin", "x".repeat(65), "--public-key", good],
    ["pin", "ok-id"],
    ["pin", "ok-id", "--public-key", randomBytes(31).toString("base64")],
    ["pin", "ok-id", "--public-key", randomBytes(33).toString("base64")],
    ["pin", "ok-id", "--public-key", Buffer.alloc(32, 0xff).toString("base64url")], // `_` is not standard base64
    ["pin", "ok-id", "--public-key", "not base64!"],
    ["ban"],
    ["unpin", "bad/id"],
  ];
  for (const argv of cases) expect(await runProvidersCommand(argv, ctx())).toBe(64);
  expect(await store.listProviders()).toEqual([]);
  // Padding may be left off; the key is the same 32 bytes.
  expect(await runProvidersCommand(["pin", "ok-id", "--public-key", good.replace(/=$/, "")], ctx())).toBe(0);
  expect(await runProvidersCommand(["unpin", "never-seen"], ctx())).toBe(1);
});
});
