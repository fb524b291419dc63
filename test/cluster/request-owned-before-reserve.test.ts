// A cluster node records a request as its own (`r:<id>` in `gw:owned:<node>`, which a survivor reads to
// resolve a dead node's reservations) before it writes the request's reservation. Found by the cluster
// crash chaos (`bun run chaos --cluster`, seeds 22009 and 23008): the record was made when the request
// started running, after the reservation's commit; a node killed in between left the reservation held
// with nothing pointing at it. The record now rides the concurrency-slot script, which runs first.
//
// The probe, with no timing in it: the node's Redis client is wrapped so that, when Redis has answered
// a command that puts the request in the owned set and before the node hears that answer, the test
// records "owned" in PostgreSQL; a trigger on `reservations` logs how many such rows it saw.
import { afterAll, describe, expect, test } from "bun:test";
import { clusterMissing } from "../support/cluster.ts";
import { probedClusterNode } from "../support/probedNode.ts";

describe.skipIf(clusterMissing !== null)("a cluster node owns a request before it reserves for it", () => {
  const cleanup: (() => Promise<void> | void)[] = [];
  afterAll(async () => {
    for (const c of cleanup.reverse()) await c();
  });

  test("the reservation's INSERT sees the request already in the owned set", async () => {
    /** The request a command puts in an owned set, if it does (a plain SADD, or the slot script given the set). */
    const ownedRequest = (command: string, args: (string | number)[]): string | null => {
      const texts = args.map(String);
      if (command === "SADD" && texts[0]!.startsWith("gw:owned:") && texts[1]!.startsWith("r:")) return texts[1]!.slice(2);
      if (command === "EVAL" && texts[1] === "2" && texts[3]!.startsWith("gw:owned:") && texts[0]!.includes("ZADD")) return texts[4]!;
      return null;
    };
    const { probe, ask } = await probedClusterNode({
      name: "own-request",
      cleanup,
      schema: `
        CREATE TABLE probe_owned (request_id TEXT NOT NULL);
        CREATE TABLE probe_reserved (request_id TEXT NOT NULL, owned_before BIGINT NOT NULL);
        CREATE FUNCTION probe_reserved() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          INSERT INTO probe_reserved SELECT NEW.request_id, count(*) FROM probe_owned WHERE request_id = NEW.request_id;
          RETURN NEW;
        END $$;
        CREATE TRIGGER probe_reserved BEFORE INSERT ON reservations FOR EACH ROW EXECUTE FUNCTION probe_reserved();`,
      wrap: (probe) => async (command, args, send) => {
        const answer = await send();
        const request = ownedRequest(command, args);
        if (request !== null) await probe`INSERT INTO probe_owned VALUES (${request})`;
        return answer;
      },
    });

    const answer = await ask("reserve me");
    expect(answer.status).toBe(200);
    await answer.text();
    const reserved = await probe`SELECT request_id, owned_before::int AS owned_before FROM probe_reserved`;
    expect(reserved.length).toBe(1);
    expect(reserved[0].owned_before).toBe(1);
  }, 120_000);
});
