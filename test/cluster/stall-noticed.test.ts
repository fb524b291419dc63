// A node woken from a stall longer than half its lease (a stopped process) may read its sockets before
// its fence timer runs. Found by CI on test/cluster/stalled-node.test.ts: the woken node relayed the
// provider's remaining frames and `end` to a buyer whose attempt a survivor had already resolved. So
// whatever arrives is preceded by the node's own lease check (docs/scale-out.md, "Fencing"): here the
// clock jumps and a message arrives in the same turn, with no timer able to run in between.
import { describe, expect, test } from "bun:test";
import { ClusterNode } from "../../src/cluster/node.ts";
import { encodeMessage, type SharedSessionView } from "../../src/cluster/messages.ts";
import { silentLog } from "../../src/log.ts";
import { waitFor } from "../support/harness.ts";
import { redisStandIn } from "../support/redisStandIn.ts";

const LEASE_MS = 1000;

/** A Redis stand-in that acknowledges every renewal. */
function answeringRedis() {
  let renewals = 0;
  const { redis, listeners } = redisStandIn((command, args) => {
    if (command === "SET" && String(args[0]).startsWith("gw:node:")) renewals++;
    if (command === "SET") return { ok: true, value: "OK" };
    if (command === "GET") return { ok: true, value: "epoch" };
    return { ok: true, value: [] };
  });
  return { redis, listeners, renewals: () => renewals };
}

describe("a node that wakes from a stall", () => {
  test("fences itself before it acts on a message that arrived, and refuses new requests", async () => {
    const { redis, listeners, renewals } = answeringRedis();
    let clock = 0;
    const node = new ClusterNode<SharedSessionView>({ nodeId: "n1", redis, leaseMs: LEASE_MS, log: silentLog, link: null, monotonic: () => clock });
    const seen: string[] = [];
    await node.start({
      message: (header) => void seen.push(`message ${header.t}`),
      nodeDied() {},
      linkLost() {},
      changed() {},
      localViews: () => [],
      fenced: () => {
        seen.push("fenced");
        return 1;
      },
      sweepOrphans: async () => {},
    });
    try {
      await waitFor(() => renewals() >= 1, 2000, "the first renewal acknowledged");
      // Within half a lease of the renewal: a message is acted on, and the node takes requests.
      clock = LEASE_MS * 0.4;
      const inbox = listeners.get("node:n1:inbox")!;
      inbox(encodeMessage({ t: "lost", from: "n2", key: "req_a#1" }));
      expect(seen).toEqual(["message lost"]);
      expect(node.noticeStall()).toBe(false);

      // The process was stopped past half a lease: the next message finds it fenced first.
      clock = LEASE_MS * 2;
      inbox(encodeMessage({ t: "lost", from: "n2", key: "req_b#1" }));
      expect(seen).toEqual(["message lost", "fenced", "message lost"]);
      expect(node.fenced).toBe(true);
      expect(node.noticeStall()).toBe(true);
    } finally {
      await node.stop();
    }
  });
});
