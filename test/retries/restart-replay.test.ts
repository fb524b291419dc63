// Issue 21 item 3 (and issue 22's embedded half): a retry that crosses a restart is replayed, not
// billed again. The embedded gateway keeps successful results of the replay window in its data dir
// (replays.db); after `kill -9` and a restart on the same data dir, a retry with the same
// Idempotency-Key — or an SDK retry of the same body — gets the first result, and only one attempt
// was ever settled. No provider is connected after the restart: a retry that ran again would fail.
import { afterAll, expect, test } from "bun:test";
import { rmSync } from "node:fs";
import { RedisClient } from "bun";
import { MAIN, spawnGatewayProcess, testBackends, waitFor, withBackendArgs, spawnProvider, tempDir, type GatewayProcess, type TestGateway } from "../support/harness.ts";

const dataDir = tempDir("gw-restart-replay-");
const cleanup: (() => Promise<void> | void)[] = [() => rmSync(dataDir, { recursive: true, force: true })];
afterAll(async () => {
  for (const c of cleanup.reverse()) await c();
});

const cli = (args: string[]) => {
  const r = Bun.spawnSync(["bun", MAIN, ...withBackendArgs([...args, "--data-dir", dataDir])], { stdout: "pipe", stderr: "pipe" });
  return { exitCode: r.exitCode ?? -1, stdout: r.stdout.toString() };
};

async function serve(): Promise<GatewayProcess> {
  const gw = await spawnGatewayProcess(dataDir, ["--settlement-mode", "observe"]);
  cleanup.push(() => gw.kill());
  return gw;
}

test("an Idempotency-Key retry and an SDK retry after kill -9 and a restart are replayed, billed once", async () => {
  const backends = await testBackends(dataDir);
  const created = JSON.parse(cli(["accounts", "create", "--tier", "paid", "--name", "replay-buyer"]).stdout) as { account_id: string; api_key: string };
  expect(cli(["credits", "grant", "--account", created.account_id, "--credits", "100000"]).exitCode).toBe(0);
  const first = await serve();
  const provider = spawnProvider({ wsUrl: first.wsUrl, dataDir } as TestGateway, { id: "replay-prov" });
  cleanup.push(() => provider.kill());
  await provider.waitForEvent("welcome", () => true, 30_000);

  const keyed = JSON.stringify({ model: "test-model", max_tokens: 8, messages: [{ role: "user", content: "keyed, once" }] });
  const plain = JSON.stringify({ model: "test-model", max_tokens: 8, messages: [{ role: "user", content: "sdk retry, once" }] });
  const headers = { authorization: `Bearer ${created.api_key}`, "content-type": "application/json" };
  const a = await fetch(`${first.baseURL}/chat/completions`, { method: "POST", headers: { ...headers, "idempotency-key": "across-restart" }, body: keyed });
  expect(a.status).toBe(200);
  const aBody = await a.text();
  const b = await fetch(`${first.baseURL}/chat/completions`, { method: "POST", headers: { ...headers, "x-stainless-retry-count": "0" }, body: plain });
  expect(b.status).toBe(200);
  const bBody = await b.text();

  // A cluster node writes the results to Redis just after each response ended (fire and forget,
  // docs/scale-out.md): a kill -9 inside that window loses them, as a real crash there would. Wait.
  if (backends.redisUrl) await waitFor(() => resultsStored(backends.redisUrl!, 2), 5000, "both results in Redis");
  await first.kill();
  await provider.kill();
  const second = await serve();
  const retryA = await fetch(`${second.baseURL}/chat/completions`, { method: "POST", headers: { ...headers, "idempotency-key": "across-restart" }, body: keyed });
  expect(retryA.status).toBe(200);
  expect(retryA.headers.get("idempotent-replayed")).toBe("true");
  expect(await retryA.text()).toBe(aBody);
  const retryB = await fetch(`${second.baseURL}/chat/completions`, { method: "POST", headers: { ...headers, "x-stainless-retry-count": "1" }, body: plain });
  expect(retryB.status).toBe(200);
  expect(retryB.headers.get("idempotent-replayed")).toBe("true");
  expect(await retryB.text()).toBe(bBody);
  // The same key with another body is still refused after the restart.
  const reused = await fetch(`${second.baseURL}/chat/completions`, { method: "POST", headers: { ...headers, "idempotency-key": "across-restart" }, body: plain });
  expect(reused.status).toBe(422);

  const receipts = cli(["receipts", "list", "--json"]).stdout.trim().split("\n").filter(Boolean);
  expect(receipts.length).toBe(2);
}, 120_000);

/** Whether the node's Redis holds `n` finished retry results (bodies), none still marked in flight. */
async function resultsStored(redisUrl: string, n: number): Promise<boolean> {
  const redis = new RedisClient(redisUrl);
  try {
    const keys = (await redis.send("KEYS", ["gw:replay:b:*"])) as string[];
    const values = await Promise.all(keys.map((k) => redis.get(k)));
    return values.filter((v) => v !== null && (JSON.parse(v) as { s: string }).s === "succeeded").length >= n;
  } finally {
    redis.close();
  }
}
