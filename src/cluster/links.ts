// Direct node-to-node links (docs/scale-out.md, "Node links"): each node listens on a WebSocket of its
// own and announces its address, with a per-process token, in its registry lease. A node sends another
// node's messages over the link it opened to it, and over that node's Redis inbox while it has none:
// a frame then skips Redis's copy and one process wake-up. Links carry no state of their own; leases
// still decide who is alive. A link that goes silent (a blackholed path keeps TCP open) is dropped as
// if it had closed: every link is checked by one timer, never per message.
import { randomBytes, timingSafeEqual } from "node:crypto";
import type { Server, ServerWebSocket } from "bun";
import type { Log } from "../log.ts";
import { decodeBinaryMessage, encodeBinaryMessage, type NodeMessage } from "./messages.ts";

/** Where a node's link server listens, as announced with its registry lease. */
export interface LinkAddress {
  url: string;
  token: string;
}

export interface NodeLinksOptions {
  nodeId: string;
  /** Address the link server binds and announces. */
  host: string;
  /** Its port (0: any free one). */
  port: number;
  /** `host:port` the other nodes dial, when not the bound address (a NAT, a published port, a proxy). */
  announce?: string;
  log: Log;
  /** A message that came over a link from another node, in the order that node sent it. */
  deliver(header: NodeMessage, frame: Uint8Array | null): void;
  /**
   * A link to or from `peer` closed after it had opened, or was dropped as silent: the messages still
   * in it are lost (a broken connection keeps no count of what arrived), so whatever was waiting on
   * them must not wait on.
   */
  lost?(peer: string): void;
  /** Tells `peer` over its Redis inbox that this node's link `linkId` to it is open. */
  sendOpenedMarker(peer: string, linkId: string): void;
  /** Tells `peer` over its Redis inbox that links `linkIds` between the two (either way) were dropped as silent. */
  sendDroppedMarker(peer: string, linkIds: string[]): void;
  /**
   * A link on which nothing (message, ping, pong) arrived for this long is dropped as broken (0: never).
   * The sender pings every fifth of it; the receiver answers with a pong.
   */
  silenceMs?: number;
  /** How long a dropped link waits before it is made again (while its peer is a member). */
  retryMs?: number;
  /** Longest a new inbound link holds its messages waiting for the sender's marker. */
  markerWaitMs?: number;
}

const PATH = "/cluster/link";
const MAX_MESSAGE_BYTES = 4 * 1024 * 1024;

interface Inbound {
  peer: string;
  linkId: string;
  /** Messages held until the sender's pub/sub marker says nothing sent before the link is still on its way. */
  held: [NodeMessage, Uint8Array | null][] | null;
  timer: ReturnType<typeof setTimeout> | null;
  socket: ServerWebSocket<Inbound> | null;
  quiet: Quiet;
  /** Dropped here as silent: nothing more it carries is delivered, its close reports nothing. */
  dropped: boolean;
}

interface Outbound {
  address: LinkAddress;
  linkId: string;
  socket: WebSocket;
  open: boolean;
  opened: boolean;
  retry: ReturnType<typeof setTimeout> | null;
  quiet: Quiet;
  dropped: boolean;
}

/** What a link heard since the last check (a flag per message: no clock read on the hot path). */
interface Quiet {
  heard: boolean;
  /** Checks in a row that found nothing heard. */
  silentChecks: number;
  /** When (monotonic ms) a check last found something heard. */
  heardBy: number;
  /** When (monotonic ms) the last ping or pong arrived: one a check interval while the link works. */
  beatAt: number;
}

/** Checks per silence window: a link is dropped after this many checks in a row heard nothing. */
const SILENCE_CHECKS = 5;
const freshQuiet = (): Quiet => ({ heard: false, silentChecks: 0, heardBy: performance.now(), beatAt: performance.now() });
const beat = (quiet: Quiet) => {
  quiet.heard = true;
  quiet.beatAt = performance.now();
};

