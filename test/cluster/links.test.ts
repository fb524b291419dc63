// Node links (src/cluster/links.ts, docs/scale-out.md "Node links"): two nodes' link servers in one
// process, the Redis marker handed over by the test. A link carries messages byte for byte and in
// order, holds what arrives before the sender's marker (so nothing overtakes what the sender published
// before the link opened), refuses a wrong token, and speaks only for the node that opened it.
import { afterEach, expect, test } from "bun:test";
import { NodeLinks } from "../../src/cluster/links.ts";
import type { NodeMessage } from "../../src/cluster/messages.ts";
import { silentLog as log } from "../../src/log.ts";
import { waitFor } from "../support/harness.ts";

const made: NodeLinks[] = [];
afterEach(() => {
  for (const l of made.splice(0)) l.close();
});

interface Node {
  links: NodeLinks;
  got: [NodeMessage, number[] | null][];
  /** Markers this node sent, per peer: the test delivers them (Redis's part). */
  markers: string[];
}

function node(id: string, options: { markerWaitMs?: number } = {}): Node {
  const n: Node = { links: undefined as unknown as NodeLinks, got: [], markers: [] };
  n.links = new NodeLinks({
    nodeId: id,
    host: "127.0.0.1",
    port: 0,
    log,
    deliver: (header, frame) => void n.got.push([header, frame ? [...frame] : null]),
    sendOpenedMarker: (_peer, linkId) => void n.markers.push(linkId),
    markerWaitMs: options.markerWaitMs ?? 60_000,
  });
  made.push(n.links);
  return n;
}

const frameMsg = (from: string, i: number): NodeMessage => ({ t: "frame", from, session: `s${i}`, provider: "p" });

test("messages cross in order, frames byte for byte, once the sender's marker is in", async () => {
  const a = node("a");
  const b = node("b");
  const address = b.links.listen();
  a.links.listen();
  expect(a.links.send("b", frameMsg("a", 0))).toBe(false); // no link yet: the caller publishes instead
  a.links.connect("b", address);
  await waitFor(() => a.markers.length === 1, 5000, "link open");
  const frame = new Uint8Array([0, 1, 2, 0xff, 0x80, 10, 13]);
  for (let i = 0; i < 50; i++) expect(a.links.send("b", frameMsg("a", i), i === 7 ? frame : undefined)).toBe(true);
  expect(a.links.send("b", { t: "release", from: "a", key: "r#1" })).toBe(true);
  // Held: the marker (over Redis) has not come, so pub/sub messages sent before the link may still be on their way.
  await Bun.sleep(50);
  expect(b.got).toEqual([]);
  b.links.markerArrived(a.markers[0]!);
  await waitFor(() => b.got.length === 51, 5000, "51 messages");
  expect(b.got.slice(0, 50).map(([h]) => (h as { session: string }).session)).toEqual(Array.from({ length: 50 }, (_, i) => `s${i}`));
  expect(b.got[7]![1]).toEqual([...frame]);
  expect(b.got[8]![1]).toBeNull();
  expect(b.got[50]![0]).toEqual({ t: "release", from: "a", key: "r#1" });
  // After the marker, messages are delivered as they come.
  a.links.send("b", frameMsg("a", 99));
  await waitFor(() => b.got.length === 52, 5000, "52nd message");
});

test("a marker that comes before the link's socket opened there releases it at once", async () => {
  const a = node("a");
  const b = node("b");
  const address = b.links.listen();
  b.links.markerArrived("not-yet-open"); // unrelated early marker: kept aside, harmless
  a.links.connect("b", address);
  await waitFor(() => a.markers.length === 1, 5000, "link open");
  b.links.markerArrived(a.markers[0]!);
  a.links.send("b", frameMsg("a", 1));
  await waitFor(() => b.got.length === 1, 5000, "message");
});

test("without a marker (Redis down) the held messages go after markerWaitMs", async () => {
  const a = node("a");
  const b = node("b", { markerWaitMs: 100 });
  a.links.connect("b", b.links.listen());
  await waitFor(() => a.markers.length === 1, 5000, "link open");
  a.links.send("b", frameMsg("a", 1));
  await waitFor(() => b.got.length === 1, 5000, "released by the timer");
});

test("a wrong or short token is refused (403); a message claiming another sender is dropped", async () => {
  const a = node("a");
  const b = node("b", { markerWaitMs: 0 });
  const address = b.links.listen();
  const upgrade = (token: string) =>
    fetch(address.url.replace("ws:", "http:"), {
      headers: { connection: "Upgrade", upgrade: "websocket", "sec-websocket-version": "13", "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==", "x-gateway-node": "a", "x-gateway-link": "l1", "x-gateway-link-token": token },
    });
  expect((await upgrade("0".repeat(address.token.length))).status).toBe(403);
  expect((await upgrade("short")).status).toBe(403);
  a.links.connect("b", address);
  await waitFor(() => a.markers.length === 1, 5000, "link open");
  a.links.send("b", frameMsg("mallory", 1));
  a.links.send("b", frameMsg("a", 2));
  await waitFor(() => b.got.length === 1, 5000, "message");
  expect((b.got[0]![0] as { session: string }).session).toBe("s2");
});

test("a peer that goes away: sends fall back (false); its new address is linked again", async () => {
  const a = node("a");
  const b = node("b", { markerWaitMs: 0 });
  a.links.connect("b", b.links.listen());
  await waitFor(() => a.markers.length === 1, 5000, "link open");
  b.links.close();
  await waitFor(() => !a.links.send("b", frameMsg("a", 1)), 5000, "link closed");
  const b2 = node("b", { markerWaitMs: 0 });
  a.links.connect("b", b2.links.listen());
  await waitFor(() => a.links.send("b", frameMsg("a", 2)), 5000, "new link open");
  await waitFor(() => b2.got.length >= 1, 5000, "message on the new link");
  a.links.forget("b");
  expect(a.links.send("b", frameMsg("a", 3))).toBe(false);
});
