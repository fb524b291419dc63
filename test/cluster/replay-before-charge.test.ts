// A cluster node keeps a non-streaming answer for retries in Redis before it records the delivery that
// charges for it, as the embedded gateway does with its replay file (docs/receipts.md, "Crashes"): a
// node killed between that record and the write leaves the buyer's retry, on any node, an answer to
// replay instead of a second charge. Redis answers later than the write is made, so the request's
// writes wait for its answer.
//
// The probe, with no timing in it: the node's Redis client is wrapped so that, when Redis has answered
// the SET that keeps the answer and before the node hears that answer, the test records "kept" in
// PostgreSQL. A trigger on `settlements` logs, for the UPDATE that writes the delivered record, how
// many "kept" rows it saw: 0 means the charge's record came before the copy.
import { afterAll, describe, expect, test } from "bun:test";
import { waitFor } from "../support/harness.ts";
import { clusterMissing } from "../support/cluster.ts";
import { probedClusterNode } from "../support/probedNode.ts";

describe.skipIf(clusterMissing !== null)("a cluster node keeps the answer before it records the delivery", () => {
  const cleanup: (() => Promise<void> | void)[] = [];
  afterAll(async () => {
    for (const c of cleanup.reverse()) await c();
  });

  test("the delivered record's UPDATE sees the answer already kept in Redis; the retry replays it", async () => {
    // The answer's copy is a SET of the body's entry holding a succeeded result.
    const keepsAnswer = (command: string, args: (string | number)[]) =>
      command === "SET" && String(args[0]).startsWith("gw:replay:b:") && String(args[1]).includes('"succeeded"');
    const { gateway, probe, ask } = await probedClusterNode({
      name: "order",
      cleanup,
      schema: `
        CREATE TABLE probe_kept (at TIMESTAMPTZ NOT NULL DEFAULT now());
        CREATE TABLE probe_delivered (kept_before BIGINT NOT NULL);
        CREATE FUNCTION probe_delivered() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          IF NEW.delivered_end_byte IS NOT NULL AND OLD.delivered_end_byte IS NULL THEN
            INSERT INTO probe_delivered (kept_before) SELECT count(*) FROM probe_kept;
          END IF;
          RETURN NEW;
        END $$;
        CREATE TRIGGER probe_delivered BEFORE UPDATE ON settlements FOR EACH ROW EXECUTE FUNCTION probe_delivered();`,
      wrap: (probe) => async (command, args, send) => {
        const answer = await send();
        if (keepsAnswer(command, args)) await probe`INSERT INTO probe_kept DEFAULT VALUES`;
        return answer;
      },
    });

    const content = "keep me before you charge me";
    const first = await ask(content, { "idempotency-key": "order-1" });
    expect(first.status).toBe(200);
    const body = await first.text();
    await waitFor(async () => (await probe`SELECT count(*)::int AS n FROM probe_delivered`)[0].n === 1, 10_000, "the delivered record");
    const [delivered] = await probe`SELECT kept_before::int AS kept_before FROM probe_delivered`;
    expect(delivered.kept_before).toBe(1);

    // The same key again: that very answer, under its first request id, not billed again.
    await waitFor(async () => (await gateway.store.listSettlements({})).every((s) => s.label !== "pending"), 10_000, "the attempt settled");
    const replay = await ask(content, { "idempotency-key": "order-1" });
    expect(replay.status).toBe(200);
    expect(await replay.text()).toBe(body);
    expect(replay.headers.get("x-request-id")).toBe(first.headers.get("x-request-id"));
    expect((await gateway.store.listSettlements({})).length).toBe(1);
  }, 120_000);
});
