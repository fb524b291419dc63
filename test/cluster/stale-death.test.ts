// A node's look for dead members (one script over the member set) answers on the command connection,
// while a node's registry broadcasts arrive on the subscriber connection: a "dead" answer can reach
// the looking node after a broadcast the other node sent once it was back (restarted under its id).
// Found by the cluster crash chaos (`bun run chaos --cluster`, seed 22007): the survivor took the
// restarted node for dead again, cancelled the jobs it had just sent and judged their receipts itself
// (`interrupted`), and the buyers' requests hung. A death verdict asked for before a broadcast heard
// from that node is stale and ignored; a later verdict still counts.
import { describe, expect, test } from "bun:test";
import { ClusterNode } from "../../src/cluster/node.ts";
import type { SharedSessionView } from "../../src/cluster/messages.ts";
import { silentLog } from "../../src/log.ts";
import { waitFor } from "../support/harness.ts";
import { redisStandIn } from "../support/redisStandIn.ts";

/** A Redis stand-in: the member-set script's answers are held until the test releases them. */
function scriptedRedis() {
  const held: ((dead: string[]) => void)[] = [];
  const { redis, listeners } = redisStandIn((command, args) => {
    if (command === "EVAL" && args.includes("gw:nodes") && String(args[0]).includes("EXISTS', 'gw:node:")) {
      return new Promise((resolve) => held.push((dead) => resolve({ ok: true, value: dead })));
    }
    if (command === "SET") return { ok: true, value: "OK" };
    return { ok: true, value: [] };
  });
  const broadcast = (node: string, incarnation: string) =>
    listeners.get("registry")!(JSON.stringify({ node, incarnation, full: true, views: [], gone: [] }));
  return { redis, held, broadcast };
}

describe("a dead node's verdict older than its last broadcast", () => {
  test("is ignored; a verdict asked after it still counts", async () => {
    const { redis, held, broadcast } = scriptedRedis();
    const node = new ClusterNode<SharedSessionView>({ nodeId: "n1", redis, leaseMs: 200, log: silentLog, link: null });
    const deaths: { nodeId: string; takeOver: boolean }[] = [];
    await node.start({ message() {}, nodeDied: (nodeId, takeOver) => deaths.push({ nodeId, takeOver }), linkLost() {}, changed() {}, localViews: () => [], fenced: () => 0, sweepOrphans: async () => {} });
    try {
      broadcast("n2", "first");
      // A look is on its way (the script ran while n2's membership was missing) ...
      await waitFor(() => held.length >= 1, 2000, "a look for dead nodes");
      const stale = held.shift()!;
      // ... n2 is back and broadcasts; then the old answer arrives.
      broadcast("n2", "second");
      stale(["n2"]);
      await Bun.sleep(20);
      // The restart itself is a death of the old incarnation (nothing to take over); the stale verdict adds none.
      expect(deaths).toEqual([{ nodeId: "n2", takeOver: false }]);
      // Looks asked after that broadcast still find a real death.
      await waitFor(() => held.length >= 1, 2000, "the next look");
      for (const next of held.splice(0)) next(["n2"]);
      await waitFor(() => deaths.length > 1, 2000, "the death");
      expect(deaths).toEqual([{ nodeId: "n2", takeOver: false }, { nodeId: "n2", takeOver: true }]);
    } finally {
      await node.stop();
      for (const h of held.splice(0)) h([]);
    }
  });
});
