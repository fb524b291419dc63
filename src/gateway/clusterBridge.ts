// The gateway's side of a cluster node (docs/scale-out.md): remote provider sessions as routing
// candidates and links, other nodes' jobs on this node's sessions, their frames sent back, and what
// happens when a node dies. Transport and leases are src/cluster/'s; this module only maps messages
// to the registry, the request actors (through the same job-frame path as local sockets) and settlement.
import { freeSlots } from "../../actors/providerSession.ts";
import type { ClusterNode, ClusterHandlers } from "../cluster/node.ts";
import type { ChangeMessage, NodeMessage, SharedSessionView } from "../cluster/messages.ts";
import type { Log } from "../log.ts";
import { decodeProviderFrame, encodeFrame } from "../wire/codec.ts";
import type { ProviderFrame } from "../wire/frames.ts";
import { attemptFrame, type EndpointCluster } from "./providerEndpoint.ts";
import { attemptKey, isRemote, type Registry, type RemoteSession } from "./registry.ts";
import type { RemoteProviders } from "./dispatchDeps.ts";
import type { ProviderView } from "./routing.ts";
import type { Settlements } from "./settlements.ts";

/** A provider session as other nodes route to it. */
export interface SharedProviderView extends ProviderView, SharedSessionView {
  /** min(max_concurrency, reported capacity): the slots the session has in all. */
  capacity: number;
  /** Attempts in flight on the session, per node that owns them. */
  inFlightByNode: Record<string, number>;
  /** Models it may serve, with the hashes it advertised (models it was caught measuring otherwise are left out). */
  models: { model_id: string; model_hash: string }[];
  /** Its receipt key (base64), for the route snapshot. */
  publicKey: string;
}

export interface ClusterBridgeDeps {
  node: ClusterNode<SharedProviderView>;
  registry: Registry;
  settlements: Settlements;
  log: Log;
  /** Resolves a request's reservation once it starts no more attempts (a dead node's requests). */
  requestEnded: (requestId: string) => void;
  /** Applies a change another node announced (key caches, catalog, bans). */
  changed: (change: ChangeMessage) => void;
  /** Ends every request in flight on this node (it is fenced); the count ended. */
  fenced: () => number;
  /** What the store holds unresolved: pending attempts (`request#n`) and held reservations of requests not ended. */
  unresolved: () => Promise<{ attempts: string[]; requests: string[] }>;
}

export interface ClusterBridge {
  handlers: ClusterHandlers<SharedProviderView>;
  endpoint: EndpointCluster;
  remote: RemoteProviders;
  /** Resolves what a previous process under this node's id left unsettled (a restart before its lease lapsed). */
  resolvePredecessor(): Promise<void>;
  /** Where a `settled` frame goes when the provider's session is on another node. */
  sendToProvider(providerId: string, frame: Uint8Array): void;
}

const parseKey = (key: string): { requestId: string; attemptN: number } | null => {
  const cut = key.lastIndexOf("#");
  const attemptN = Number(key.slice(cut + 1));
  return cut > 0 && Number.isSafeInteger(attemptN) ? { requestId: key.slice(0, cut), attemptN } : null;
};

