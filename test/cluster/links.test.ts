// Node links (src/cluster/links.ts, docs/scale-out.md "Node links"): two nodes' link servers in one
// process, the Redis marker handed over by the test. A link carries messages byte for byte and in
// order, holds what arrives before the sender's marker (so nothing overtakes what the sender published
// before the link opened), refuses a wrong token, and speaks only for the node that opened it. A link
// held silent (a blackholed path, TCP still open) is dropped at both ends, and nothing it held arrives
// once the path flows again.
import { afterEach, describe, expect, test } from "bun:test";
import { NodeLinks } from "../../src/cluster/links.ts";
import type { NodeMessage } from "../../src/cluster/messages.ts";
import { silentLog as log } from "../../src/log.ts";
import { waitFor } from "../support/harness.ts";
import { startTcpProxy, type TcpProxy } from "../support/tcpProxy.ts";

const made: NodeLinks[] = [];
afterEach(() => {
  for (const l of made.splice(0)) l.close();
});

interface Node {
  links: NodeLinks;
  got: [NodeMessage, number[] | null][];
  /** Markers this node sent, per peer: the test delivers them (Redis's part). */
  markers: string[];
  /** Links this node dropped as silent, told to the peer (Redis's part again). */
  dropped: string[];
  /** Peers whose link was reported lost, with when (performance.now()). */
  lost: [string, number][];
}

function node(id: string, options: { markerWaitMs?: number; silenceMs?: number } = {}): Node {
  const n: Node = { links: undefined as unknown as NodeLinks, got: [], markers: [], dropped: [], lost: [] };
  n.links = new NodeLinks({
    nodeId: id,
    host: "127.0.0.1",
    port: 0,
    log,
    deliver: (header, frame) => void n.got.push([header, frame ? [...frame] : null]),
    sendOpenedMarker: (_peer, linkId) => void n.markers.push(linkId),
    sendDroppedMarker: (_peer, linkIds) => void n.dropped.push(...linkIds),
    lost: (peer) => void n.lost.push([peer, performance.now()]),
    markerWaitMs: options.markerWaitMs ?? 60_000,
    silenceMs: options.silenceMs ?? 0,
    retryMs: 100,
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

describe("a link held silent", () => {
  const SILENCE_MS = 600;
  let proxy: TcpProxy | null = null;
  afterEach(async () => {
    await proxy?.stop();
    proxy = null;
  });

  /** a's link to b through a proxy the test can blackhole; open, its marker delivered. */
  async function linkedThroughProxy(silenceMs = { a: SILENCE_MS, b: SILENCE_MS }): Promise<{ a: Node; b: Node }> {
    const a = node("a", { silenceMs: silenceMs.a });
    const b = node("b", { silenceMs: silenceMs.b });
    const address = b.links.listen();
    proxy = await startTcpProxy(Number(new URL(address.url).port), { holdCloses: true });
    a.links.connect("b", { ...address, url: address.url.replace(/:\d+\//, `:${proxy.port}/`) });
    await waitFor(() => a.markers.length === 1, 10_000, "link open");
    b.links.markerArrived(a.markers[0]!);
    a.links.send("b", frameMsg("a", 1));
    await waitFor(() => b.got.length === 1, 10_000, "first message");
    return { a, b };
  }

  test("is dropped at both ends after the silence window, and what it held never arrives", async () => {
    const { a, b } = await linkedThroughProxy();
    // Idle for three windows: the pings keep it open.
    const idleUntil = performance.now() + 3 * SILENCE_MS;
    await waitFor(() => performance.now() >= idleUntil || a.lost.length + b.lost.length > 0, 10_000, "idle");
    expect([a.lost, b.lost]).toEqual([[], []]);

    await proxy!.cut("blackhole");
    const cutAt = performance.now();
    for (let i = 2; i <= 5; i++) expect(a.links.send("b", frameMsg("a", i))).toBe(true); // into the hole
    // Each end notices on its own (the markers are not handed over here): the sender by unanswered pings, the receiver by silence.
    await waitFor(() => a.lost.length === 1 && b.lost.length === 1, 20_000, "both ends dropped the link");
    expect([a.lost[0]![0], b.lost[0]![0]]).toEqual(["b", "a"]);
    // Not before a window of silence (less one ping interval: the last pong may precede the cut).
    for (const [, at] of [...a.lost, ...b.lost]) expect(at - cutAt).toBeGreaterThanOrEqual(SILENCE_MS * 0.8 - 50);
    expect(a.dropped).toEqual([a.markers[0]!]);
    expect(b.dropped).toEqual([a.markers[0]!]);
    expect(a.links.send("b", frameMsg("a", 6))).toBe(false); // pub/sub meanwhile

    // The path flows again: the held bytes reach no one (both ends terminated their sockets); a new link carries what follows.
    await proxy!.restore();
    await waitFor(() => a.markers.length === 2, 10_000, "link made again");
    b.links.markerArrived(a.markers[1]!);
    expect(a.links.send("b", frameMsg("a", 7))).toBe(true);
    await waitFor(() => b.got.length >= 2, 10_000, "message on the new link");
    expect(b.got.map(([h]) => (h as { session: string }).session)).toEqual(["s1", "s7"]);
    expect([a.lost.length, b.lost.length]).toEqual([1, 1]);
  }, 60_000);

  test.each([
    ["the sender (its pings unanswered)", "a"],
    ["the receiver (nothing arrives)", "b"],
  ] as const)("the end that notices first, %s, tells the other (over Redis): it drops the link at once", async (_name, first) => {
    // Only `first` times out (the other's window is a minute): the other drops on the marker alone.
    const { a, b } = await linkedThroughProxy({ a: first === "a" ? SILENCE_MS : 60_000, b: first === "b" ? SILENCE_MS : 60_000 });
    const [noticing, told, other] = first === "a" ? [a, b, "b"] : [b, a, "a"];
    await proxy!.cut("blackhole");
    await waitFor(() => noticing.dropped.length > 0, 20_000, "one end dropped the link");
    expect(noticing.lost.map(([peer]) => peer)).toEqual([other]);
    // The blackhole holds the terminated socket's close too: the other end knows nothing yet.
    expect(told.lost).toEqual([]);
    told.links.droppedByPeer(first, noticing.dropped);
    expect(told.lost.map(([peer]) => peer)).toEqual([first]);
    // It tells nobody back (the first end knows), and a second marker for the same link changes nothing.
    expect(told.dropped).toEqual([]);
    told.links.droppedByPeer(first, noticing.dropped);
    expect(told.lost.length).toBe(1);
    expect(a.links.send("b", frameMsg("a", 9))).toBe(false); // a's link is gone either way
  }, 60_000);

  test("after this process stood still past the window, dropStale drops it at once (its peer's checks have)", async () => {
    const { a } = await linkedThroughProxy({ a: SILENCE_MS, b: 60_000 });
    // Heard a moment ago: not stale.
    a.links.dropStale();
    expect(a.lost).toEqual([]);
    // The process stands still (SIGSTOP, a long pause): no check runs, nothing is read.
    Bun.sleepSync(SILENCE_MS * 1.5);
    // Woken, before any timer of its own has run: the link still looks open ...
    expect(a.links.send("b", frameMsg("a", 2))).toBe(true);
    // ... until the node, fencing itself on waking, drops what went stale (src/cluster/node.ts).
    a.links.dropStale();
    expect(a.lost.map(([peer]) => peer)).toEqual(["b"]);
    expect(a.dropped).toEqual([a.markers[0]!]);
    expect(a.links.send("b", frameMsg("a", 3))).toBe(false);
  }, 60_000);
});
