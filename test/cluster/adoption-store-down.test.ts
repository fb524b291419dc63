// A survivor takes a dead node's owned set (it is then gone from Redis) and resolves each attempt in
// it from the store. Found by the cluster crash chaos (pg mode, seeds 5005 and 5007: a node killed,
// PostgreSQL stopped a moment later): the survivor's reads and writes failed while the database was
// down, the adoption was given up, and the attempts stayed pending and their reservations held for
// good. The rule: an adoption is tried again while the database is unreachable, as a settlement
// write is (src/gateway/settlement/durableWrites.ts).
//
// The probe: a trigger answers the adoption's first write (the attempt quarantined `interrupted`)
// with SQLSTATE 57P01, what a server shutting down answers (a sequence counts the tries: it is not
// rolled back with the transaction).
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { SQL } from "bun";
import OpenAI from "openai";
import { waitFor } from "../support/harness.ts";
import { clusterMissing, startCluster, type TestCluster } from "../support/cluster.ts";

const MODEL = "adopt-model";

describe.skipIf(clusterMissing !== null)("a dead node's attempt adopted while the database is down", () => {
  let cluster: TestCluster;
  let sql: SQL;
  let apiKey: string;
  beforeAll(async () => {
    cluster = await startCluster({ nodes: 2, models: [MODEL], leaseMs: 2000 });
    sql = new SQL(cluster.databaseUrl, { max: 1 });
    await sql.unsafe(`
      CREATE SEQUENCE probe_adoption_tries;
      CREATE FUNCTION probe_down_once() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN
        IF nextval('probe_adoption_tries') = 1 THEN
          RAISE EXCEPTION 'terminating connection due to administrator command (probe)' USING ERRCODE = '57P01';
        END IF;
        RETURN NEW;
      END $$;
      CREATE TRIGGER probe_down_once BEFORE UPDATE ON settlements FOR EACH ROW
        WHEN (OLD.label = 'pending' AND NEW.label = 'quarantined' AND NEW.reason = 'interrupted') EXECUTE FUNCTION probe_down_once();`);
    apiKey = cluster.paidBuyer("adopt-buyer").api_key;
  }, 180_000);
  afterAll(async () => {
    await sql?.close();
    await cluster?.close();
  });

  test("is tried again until it lands: the attempt is resolved and its reservation too", async () => {
    const [n1, n2] = cluster.nodes as [TestCluster["nodes"][0], TestCluster["nodes"][0]];
    cluster.provider({ id: "adopt-prov", gateways: [n1], tokensPerSecond: 5 });
    await cluster.waitRoutable(n2, 1);
    // A stream owned by n2 (from the provider on n1); n2 dies mid-relay, n1 takes over its attempt.
    const client = new OpenAI({ apiKey, baseURL: n2.baseURL, maxRetries: 0 });
    const stream = await client.chat.completions.create({ model: MODEL, stream: true, max_tokens: 400, messages: [{ role: "user", content: "a long one" }] });
    try {
      for await (const chunk of stream) if (chunk.choices[0]?.delta?.content) await n2.kill();
    } catch {}

    const unresolved = async () =>
      (await sql`SELECT (SELECT count(*)::int FROM settlements WHERE label = 'pending') AS pending, (SELECT count(*)::int FROM reservations WHERE state = 'held') AS held`)[0] as {
        pending: number;
        held: number;
      };
    await waitFor(async () => {
      const left = await unresolved();
      return left.pending === 0 && left.held === 0;
    }, 20_000, "the dead node's attempt and reservation resolved").catch(() => {});
    expect(await unresolved()).toEqual({ pending: 0, held: 0 });
    const [tries] = await sql`SELECT last_value::int AS n FROM probe_adoption_tries`;
    expect(tries.n).toBeGreaterThanOrEqual(2);
    const [row] = await sql`SELECT label, reason FROM settlements`;
    expect(row).toEqual({ label: "quarantined", reason: "interrupted" });
    expect(cluster.cli(["ledger", "audit"]).exitCode).toBe(0);
  }, 120_000);
});