export class NodeLinks {
  readonly token = randomBytes(24).toString("hex");
  private readonly options: NodeLinksOptions;
  private server: Server<Inbound> | null = null;
  private readonly outbound = new Map<string, Outbound>();
  private readonly inbound = new Map<string, Inbound>();
  /** Markers that arrived before their link's socket opened here. */
  private readonly earlyMarkers = new Set<string>();
  /** Addresses a link to which failed before it ever opened (logged once each: likely a wrong clusterLinkHost). */
  private readonly unreachable = new Set<string>();
  private closed = false;
  private silenceTimer: ReturnType<typeof setInterval> | null = null;

  constructor(options: NodeLinksOptions) {
    this.options = options;
    const silenceMs = options.silenceMs ?? 0;
    if (silenceMs > 0) {
      this.silenceTimer = setInterval(() => this.checkSilence(silenceMs), Math.max(10, Math.floor(silenceMs / SILENCE_CHECKS)));
      this.silenceTimer.unref?.();
    }
  }

  /** Starts the link server; returns the address to announce. */
  listen(): LinkAddress {
    const token = Buffer.from(this.token);
    this.server = Bun.serve<Inbound>({
      hostname: this.options.host,
      port: this.options.port,
      fetch: (req, server) => {
        if (new URL(req.url).pathname !== PATH) return new Response("not found", { status: 404 });
        const given = Buffer.from(req.headers.get("x-gateway-link-token") ?? "");
        const peer = req.headers.get("x-gateway-node") ?? "";
        const linkId = req.headers.get("x-gateway-link") ?? "";
        if (!peer || !linkId || given.length !== token.length || !timingSafeEqual(given, token)) return new Response("forbidden", { status: 403 });
        const data: Inbound = { peer, linkId, held: [], timer: null, socket: null, quiet: freshQuiet(), dropped: false };
        return server.upgrade(req, { data }) ? undefined : new Response("upgrade required", { status: 426 });
      },
      websocket: {
        maxPayloadLength: MAX_MESSAGE_BYTES,
        idleTimeout: 0,
        // Per-message deflate would cost CPU per frame for bytes that cross a LAN once.
        perMessageDeflate: false,
        open: (ws) => this.inboundOpened(ws),
        message: (ws, data) => this.inboundMessage(ws, data),
        ping: (ws) => beat(ws.data.quiet),
        close: (ws) => this.inboundClosed(ws),
      },
    });
    const dialed = this.options.announce || `${urlHost(this.options.host)}:${this.server.port}`;
    return { url: `ws://${dialed}${PATH}`, token: this.token };
  }

  /** Sends a message over the open link to `peer`; false when there is none (the caller uses pub/sub). */
  send(peer: string, header: NodeMessage, frame?: Uint8Array): boolean {
    const link = this.outbound.get(peer);
    if (!link?.open) return false;
    link.socket.send(encodeBinaryMessage(header, frame));
    return true;
  }

  /** `peer` announced its link address: opens a link to it (again, when the address changed). */
  connect(peer: string, address: LinkAddress): void {
    if (this.closed || peer === this.options.nodeId) return;
    const known = this.outbound.get(peer);
    if (known && known.address.url === address.url && known.address.token === address.token) return;
    if (known) this.drop(peer);
    this.open(peer, address);
  }

  /** `peer` left or died: its link is closed and not made again. */
  forget(peer: string): void {
    this.drop(peer);
  }

  /** The sender's marker for inbound link `linkId` came over pub/sub: what it held is delivered. */
  markerArrived(linkId: string): void {
    const link = this.inbound.get(linkId);
    if (link) return this.release(link);
    this.earlyMarkers.add(linkId);
    setTimeout(() => this.earlyMarkers.delete(linkId), 10_000).unref?.();
  }

  /** `peer` dropped links `linkIds` between the two as silent (its marker came over pub/sub or a link): so does this node. */
  droppedByPeer(peer: string, linkIds: string[]): void {
    this.dropSilent(peer, new Set(linkIds), "peer");
  }

  close(): void {
    this.closed = true;
    if (this.silenceTimer) clearInterval(this.silenceTimer);
    for (const peer of [...this.outbound.keys()]) this.drop(peer);
    this.server?.stop(true);
    this.server = null;
  }

