// A cluster node gives up its record of owning an attempt (`gw:owned:<node>`, which a survivor reads
// to resolve a dead node's settlements) only once the attempt's outcome is durable. Found by the
// cluster crash chaos (`bun run chaos --cluster`, seed 22001): the node dropped it when it decided the
// outcome, before the write; killed in between, it left the attempt pending in PostgreSQL and in no
// owned set, so no survivor resolved it and its reservation stayed held until the provider happened to
// re-send the receipt on a new session.
//
// The probe, with no timing in it: a trigger makes the outcome's UPDATE wait 1 s inside its
// transaction, and the node's Redis client is wrapped so that, when the node removes the attempt from
// its owned set, the test reads the row on another connection: it must be final already.
import { afterAll, describe, expect, test } from "bun:test";
import { waitFor } from "../support/harness.ts";
import { clusterMissing } from "../support/cluster.ts";
import { probedClusterNode } from "../support/probedNode.ts";

describe.skipIf(clusterMissing !== null)("a cluster node owns an attempt until its outcome is durable", () => {
  const cleanup: (() => Promise<void> | void)[] = [];
  afterAll(async () => {
    for (const c of cleanup.reverse()) await c();
  });

  test("the attempt leaves the owned set only after the settlement's commit", async () => {
    /** The attempt's stored label each time the node gave up owning it. */
    const labelsWhenReleased: string[] = [];
    const { client, ask } = await probedClusterNode({
      name: "own",
      cleanup,
      schema: `
        CREATE FUNCTION probe_slow_outcome() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          PERFORM pg_sleep(1);
          RETURN NEW;
        END $$;
        CREATE TRIGGER probe_slow_outcome BEFORE UPDATE ON settlements FOR EACH ROW
          WHEN (OLD.label = 'pending' AND NEW.label <> 'pending') EXECUTE FUNCTION probe_slow_outcome();`,
      wrap: (probe) => async (command, args, send) => {
        const member = String(args[1] ?? "");
        if (command === "SREM" && String(args[0]).startsWith("gw:owned:") && member.includes("#")) {
          const cut = member.lastIndexOf("#");
          const [row] = await probe`SELECT label FROM settlements WHERE request_id = ${member.slice(0, cut)} AND attempt_n = ${Number(member.slice(cut + 1))}`;
          labelsWhenReleased.push(row?.label ?? "missing");
        }
        return send();
      },
    });

    const answer = await ask("settle me");
    expect(answer.status).toBe(200);
    await answer.text();
    await waitFor(() => labelsWhenReleased.length === 1, 15_000, "the node to give up the attempt");
    expect(labelsWhenReleased.length).toBe(1);
    expect(["verified", "quarantined", "zero_settled"]).toContain(labelsWhenReleased[0]!);
    // The request leaves the set too once its end is written: nothing is owned for ever (the set grew
    // by one member a request for the node's whole life, and a survivor resolved every one again).
    // What stays is the process's writer (`w:`), one member for its life.
    const owned = async () => {
      const keys = await client.call<string[]>("KEYS", ["gw:owned:*"]);
      const sets = keys.ok ? await Promise.all(keys.value.map((k) => client.call<string[]>("SMEMBERS", [k]))) : [];
      return sets.flatMap((r) => (r.ok ? r.value : [])).filter((member) => !member.startsWith("w:"));
    };
    let left: string[] = await owned();
    for (let i = 0; i < 100 && left.length > 0; i++) {
      await Bun.sleep(50);
      left = await owned();
    }
    expect(left).toEqual([]);
  }, 120_000);
});
