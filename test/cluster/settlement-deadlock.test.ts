// A settlement write that PostgreSQL aborts as a deadlock (or a serialization failure) is tried again,
// as one whose database was unreachable is: the aborted transaction left nothing. Found by the cluster
// crash chaos (double-death mode, seed 401): two nodes' batched settlements deadlocked, PostgreSQL
// aborted one batch, and its attempt stayed pending with its reservation held for as long as the node
// lived (`settlement_write_failed ... deadlock detected`).
//
// The probe: a trigger raises SQLSTATE 40P01 on the first try of a settlement's outcome (a sequence
// counts the tries: it is not rolled back with the transaction).
import { afterAll, describe, expect, test } from "bun:test";
import { waitFor } from "../support/harness.ts";
import { clusterMissing } from "../support/cluster.ts";
import { probedClusterNode } from "../support/probedNode.ts";

describe.skipIf(clusterMissing !== null)("a settlement write aborted as a deadlock", () => {
  const cleanup: (() => Promise<void> | void)[] = [];
  afterAll(async () => {
    for (const c of cleanup.reverse()) await c();
  });

  test("is tried again: the attempt settles and its reservation resolves", async () => {
    const { probe, ask } = await probedClusterNode({
      name: "deadlock",
      cleanup,
      schema: `
        CREATE SEQUENCE probe_outcome_tries;
        CREATE FUNCTION probe_deadlock_once() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          IF nextval('probe_outcome_tries') = 1 THEN
            RAISE EXCEPTION 'deadlock detected (probe)' USING ERRCODE = '40P01';
          END IF;
          RETURN NEW;
        END $$;
        CREATE TRIGGER probe_deadlock_once BEFORE UPDATE ON settlements FOR EACH ROW
          WHEN (OLD.label = 'pending' AND NEW.label <> 'pending') EXECUTE FUNCTION probe_deadlock_once();`,
      wrap: () => (_command, _args, send) => send(),
    });

    const answer = await ask("settle me despite a deadlock");
    expect(answer.status).toBe(200);
    await answer.text();
    const unresolved = async () =>
      (await probe`SELECT (SELECT count(*)::int FROM settlements WHERE label = 'pending') AS pending, (SELECT count(*)::int FROM reservations WHERE state = 'held') AS held`)[0] as {
        pending: number;
        held: number;
      };
    await waitFor(async () => {
      const left = await unresolved();
      return left.pending === 0 && left.held === 0;
    }, 15_000, "the attempt settled and its reservation resolved").catch(() => {});
    expect(await unresolved()).toEqual({ pending: 0, held: 0 });
    // The deadlock did happen (the first try was refused), and the outcome landed on a later one.
    const [tries] = await probe`SELECT last_value::int AS n FROM probe_outcome_tries`;
    expect(tries.n).toBeGreaterThanOrEqual(2);
  }, 120_000);
});