  private open(peer: string, address: LinkAddress): void {
    const linkId = randomBytes(12).toString("hex");
    const socket = new WebSocket(address.url, {
      headers: { "x-gateway-node": this.options.nodeId, "x-gateway-link": linkId, "x-gateway-link-token": address.token },
    });
    socket.binaryType = "arraybuffer";
    const link: Outbound = { address, linkId, socket, open: false, opened: false, retry: null, quiet: freshQuiet(), dropped: false };
    this.outbound.set(peer, link);
    socket.onopen = () => {
      if (this.outbound.get(peer) !== link || link.dropped) return socket.close();
      link.open = true;
      link.opened = true;
      link.quiet.heard = true;
      this.unreachable.delete(address.url);
      this.options.sendOpenedMarker(peer, linkId);
      this.options.log.info("cluster_link_open", { peer });
    };
    socket.addEventListener("pong", () => beat(link.quiet));
    socket.onclose = () => {
      link.open = false;
      if (this.outbound.get(peer) !== link || this.closed || link.dropped) return;
      this.ended(peer, link);
    };
  }

  /** Outbound link `link` to `peer` closed: reported, and made again later. */
  private ended(peer: string, link: Outbound): void {
    if (link.opened) {
      this.options.log.warn("cluster_link_closed", { peer });
      this.options.lost?.(peer);
    } else if (!this.unreachable.has(link.address.url)) {
      this.unreachable.add(link.address.url);
      this.options.log.warn("cluster_link_unreachable", { peer, url: link.address.url });
    }
    this.retryLater(peer, link);
  }

  /** Messages go over pub/sub meanwhile; the link is made again while the peer announces it. */
  private retryLater(peer: string, link: Outbound): void {
    link.retry = setTimeout(() => {
      if (this.outbound.get(peer) === link && !this.closed) this.open(peer, link.address);
    }, this.options.retryMs ?? 1000);
    link.retry.unref?.();
  }

  /**
   * Every fifth of `silenceMs`: a link that heard nothing for the whole window, over at least
   * SILENCE_CHECKS checks that ran (a stall of this process is not the link's silence), is dropped;
   * each open outbound link sends a ping, which keeps both ends hearing something while idle.
   */
  private checkSilence(silenceMs: number): void {
    const now = performance.now();
    this.dropSilentWhere((quiet) => {
      if (quiet.heard) {
        quiet.heard = false;
        quiet.silentChecks = 0;
        quiet.heardBy = now;
        return false;
      }
      return ++quiet.silentChecks >= SILENCE_CHECKS && now - quiet.heardBy >= silenceMs;
    }, true);
  }

  /**
   * This process was stalled (its node fenced itself on waking): a link whose last ping or pong is a
   * whole window old was dropped meanwhile by its peer's own checks (a live link beats every check
   * interval), so what is sent on it now would be lost. Such links are dropped at once, without
   * waiting for this process's checks to run.
   */
  dropStale(): void {
    const silenceMs = this.options.silenceMs ?? 0;
    if (silenceMs <= 0 || this.closed) return;
    const now = performance.now();
    this.dropSilentWhere((quiet) => now - quiet.beatAt >= silenceMs, false);
  }

  private dropSilentWhere(silent: (quiet: Quiet) => boolean, pingOthers: boolean): void {
    const found = new Map<string, Set<string>>();
    const add = (peer: string, linkId: string) => found.set(peer, (found.get(peer) ?? new Set()).add(linkId));
    for (const [peer, link] of this.outbound) {
      if (link.dropped || link.retry) continue;
      if (silent(link.quiet)) add(peer, link.linkId);
      else if (pingOthers && link.open) link.socket.ping();
    }
    for (const link of this.inbound.values()) if (silent(link.quiet)) add(link.peer, link.linkId);
    for (const [peer, linkIds] of found) this.dropSilent(peer, linkIds, "timeout");
  }

