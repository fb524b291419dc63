// Direct node-to-node links (docs/scale-out.md, "Node links"): each node listens on a WebSocket of its
// own and announces its address, with a per-process token, in its registry lease. A node sends another
// node's messages over the link it opened to it, and over that node's Redis inbox while it has none:
// a frame then skips Redis's copy and one process wake-up. Links carry no state of their own; leases
// still decide who is alive.
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
   * A link to or from `peer` closed after it had opened: the messages still in it are lost (a broken
   * connection keeps no count of what arrived), so whatever was waiting on them must not wait on.
   */
  lost?(peer: string): void;
  /** Tells `peer` over its Redis inbox that this node's link `linkId` to it is open. */
  sendOpenedMarker(peer: string, linkId: string): void;
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
}

interface Outbound {
  address: LinkAddress;
  socket: WebSocket;
  open: boolean;
  retry: ReturnType<typeof setTimeout> | null;
}

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

  constructor(options: NodeLinksOptions) {
    this.options = options;
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
        return server.upgrade(req, { data: { peer, linkId, held: [], timer: null } }) ? undefined : new Response("upgrade required", { status: 426 });
      },
      websocket: {
        maxPayloadLength: MAX_MESSAGE_BYTES,
        idleTimeout: 0,
        // Per-message deflate would cost CPU per frame for bytes that cross a LAN once.
        perMessageDeflate: false,
        open: (ws) => this.inboundOpened(ws),
        message: (ws, data) => this.inboundMessage(ws, data),
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

  close(): void {
    this.closed = true;
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
    const link: Outbound = { address, socket, open: false, retry: null };
    this.outbound.set(peer, link);
    socket.onopen = () => {
      if (this.outbound.get(peer) !== link) return socket.close();
      link.open = true;
      opened = true;
      this.unreachable.delete(address.url);
      this.options.sendOpenedMarker(peer, linkId);
      this.options.log.info("cluster_link_open", { peer });
    };
    let opened = false;
    socket.onclose = () => {
      link.open = false;
      if (this.outbound.get(peer) !== link || this.closed) return;
      if (opened) {
        this.options.log.warn("cluster_link_closed", { peer });
        this.options.lost?.(peer);
      } else if (!this.unreachable.has(address.url)) {
        this.unreachable.add(address.url);
        this.options.log.warn("cluster_link_unreachable", { peer, url: address.url });
      }
      // Messages go over pub/sub meanwhile; the link is made again while the peer announces it.
      link.retry = setTimeout(() => {
        if (this.outbound.get(peer) === link && !this.closed) this.open(peer, address);
      }, this.options.retryMs ?? 1000);
      link.retry.unref?.();
    };
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
    this.inbound.set(link.linkId, link);
    if (this.earlyMarkers.delete(link.linkId)) return this.release(link);
    // Redis down (no marker coming): nothing can be on its way there either.
    link.timer = setTimeout(() => this.release(link), this.options.markerWaitMs ?? 1000);
    link.timer.unref?.();
  }

  private inboundMessage(ws: ServerWebSocket<Inbound>, data: string | Buffer): void {
    const link = ws.data;
    if (typeof data === "string") return;
    const decoded = decodeBinaryMessage(data);
    // A link speaks for the node that opened it only.
    if (!decoded || decoded.header.from !== link.peer) return;
    if (link.held) link.held.push([decoded.header, decoded.frame]);
    else this.deliver(decoded.header, decoded.frame);
  }

  private inboundClosed(ws: ServerWebSocket<Inbound>): void {
    const link = ws.data;
    if (link.timer) clearTimeout(link.timer);
    this.inbound.delete(link.linkId);
    if (!this.closed) this.options.lost?.(link.peer);
  }

  private release(link: Inbound): void {
    if (link.timer) clearTimeout(link.timer);
    link.timer = null;
    const held = link.held;
    link.held = null;
    for (const [header, frame] of held ?? []) this.deliver(header, frame);
  }

  private deliver(header: NodeMessage, frame: Uint8Array | null): void {
    try {
      this.options.deliver(header, frame);
    } catch (error) {
      this.options.log.error("cluster_message_failed", { error: String(error) });
    }
  }
}

/** A host as it goes in a URL (IPv6 literals in brackets). */
const urlHost = (host: string) => (host.includes(":") && !host.startsWith("[") ? `[${host}]` : host);