export function clusterBridge(deps: ClusterBridgeDeps): ClusterBridge {
  const { node, registry, settlements, log } = deps;
  const me = node.nodeId;

  /** The link to another node's session, made on first use and forgotten when its node dies. */
  function linkTo(view: SharedProviderView): RemoteSession {
    let link = registry.remoteSessions.get(view.sessionId);
    if (link) return link;
    const made: RemoteSession = {
      remote: true,
      sessionId: view.sessionId,
      nodeId: view.nodeId,
      providerId: view.providerId,
      publicKey: new Uint8Array(Buffer.from(view.publicKey, "base64")),
      attempts: new Set(),
      send(frame, jobKey) {
        if (jobKey !== undefined) node.send(view.nodeId, { t: "job", from: me, session: view.sessionId, key: jobKey }, frame);
        else node.send(view.nodeId, { t: "to_session", from: me, session: view.sessionId, key: "" }, frame);
      },
      release(key) {
        node.send(view.nodeId, { t: "release", from: me, key });
        if (made.attempts.size === 0 && !node.remoteView(view.sessionId)) registry.remoteSessions.delete(view.sessionId);
      },
    };
    link = made;
    registry.remoteSessions.set(view.sessionId, link);
    return link;
  }

  /**
   * A remote session as a routing candidate: its slots as its node last told, minus those other nodes
   * hold there, minus this node's own in flight now (counted here at once, not when the holder says).
   */
  function candidate(view: SharedProviderView): ProviderView {
    const mine = registry.remoteSessions.get(view.sessionId)?.attempts.size ?? 0;
    const others = view.inFlight - (view.inFlightByNode[me] ?? 0);
    const free = Math.max(0, view.capacity - others - mine);
    const inFlight = others + mine;
    const routable = view.state === "ready" || view.state === "busy";
    return {
      sessionId: view.sessionId,
      providerId: view.providerId,
      tier: view.tier,
      state: routable ? (free > 0 ? "ready" : "busy") : view.state,
      warmModels: view.warmModels,
      freeSlots: free,
      inFlight,
    };
  }

  const remote: RemoteProviders = {
    *views(model, expectedHash) {
      for (const view of node.remoteViews()) {
        // A provider id connected here too (a reconnect racing its old session's expiry) is routed here.
        if (registry.admittedByProvider.has(view.providerId)) continue;
        if (!view.models.some((m) => m.model_id === model && (expectedHash === null || m.model_hash === expectedHash))) continue;
        yield candidate(view);
      }
    },
    *all() {
      for (const view of node.remoteViews()) if (!registry.admittedByProvider.has(view.providerId)) yield candidate(view);
    },
    session(sessionId) {
      const view = node.remoteView(sessionId);
      return view ? linkTo(view) : registry.remoteSessions.get(sessionId);
    },
  };

  /** This node's sessions as other nodes see them. */
  function localViews(): SharedProviderView[] {
    const views: SharedProviderView[] = [];
    for (const view of registry.providerViews()) {
      const session = registry.sessions.get(view.sessionId);
      if (!session) continue;
      const c = session.actor.getSnapshot().context;
      const byNode: Record<string, number> = {};
      for (const key of session.attempts) {
        const owner = registry.forwarded.get(key)?.ownerNode ?? me;
        byNode[owner] = (byNode[owner] ?? 0) + 1;
      }
      views.push({
        ...view,
        warmModels: [...view.warmModels],
        nodeId: me,
        capacity: freeSlots(c, 0),
        inFlightByNode: byNode,
        models: c.models.filter((m) => !session.refusedModels.has(m.model_id)).map((m) => ({ model_id: m.model_id, model_hash: m.model_hash })),
        publicKey: Buffer.from(c.hello!.receipt_public_key).toString("base64"),
      });
    }
    return views;
  }

  /** A frame the provider sent about one of this node's attempts on another node's session. */
  function frameFromRemote(header: Extract<NodeMessage, { t: "frame" }>, raw: Uint8Array): void {
    const decoded = decodeProviderFrame(raw);
    if (!decoded.ok) return;
    const frame = decoded.frame;
    if (frame.type === "receipt") {
      settlements.receiptArrived(header.provider, frame.request_id, frame.attempt_n, frame.receipt);
      return;
    }
    if (frame.type === "hello" || frame.type === "auth" || frame.type === "heartbeat") return;
    const link = registry.remoteSessions.get(header.session);
    if (!link) {
      // The attempt was already let go here: only its `end` still matters, for its receipt.
      if (frame.type === "end") settlements.endReceived(header.provider, frame);
      return;
    }
    attemptFrame({ registry, settlements }, header.provider, link, frame);
  }

  /** One of this node's attempts cannot go on over there: it fails like a lost socket. */
  function lose(key: string): void {
    const attempt = registry.attempts.get(key);
    if (!attempt || !isRemote(attempt.session)) return;
    registry.releaseAttempt(key);
    attempt.request.send({ type: "provider.lost" });
  }

  function message(header: NodeMessage, frame: Uint8Array | null): void {
    switch (header.t) {
      case "job": {
        const session = registry.sessions.get(header.session);
        const snapshot = session?.actor.getSnapshot();
        const admitted = snapshot?.matches({ admitted: "ready" }) || snapshot?.matches({ admitted: "busy" });
        if (!session || !admitted || !frame || freeSlots(snapshot!.context, session.attempts.size) === 0) {
          node.send(header.from, { t: "lost", from: me, key: header.key });
          return;
        }
        registry.addForwarded({ key: header.key, ownerNode: header.from, session, released: false, at: Date.now() });
        session.send(frame);
        return;
      }
      case "to_session":
        if (frame) registry.sessions.get(header.session)?.send(frame);
        return;
      case "to_provider":
        if (frame) registry.admittedByProvider.get(header.provider)?.send(frame);
        return;
      case "release":
        registry.releaseForwarded(header.key);
        return;
      case "frame":
        if (frame) frameFromRemote(header, frame);
        return;
      case "lost":
        lose(header.key);
        return;
    }
  }

  /** A frame the provider sent on this node's session about an attempt that a dead node owned. */
  function adoptLocally(providerId: string, frame: ProviderFrame): void {
    if (frame.type !== "end" && frame.type !== "receipt") return;
    // Every frame of the attempt waits for the one adoption, so they are handled in arrival order.
    void settlements
      .adopt(frame.request_id, frame.attempt_n)
      .then(() => {
        if (frame.type === "end") settlements.endReceived(providerId, frame);
        else settlements.receiptArrived(providerId, frame.request_id, frame.attempt_n, frame.receipt);
      })
      .catch((error) => log.warn("cluster_adoption_failed", { request_id: frame.request_id, attempt_n: frame.attempt_n, error: String(error) }));
  }

  const endpoint: EndpointCluster = {
    noticeStall: () => void node.noticeStall(),
    forwardedFrame(session, providerId, frame, raw) {
      if (!("request_id" in frame)) return false;
      const key = attemptKey(frame.request_id, frame.attempt_n);
      const forwarded = registry.forwarded.get(key);
      if (!forwarded || forwarded.session !== session) return false;
      if (frame.type === "end" || frame.type === "declined") registry.releaseForwarded(key, frame.type === "end");
      if (node.knownDead(forwarded.ownerNode)) {
        adoptLocally(providerId, frame);
        return true;
      }
      node.send(forwarded.ownerNode, { t: "frame", from: me, session: session.sessionId, provider: providerId }, raw);
      return true;
    },
    receipt(providerId, frame, raw) {
      const key = attemptKey(frame.request_id, frame.attempt_n);
      if (settlements.isOpen(frame.request_id, frame.attempt_n)) return false;
      const forwarded = registry.forwarded.get(key);
      const send = (owner: string) => node.send(owner, { t: "frame", from: me, session: "", provider: providerId }, raw);
      if (forwarded && !node.knownDead(forwarded.ownerNode)) {
        send(forwarded.ownerNode);
        return true;
      }
      // Whose is it? The owner recorded itself in Redis; a dead or unknown owner's attempt is judged here.
      void (async () => {
        const owner = await node.ownerOf(key);
        if (owner && owner !== me && (await node.alive(owner))) return send(owner);
        adoptLocally(providerId, frame);
      })().catch((error) => log.error("cluster_receipt_failed", { error: String(error) }));
      return true;
    },
    sessionLost(session) {
      for (const [key, forwarded] of registry.forwarded) {
        if (forwarded.session !== session) continue;
        registry.forwarded.delete(key);
        if (!forwarded.released) node.send(forwarded.ownerNode, { t: "lost", from: me, key });
      }
    },
    sessionChanged(session, gone) {
      node.sessionChanged(session.sessionId, gone);
    },
  };

  function nodeDied(nodeId: string, takeOver: boolean): void {
    // Its sessions' links first: a request lost below may fail over to another session there (a live
    // node whose link broke), on a link made anew that must stay.
    for (const [id, link] of [...registry.remoteSessions]) if (link.nodeId === nodeId) registry.remoteSessions.delete(id);
    // This node's requests streaming from there: lost, as a dropped socket is (in-band error mid-stream).
    for (const [key, attempt] of [...registry.attempts]) {
      if (isRemote(attempt.session) && attempt.session.nodeId === nodeId) lose(key);
    }
    // Its jobs running here: nobody reads them any more. Cancelled; their receipts are judged here.
    for (const [key, forwarded] of registry.forwarded) {
      if (forwarded.ownerNode !== nodeId || forwarded.released) continue;
      const parsed = parseKey(key);
      if (parsed) {
        forwarded.session.send(
          encodeFrame({ type: "cancel", request_id: parsed.requestId, attempt_n: parsed.attemptN, reason: "buyer_cancel", delivered_output_bytes: 0 }),
        );
      }
      registry.releaseForwarded(key);
    }
    if (takeOver) void node.takeOwned(nodeId).then((owned) => resolveOwned(nodeId, owned));
  }

  /**
   * A link with a live node broke: the work shared with it is let go of as for a death, without a
   * take-over. Its jobs cancelled here are also reported `lost` to it: the two ends may notice a
   * silent link a moment apart, and an attempt it started in between (its frames sent into the
   * silent link) would otherwise wait on there for frames that never come.
   */
  function linkLost(nodeId: string): void {
    const cancelled = [...registry.forwarded].filter(([, f]) => f.ownerNode === nodeId && !f.released).map(([key]) => key);
    nodeDied(nodeId, false);
    for (const key of cancelled) node.send(nodeId, { t: "lost", from: me, key });
  }

  /** Resolves a dead process's settlements and reservations (`owned`: what it left), as a restart resolves its own. */
  async function resolveOwned(nodeId: string, owned: string[]): Promise<void> {
    if (owned.length === 0) return;
    // Its writers first (docs/scale-out.md, "Fencing"): an opening or a reservation it sent that
    // lands after this is refused, and one in flight is committed, so the reads below see all it wrote.
    const writers = owned.filter((member) => member.startsWith("w:"));
    for (const member of writers) await settlements.writerReaped(member.slice(2));
    let resumed = 0;
    let interrupted = 0;
    const requests = new Set<string>();
    for (const member of owned) {
      if (member.startsWith("w:")) continue;
      if (member.startsWith("r:")) {
        requests.add(member.slice(2));
        continue;
      }
      const parsed = parseKey(member);
      if (!parsed) continue;
      requests.add(parsed.requestId);
      if (await settlements.adopt(parsed.requestId, parsed.attemptN).catch(() => false)) resumed++;
      else interrupted++;
    }
    for (const requestId of requests) deps.requestEnded(requestId);
    log.info("cluster_node_reaped", { node_id: nodeId, writers: writers.length, resumed, interrupted, requests: requests.size });
  }

  /** After Redis lost its data: what the store holds unresolved and no live node owns is resolved here. */
  async function sweepOrphans(liveOwned: () => Promise<Set<string> | null>): Promise<void> {
    // No owned set names a writer that died with Redis's data: every registered writer but the live
    // nodes' is marked first (docs/scale-out.md, "Fencing"), so the store read below holds all it wrote.
    const before = await liveOwned();
    if (before === null) return;
    const live = [...before].filter((member) => member.startsWith("w:")).map((member) => member.slice(2));
    const marked = await settlements.writersReapedExcept(live);
    if (marked > 0) log.info("cluster_writers_reaped", { writers: marked, live: live.length });
    const unresolved = await deps.unresolved();
    const owned = await liveOwned();
    if (owned === null) return;
    const orphans = [...unresolved.attempts.filter((key) => !owned.has(key)), ...unresolved.requests.filter((id) => !owned.has(`r:${id}`)).map((id) => `r:${id}`)];
    await resolveOwned("(owned sets lost with Redis's data)", orphans);
  }

  return {
    handlers: { message, nodeDied, linkLost, changed: deps.changed, localViews, fenced: deps.fenced, sweepOrphans },
    resolvePredecessor: async () => resolveOwned(me, await node.predecessorOwned()),
    endpoint,
    remote,
    sendToProvider(providerId, frame) {
      const local = registry.admittedByProvider.get(providerId);
      if (local) return local.send(frame);
      const holder = node.nodeOfProvider(providerId);
      if (holder) node.send(holder, { t: "to_provider", from: me, provider: providerId }, frame);
    },
  };
}