  /**
   * Drops links `linkIds` to and from `peer` as if they had closed, with one loss reported for them
   * all (two losses a moment apart would let go twice of the work started in between): their sockets
   * are terminated, so nothing they still hold can arrive later. On a timeout the peer is told, ahead
   * of anything sent to it after, so that it lets go of the same work now rather than at its own
   * timeout. An outbound link that never opened is only made again.
   */
  private dropSilent(peer: string, linkIds: Set<string>, by: "timeout" | "peer"): void {
    const dropped: string[] = [];
    const out = this.outbound.get(peer);
    let outbound = false;
    if (out && linkIds.has(out.linkId) && !out.dropped && !out.retry) {
      out.dropped = true;
      out.open = false;
      outbound = out.opened;
      if (out.opened) dropped.push(out.linkId);
      try {
        out.socket.terminate();
      } catch {}
      if (!this.closed) this.retryLater(peer, out);
    }
    for (const linkId of linkIds) {
      const link = this.inbound.get(linkId);
      if (!link || link.peer !== peer) continue;
      link.dropped = true;
      link.held = null;
      if (link.timer) clearTimeout(link.timer);
      link.timer = null;
      this.inbound.delete(linkId);
      dropped.push(linkId);
      try {
        link.socket?.terminate();
      } catch {}
    }
    if (dropped.length === 0 || this.closed) return;
    // `outbound`: this node's own link to the peer was one of them (it makes that one again).
    this.options.log.warn("cluster_link_silent", { peer, links: dropped.length, outbound, by });
    if (by === "timeout") {
      this.options.sendDroppedMarker(peer, dropped);
      // And ahead of what follows on a link to it still open: a job sent there next must not reach
      // the peer before the marker, or it answers into the link just dropped.
      const marker: NodeMessage = { t: "unlinked", from: this.options.nodeId, links: dropped };
      const out = this.outbound.get(peer);
      if (out?.open) out.socket.send(encodeBinaryMessage(marker));
    }
    this.options.lost?.(peer);
  }

  private drop(peer: string): void {
    const link = this.outbound.get(peer);
    if (!link) return;
    this.outbound.delete(peer);
    link.open = false;
    if (link.retry) clearTimeout(link.retry);
    try {
      link.socket.close();
    } catch {}
  }

  private inboundOpened(ws: ServerWebSocket<Inbound>): void {
    const link = ws.data;
    link.socket = ws;
    link.quiet.heard = true;
    this.inbound.set(link.linkId, link);
    if (this.earlyMarkers.delete(link.linkId)) return this.release(link);
    // Redis down (no marker coming): nothing can be on its way there either.
    link.timer = setTimeout(() => this.release(link), this.options.markerWaitMs ?? 1000);
    link.timer.unref?.();
  }

  private inboundMessage(ws: ServerWebSocket<Inbound>, data: string | Buffer): void {
    const link = ws.data;
    link.quiet.heard = true;
    if (typeof data === "string" || link.dropped) return;
    const decoded = decodeBinaryMessage(data);
    // A link speaks for the node that opened it only.
    if (!decoded || decoded.header.from !== link.peer) return;
    if (link.held) link.held.push([decoded.header, decoded.frame]);
    else this.deliver(decoded.header, decoded.frame);
  }

  private inboundClosed(ws: ServerWebSocket<Inbound>): void {
    const link = ws.data;
    if (link.dropped) return;
    if (link.timer) clearTimeout(link.timer);
    this.inbound.delete(link.linkId);
    if (!this.closed) this.options.lost?.(link.peer);
  }

  private release(link: Inbound): void {
    if (link.dropped) return;
    if (link.timer) clearTimeout(link.timer);
    link.timer = null;
    const held = link.held;
    link.held = null;
    for (const [header, frame] of held ?? []) this.deliver(header, frame);
  }

  private deliver(header: NodeMessage, frame: Uint8Array | null): void {
    if (header.t === "unlinked") return this.droppedByPeer(header.from, header.links);
    try {
      this.options.deliver(header, frame);
    } catch (error) {
      this.options.log.error("cluster_message_failed", { error: String(error) });
    }
  }
}

/** A host as it goes in a URL (IPv6 literals in brackets). */
const urlHost = (host: string) => (host.includes(":") && !host.startsWith("[") ? `[${host}]` : host);
