// The PostgreSQL store's cached key lookups (src/store/postgres/keyCache.ts): a cached key answers
// without the database, and what drops it is the database's change feed (LISTEN/NOTIFY), whoever made
// the change — another store, plain SQL, this store itself — never a timer.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { SQL } from "bun";
import type { AsyncStore } from "../../src/store/asyncStore.ts";
import { openPostgresStore } from "../../src/store/postgres/index.ts";
import { waitFor } from "../support/harness.ts";
import { postgresMissing, sharedPostgres, startPostgres } from "../support/postgres.ts";

describe.skipIf(postgresMissing !== null)("PostgreSQL key cache", () => {
  let url: string;
  let node: AsyncStore;
  let other: AsyncStore;
  let side: SQL;
  beforeAll(async () => {
    url = await (await sharedPostgres()).freshDatabase();
    node = await openPostgresStore(url, { maxConnections: 4 });
    other = await openPostgresStore(url, { maxConnections: 2 });
    side = new SQL(url, { max: 1 });
    // The feed is heard once the store's LISTEN is acknowledged: a fresh lookup is cached from then on.
    const probe = await other.createApiKey({ account_id: (await other.createAccount({ tier: "free" })).account_id });
    await waitFor(async () => (await cachedWithoutTriggers(probe.key_id, probe.api_key)) !== null, 5_000, "the key cache heard");
  }, 60_000);
  afterAll(async () => {
    await side.close();
    await other.close();
    await node.close();
  });

  /** Revokes past the change feed (triggers off for that transaction), then asks `node` again. */
  async function cachedWithoutTriggers(key_id: string, api_key: string) {
    await node.authenticateApiKey(api_key);
    await side.begin(async (tx) => {
      await tx.unsafe("SET LOCAL session_replication_role = replica");
      await tx`UPDATE api_keys SET revoked_at_ms = 1 WHERE id = ${key_id}`;
    });
    const answer = await node.authenticateApiKey(api_key);
    await side`UPDATE api_keys SET revoked_at_ms = NULL WHERE id = ${key_id}`;
    return answer;
  }

  test("a cached key answers without a round trip: a change that sends no notification is not seen", async () => {
    const { account_id } = await other.createAccount({ tier: "free" });
    const { key_id, api_key } = await other.createApiKey({ account_id });
    // The creation's own notifications may reach the node after its first lookup cached the key (seen
    // once on a loaded machine) and drop it, once: ask again until the feed is quiet.
    // (Each try's own un-revoking notifies, so the answer is the try's, not a further call's.)
    const answers: Awaited<ReturnType<typeof cachedWithoutTriggers>>[] = [];
    await waitFor(async () => answers.push(await cachedWithoutTriggers(key_id, api_key)) > 0 && answers.at(-1) !== null, 5_000, "an answer from the cache");
    expect(answers.at(-1)).toEqual({ account_id, key_id, tier: "free" });
  });

  test("a key revoked through another store is refused within a second", async () => {
    const { account_id } = await other.createAccount({ tier: "paid" });
    const { key_id, api_key } = await other.createApiKey({ account_id });
    expect((await node.authenticateApiKey(api_key))?.key_id).toBe(key_id);
    const revokedAt = performance.now();
    await other.revokeApiKey(key_id);
    await waitFor(async () => (await node.authenticateApiKey(api_key)) === null, 1_000, "revocation seen");
    expect(performance.now() - revokedAt).toBeLessThan(1_000);
  });

  test("a tier changed by plain SQL, past every store, reaches the cache within a second", async () => {
    const { account_id } = await other.createAccount({ tier: "free" });
    const { api_key } = await other.createApiKey({ account_id });
    expect((await node.authenticateApiKey(api_key))?.tier).toBe("free");
    await side`UPDATE accounts SET tier = 'paid' WHERE id = ${account_id}`;
    await waitFor(async () => (await node.authenticateApiKey(api_key))?.tier === "paid", 1_000, "tier change seen");
  });

  test("this store's own revocations and tier changes take effect at once", async () => {
    const { account_id } = await node.createAccount({ tier: "free" });
    const first = await node.createApiKey({ account_id });
    const second = await node.createApiKey({ account_id });
    expect((await node.authenticateApiKey(first.api_key))?.tier).toBe("free");
    expect((await node.authenticateApiKey(second.api_key))?.tier).toBe("free");
    await node.setAccountTier(account_id, "paid");
    expect((await node.authenticateApiKey(second.api_key))?.tier).toBe("paid");
    await node.revokeApiKey(first.key_id);
    expect(await node.authenticateApiKey(first.api_key)).toBeNull();
    expect(await node.revokeAccountKey(account_id, second.key_id)).toBe(true);
    expect(await node.authenticateApiKey(second.api_key)).toBeNull();
  });

  test("after the database restarts, a revocation made at once is refused within a second", async () => {
    // A private server: stopping the shared one would cut every other test. The node makes no query
    // while it is down, so only its listener notices (it reconnects, and the cache starts over).
    const pg = await startPostgres();
    const privateUrl = await pg.freshDatabase();
    const quiet = await openPostgresStore(privateUrl, { maxConnections: 2 });
    let admin = new SQL(privateUrl, { max: 1 });
    try {
      const { account_id } = await quiet.createAccount({ tier: "free" });
      const { key_id, api_key } = await quiet.createApiKey({ account_id });
      const probe = await quiet.createApiKey({ account_id });
      // Heard once a lookup is cached: a revocation that sends no notification is then not seen.
      await waitFor(
        async () => {
          await quiet.authenticateApiKey(probe.api_key);
          await admin.begin(async (tx) => {
            await tx.unsafe("SET LOCAL session_replication_role = replica");
            await tx`UPDATE api_keys SET revoked_at_ms = 1 WHERE id = ${probe.key_id}`;
          });
          const cached = (await quiet.authenticateApiKey(probe.api_key)) !== null;
          await admin`UPDATE api_keys SET revoked_at_ms = NULL WHERE id = ${probe.key_id}`;
          return cached;
        },
        5_000,
        "the key cache heard",
      );
      expect((await quiet.authenticateApiKey(api_key))?.key_id).toBe(key_id);
      await admin.close();
      pg.stop();
      pg.start();
      admin = new SQL(privateUrl, { max: 1 });
      await admin`UPDATE api_keys SET revoked_at_ms = 1 WHERE id = ${key_id}`;
      const revokedAt = performance.now();
      await waitFor(async () => (await quiet.authenticateApiKey(api_key)) === null, 1_000, "revocation seen after the restart");
      expect(performance.now() - revokedAt).toBeLessThan(1_000);
    } finally {
      await admin.close();
      await quiet.close();
      pg.destroy();
    }
  }, 60_000);

  test("last use is still written once a minute per key while the key is cached", async () => {
    const { account_id } = await other.createAccount({ tier: "free" });
    const { key_id, api_key } = await other.createApiKey({ account_id });
    const lastUsed = async () => (await other.listApiKeys(account_id)).find((k) => k.key_id === key_id)!.last_used_at_ms;
    await node.authenticateApiKey(api_key, 5_000_000);
    await node.authenticateApiKey(api_key, 5_000_000 + 59_999);
    expect(await lastUsed()).toBe(5_000_000);
    await node.authenticateApiKey(api_key, 5_000_000 + 60_000);
    expect(await lastUsed()).toBe(5_060_000);
  });
});
