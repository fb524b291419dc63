// The operator's `gateway accounts|keys` commands work on the same SQLite file as a running gateway.
import { afterAll, beforeAll, expect, test } from "bun:test";
import OpenAI, { APIError } from "openai";
import { flushTestGateways, MAIN, spawnProvider, waitFor, startTestGateway, waitForReadyProviders, type ProviderProcess, type TestGateway } from "../support/harness.ts";

let gw: TestGateway;
let provider: ProviderProcess;

beforeAll(async () => {
  gw = await startTestGateway();
  provider = spawnProvider(gw, { id: "cli-prov" });
  await waitForReadyProviders(gw, 1);
});
afterAll(async () => {
  await provider.kill();
  await gw.close();
});

// Async, not spawnSync: the gateway runs in this process, and blocking its event loop would keep its
// group-commit transaction (committed at the end of the loop turn) holding SQLite's write lock.
const cli = async (...args: string[]) => {
  const proc = Bun.spawn(["bun", MAIN, ...args, ...gw.cliArgs], { stdout: "pipe", stderr: "pipe" });
  const [out, err, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited]);
  return { code, out: out.trim(), err };
};

test("a key from `gateway accounts create` works at once, and `gateway keys revoke` stops it at once", async () => {
  const created = await cli("accounts", "create", "--tier", "free", "--name", "carol");
  expect(created.code).toBe(0);
  const { account_id, api_key } = JSON.parse(created.out);
  expect(account_id).toMatch(/^acct_/);
  expect(api_key).toMatch(/^gw_[A-Za-z0-9_-]{43}$/);

  const client = new OpenAI({ apiKey: api_key, baseURL: gw.baseURL, maxRetries: 0 });
  const res = await client.chat.completions.create({ model: "test-model", messages: [{ role: "user", content: "hi" }], max_tokens: 3 });
  expect(res.choices[0]!.message.content!.length).toBeGreaterThan(0);

  const keys = (await cli("keys", "list", "--account", account_id, "--json")).out.split("\n").map((l) => JSON.parse(l));
  expect(keys).toHaveLength(1);
  expect(JSON.stringify(keys)).not.toContain(api_key);
  expect((await cli("keys", "revoke", keys[0].key_id)).code).toBe(0);

  const error = await client.chat.completions.create({ model: "test-model", messages: [{ role: "user", content: "hi" }] }).catch((e) => e);
  expect(error).toBeInstanceOf(APIError);
  expect(error.status).toBe(401);
  expect(error.code).toBe("invalid_api_key");
});

test("`gateway accounts list` shows each account's balance, today's spend and its key count", async () => {
  const { account_id, api_key } = JSON.parse((await cli("accounts", "create", "--tier", "paid", "--name", "dora")).out);
  expect((await cli("credits", "grant", "--account", account_id, "--credits", "5000000")).code).toBe(0);
  expect((await cli("keys", "create", "--account", account_id)).code).toBe(0);
  const client = new OpenAI({ apiKey: api_key, baseURL: gw.baseURL, maxRetries: 0 });
  await client.chat.completions.create({ model: "test-model", messages: [{ role: "user", content: "hi" }], max_tokens: 3 });
  type Row = { account_id: string; balance_credits: number | null; spent_credits_today: number; tokens_today: number; active_keys: number };
  // Settlement is asynchronous: wait until the gateway has debited the request.
  const today = new Date().toISOString().slice(0, 10);
  await waitFor(async () => (await gw.gateway.store.accountUsage(account_id, today)).spent_credits_day > 0, 10_000, "the request's debit");
  flushTestGateways();
  const listed = await cli("accounts", "list", "--json");
  const row = listed.out.split("\n").map((l) => JSON.parse(l) as Row).find((r) => r.account_id === account_id);
  expect(row!.spent_credits_today).toBeGreaterThan(0);
  expect(row!.balance_credits).toBe(5_000_000 - row!.spent_credits_today);
  expect(row!.tokens_today).toBeGreaterThan(0);
  expect(row!.active_keys).toBe(2);
  const table = (await cli("accounts", "list")).out.split("\n");
  expect(table[0]).toMatch(/^ACCOUNT_ID\s+TIER\s+BALANCE\s+SPENT_TODAY\s+TOKENS_TODAY\s+KEYS\s+CREATED\s+NAME$/);
  const line = table.find((l) => l.startsWith(account_id))!;
  expect(line.split(/\s+/).slice(1, 6)).toEqual(["paid", String(row!.balance_credits), String(row!.spent_credits_today), String(row!.tokens_today), "2"]);
}, 60_000);

test("unknown commands and flags are usage errors (exit 64)", async () => {
  expect((await cli("nonsense")).code).toBe(64);
  expect((await cli("accounts", "create", "--bogus")).code).toBe(64);
  const serve = Bun.spawnSync(["bun", MAIN, "serve", "--no-such-flag"]);
  expect(serve.exitCode).toBe(64);
  expect(serve.stderr.toString()).toContain("unknown option --no-such-flag");
});
