// One gateway node's place in a cluster (docs/scale-out.md): its membership lease, the provider
// registry it shares and the one it mirrors, its links to the other nodes (links.ts) with its pub/sub
// inbox behind them, the change channel, and noticing nodes that died. Everything here is held by
// leases in Redis: a node killed with -9 stops refreshing them and its share of the cluster's state
// expires within one lease.
import type { Log } from "../log.ts";
import { decodeMessage, encodeMessage, type ChangeMessage, type NodeMessage, type RegistryMessage, type SharedSessionView } from "./messages.ts";
import type { ClusterRedis } from "./redis.ts";
import { CHANGES_CHANNEL } from "./announce.ts";
import { NodeLinks, type LinkAddress } from "./links.ts";

export interface ClusterNodeOptions {
  nodeId: string;
  redis: ClusterRedis;
  /** How long a dead node's leases (membership, slots, registry entries) outlive it. */
  leaseMs: number;
  log: Log;
  now?: () => number;
  /** Monotonic ms for the lease's timing (default performance.now). */
  monotonic?: () => number;
  /** Where this node's link server listens (links.ts); null: every message goes over pub/sub. */
  link?: { host: string; port: number; announce?: string } | null;
  /** This process's incarnation (default a new random one): also its store connections' writer (fencing). */
  incarnation?: string;
}

export interface ClusterHandlers<V extends SharedSessionView> {
  /** A message from another node to this one, with the provider frame it carries. */
  message(header: NodeMessage, frame: Uint8Array | null): void;
  /**
   * A node's process died: its membership lease expired (`takeOver`: then try to take over what it
   * owned, `takeOwned`), or it came back under its own id before the lease lapsed (a new incarnation,
   * which resolves what its predecessor owned itself: nothing to take over).
   */
  nodeDied(nodeId: string, takeOver: boolean): void;
  /**
   * A link to or from a live node broke: what it carried when it broke is lost (docs/scale-out.md,
   * "Node links"), so the work shared with that node is let go of as for a death, without taking over
   * anything — the node lives and resolves what it owns.
   */
  linkLost(nodeId: string): void;
  /** Something changed that every node must apply (key revoked, provider banned, …). */
  changed(change: ChangeMessage): void;
  /** This node's own provider sessions, as the other nodes route to them. */
  localViews(): V[];
  /** This node is fenced (its lease could not be renewed in time): every request in flight must end now; the count ended. */
  fenced(): number;
  /**
   * Redis lost its data (restarted empty) and this node won the sweep: resolve what the store holds
   * unresolved that no live node owns (`liveOwned` reads the live nodes' owned sets and writers; call it
   * after reading the store, since a node records what it owns before writing it).
   */
  sweepOrphans(liveOwned: () => Promise<Set<string> | null>): Promise<void>;
}

const memberKey = (nodeId: string) => `gw:node:${nodeId}`;
/**
 * A node whose membership was last renewed longer ago than this share of a lease fences itself. The
 * membership key lives 70 % of a lease from its renewal, and only once it is gone do the others take the
 * node for dead, take over what it owned and stop counting on its slots (which live a whole lease): so
 * the node's requests have ended before anyone acts on its death (docs/scale-out.md, "Fencing").
 */
const FENCE_AFTER = 0.5;
/** A value Redis keeps for as long as its data lives: a different one (or none) after a reconnect means it lost everything. */
const EPOCH = "gw:epoch";
const registryKey = (nodeId: string) => `gw:registry:${nodeId}`;
const NODES = "gw:nodes";
// Channels are named through ClusterRedis.channel: pub/sub is shared by every database of a server.
const inbox = (nodeId: string) => `node:${nodeId}:inbox`;
const REGISTRY_CHANNEL = "registry";

// Returns the members of gw:nodes whose membership key is gone.
const DEAD_NODES = `
local dead = {}
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if redis.call('EXISTS', 'gw:node:' .. id) == 0 then table.insert(dead, id) end
end
return dead`;

// What the live members (gw:nodes with their membership key) own, together, and each one's writer
// (`w:` + the incarnation its membership key holds).
const LIVE_OWNED = `
local owned = {}
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local incarnation = redis.call('GET', 'gw:node:' .. id)
  if incarnation then
    table.insert(owned, 'w:' .. incarnation)
    for _, m in ipairs(redis.call('SMEMBERS', 'gw:owned:' .. id)) do table.insert(owned, m) end
  end
end
return owned`;

// Takes (reads and deletes) a node's set of owned attempts. Given its membership key (KEYS[2]), only
// while that is gone: a node that starts sets its membership before it owns anything (one connection,
// in order), so what this returns was never its new process's. Without it (a starting node taking
// what its predecessor under its id left), unconditionally.
const TAKE_OWNED = `
if KEYS[2] and redis.call('EXISTS', KEYS[2]) == 1 then return {} end
local owned = redis.call('SMEMBERS', KEYS[1])
redis.call('DEL', KEYS[1])
return owned`;

export class ClusterNode<V extends SharedSessionView = SharedSessionView> {
  readonly nodeId: string;
  readonly redis: ClusterRedis;
  readonly leaseMs: number;
  /** This process's incarnation of `nodeId`: a node restarted under its id gets a new one. */
  readonly incarnation: string;
  private readonly log: Log;
  private readonly now: () => number;
  private readonly monotonic: () => number;
  private handlers: ClusterHandlers<V> | null = null;
  /** Other nodes' sessions: node → (session id → view), with when the node's last broadcast expires and the incarnation that sent it. */
  private readonly mirror = new Map<string, { expiresAt: number; incarnation: string | undefined; heard: number; views: Map<string, V> }>();
  /** Registry messages applied so far: an entry's `heard` is this count when its node was last heard from. */
  private heard = 0;
  private predecessor: Promise<string[]> = Promise.resolve([]);
  private readonly timers: ReturnType<typeof setInterval>[] = [];
  private readonly dead = new Set<string>();
  private changedSessions = new Set<string>();
  private goneSessions = new Set<string>();
  private publishScheduled = false;
  private stopped = false;
  private readonly linkListen: { host: string; port: number } | null;
  private links: NodeLinks | null = null;
  private linkAddress: LinkAddress | undefined;
  /** When (monotonic ms) the last renewal that Redis acknowledged was sent: the lease holds 70 % of a lease from then at least. */
  private leaseSentAt = 0;
  private isFenced = false;
  private joinedFreshData = false;
  /** The Redis data this node last saw (EPOCH), and what it owns there (gw:owned:<id>), kept here to be written again after a loss. */
  private epoch: string | null = null;
  private readonly owned = new Set<string>();
  /** When each owned attempt's `gw:att:<key>` record expires (this node's clock), to write it again after a loss. */
  private readonly ownerRecords = new Map<string, number>();

  constructor(options: ClusterNodeOptions) {
    this.nodeId = options.nodeId;
    this.redis = options.redis;
    this.leaseMs = options.leaseMs;
    this.log = options.log;
    this.now = options.now ?? Date.now;
    this.monotonic = options.monotonic ?? (() => performance.now());
    this.linkListen = options.link ?? null;
    this.incarnation = options.incarnation ?? crypto.randomUUID();
  }

  /** Joins: subscribes, takes the membership lease, reads every live node's registry. */
  async start(handlers: ClusterHandlers<V>): Promise<void> {
    this.handlers = handlers;
    this.leaseSentAt = this.monotonic();
    const r = this.redis;
    // First, in this order on the connection: what a previous process under this id left unsettled
    // becomes this one's to resolve (`predecessorOwned`), then the membership lease.
    this.predecessor = r.call<string[]>("EVAL", [TAKE_OWNED, 1, this.ownedKey]).then((result) => (result.ok ? result.value : []));
    if (this.linkListen) {
      const links = new NodeLinks({
        nodeId: this.nodeId,
        ...this.linkListen,
        log: this.log,
        deliver: (header, frame) => {
          this.noticeStall();
          handlers.message(header, frame);
        },
        lost: (peer) => {
          if (this.stopped || this.dead.has(peer)) return;
          this.log.warn("cluster_link_lost", { peer });
          this.safely("link_lost_failed", () => handlers.linkLost(peer));
        },
        sendOpenedMarker: (peer, link) => r.fire("PUBLISH", [r.channel(inbox(peer)), encodeMessage({ t: "linked", from: this.nodeId, link })]),
        sendDroppedMarker: (peer, links) => r.fire("PUBLISH", [r.channel(inbox(peer)), encodeMessage({ t: "unlinked", from: this.nodeId, links })]),
        // A live peer answers within a lease: one whose event loop stalls past half of one fences itself.
        silenceMs: this.leaseMs,
      });
      try {
        this.linkAddress = links.listen();
        this.links = links;
      } catch (error) {
        // Without a link server the other nodes reach this one over pub/sub, as before links.
        this.log.warn("cluster_link_listen_failed", { error: String(error) });
        links.close();
      }
    }
    this.refreshLease();
    // Then its writer (after the membership: a reaper's take never gets this process's).
    r.fire("SADD", [this.ownedKey, this.writerMember]);
    await r.subscribe(r.channel(inbox(this.nodeId)), (text) => {
      const decoded = decodeMessage(text);
      if (!decoded) return;
      if (decoded.header.t === "linked") return this.links?.markerArrived(decoded.header.link);
      if (decoded.header.t === "unlinked") return this.links?.droppedByPeer(decoded.header.from, decoded.header.links);
      this.noticeStall();
      this.safely("cluster_message_failed", () => handlers.message(decoded.header, decoded.frame));
    });
    await r.subscribe(r.channel(REGISTRY_CHANNEL), (text) => this.safely("registry_message_failed", () => this.applyRegistry(JSON.parse(text) as RegistryMessage<V>)));
    await r.subscribe(r.channel(CHANGES_CHANNEL), (text) => this.safely("change_message_failed", () => handlers.changed(JSON.parse(text) as ChangeMessage)));
    await this.loadRegistries();
    await this.checkEpoch();
    // Membership lives for 70 % of a lease and is checked every tenth: a dead node is noticed within
    // 80 % of a lease of its last refresh, so the work it held is cancelled within the lease.
    this.every(Math.max(20, Math.floor(this.leaseMs / 5)), () => this.refreshLease());
    this.every(Math.max(20, Math.floor(this.leaseMs / 10)), () => void this.findDeadNodes());
    this.every(Math.max(20, Math.floor(this.leaseMs / 20)), () => this.checkFence());
    // Back after a Redis outage: the lease and registry again at once, and the registries missed.
    r.onChange((up) => {
      if (!up || this.stopped) return;
      this.refreshLease();
      void this.loadRegistries();
      void this.checkEpoch();
    });
  }

  /** Sends a message (with a provider frame) to another node: over its link when open, else its Redis inbox. */
  send(nodeId: string, header: NodeMessage, frame?: Uint8Array): void {
    if (this.links?.send(nodeId, header, frame)) return;
    this.redis.fire("PUBLISH", [this.redis.channel(inbox(nodeId)), encodeMessage(header, frame)]);
  }

  /** Announces a change to every node (this one included: it hears its own publish). */
  async announce(change: ChangeMessage): Promise<boolean> {
    return (await this.redis.call("PUBLISH", [this.redis.channel(CHANGES_CHANNEL), JSON.stringify(change)])).ok;
  }

  /** The other nodes' provider sessions (live nodes only). */
  *remoteViews(): Generator<V> {
    const now = this.now();
    for (const [nodeId, entry] of this.mirror) {
      if (entry.expiresAt <= now || this.dead.has(nodeId)) continue;
      yield* entry.views.values();
    }
  }

  remoteView(sessionId: string): V | undefined {
    for (const entry of this.mirror.values()) {
      const view = entry.views.get(sessionId);
      if (view) return view;
    }
    return undefined;
  }

  /** The node holding a session of this provider id now, if any other does. */
  nodeOfProvider(providerId: string): string | undefined {
    for (const view of this.remoteViews()) if (view.providerId === providerId) return view.nodeId;
    return undefined;
  }

  /** Whether a node holds its membership lease (asks Redis; false when Redis cannot say). */
  /** Whether `nodeId` holds its membership lease — and, given `incarnation`, holds it as that process. */
  async alive(nodeId: string, incarnation?: string): Promise<boolean> {
    if (nodeId === this.nodeId) return incarnation === undefined || incarnation === this.incarnation;
    if (this.dead.has(nodeId)) return false;
    const result = await this.redis.call<string | null>("GET", [memberKey(nodeId)]);
    return result.ok && result.value !== null && (incarnation === undefined || result.value === incarnation);
  }

  /**
   * Whether this node is fenced: its membership lease was not renewed for half a lease (Redis unreachable
   * from here), so the other nodes may soon take it for dead. Its requests end and new ones are refused
   * until a renewal is acknowledged again.
   */
  get fenced(): boolean {
    return this.isFenced;
  }

  /**
   * Whether Redis held no data when this node joined (it set `gw:epoch` itself): a new cluster, or a
   * Redis restarted empty, where live nodes may not have re-announced themselves yet — an empty member
   * set then proves nothing.
   */
  get joinedEmptyRedis(): boolean {
    return this.joinedFreshData;
  }

  /** Whether this node already knows `nodeId` died (no Redis round trip). */
  knownDead(nodeId: string): boolean {
    return this.dead.has(nodeId);
  }

  /** A local session changed (slots, state, models) or went: other nodes hear it at the end of this turn. */
  sessionChanged(sessionId: string, gone = false): void {
    if (gone) {
      this.goneSessions.add(sessionId);
      this.changedSessions.delete(sessionId);
    } else this.changedSessions.add(sessionId);
    if (this.publishScheduled) return;
    this.publishScheduled = true;
    setImmediate(() => this.publishChanges());
  }

  async stop(): Promise<void> {
    this.stopped = true;
    for (const t of this.timers) clearInterval(t);
    this.links?.close();
    // A clean stop gives its leases back at once instead of letting them expire.
    await this.redis.call("DEL", [memberKey(this.nodeId), registryKey(this.nodeId)]);
    await this.redis.call("PUBLISH", [this.redis.channel(REGISTRY_CHANNEL), JSON.stringify({ node: this.nodeId, full: true, views: [], gone: [] } satisfies RegistryMessage)]);
  }

  private every(ms: number, run: () => void): void {
    const t = setInterval(() => {
      if (!this.stopped) run();
    }, ms);
    t.unref?.();
    this.timers.push(t);
  }

  private safely(event: string, run: () => void): void {
    try {
      run();
    } catch (error) {
      this.log.error(event, { error: String(error) });
    }
  }

  private refreshLease(): void {
    const views = this.handlers!.localViews();
    const full: RegistryMessage<V> = { node: this.nodeId, incarnation: this.incarnation, full: true, views, gone: [], ...(this.linkAddress ? { link: this.linkAddress } : {}) };
    const text = JSON.stringify(full);
    const r = this.redis;
    // The lease names the process holding it (alive(): a claim of an earlier process is not its).
    const sentAt = this.monotonic();
    void r.call("SET", [memberKey(this.nodeId), this.incarnation, "PX", Math.max(1, Math.floor(this.leaseMs * 0.7))]).then((result) => {
      if (result.ok) this.leaseRenewed(sentAt);
    });
    r.fire("SADD", [NODES, this.nodeId]);
    r.fire("SET", [registryKey(this.nodeId), text, "PX", this.leaseMs]);
    r.fire("PUBLISH", [r.channel(REGISTRY_CHANNEL), text]);
  }

  private leaseRenewed(sentAt: number): void {
    if (sentAt > this.leaseSentAt) this.leaseSentAt = sentAt;
    if (!this.isFenced || this.stopped) return;
    this.isFenced = false;
    this.log.info("cluster_node_unfenced", { node_id: this.nodeId });
  }

  /**
   * The store refused a write: another node adopted an attempt of this one, having taken it for dead.
   * A stall this node has not noticed yet (its timers have not run since) fences it now; otherwise it
   * fenced itself already when it woke, and the refused write was about work it let go then.
   */
  adoptedElsewhere(): void {
    this.noticeStall();
  }

  /**
   * Checks this node's own lease before it acts on what just arrived, and returns whether it is fenced.
   * After a stall (a stopped process, a long pause) the sockets may be read before the fence timer runs,
   * and frames of attempts a survivor already resolved must not reach their buyers (docs/scale-out.md,
   * "Fencing"). One clock read.
   */
  noticeStall(): boolean {
    if (!this.stopped) this.checkFence();
    return this.isFenced;
  }

  private checkFence(): void {
    if (this.isFenced || this.monotonic() - this.leaseSentAt <= this.leaseMs * FENCE_AFTER) return;
    this.isFenced = true;
    const ended = this.handlers!.fenced();
    // Links its peers dropped while this process stood still: what it sends next goes over pub/sub.
    this.links?.dropStale();
    this.log.warn("cluster_node_fenced", { node_id: this.nodeId, lease_renewed_ms_ago: Math.round(this.monotonic() - this.leaseSentAt), requests_ended: ended });
  }

  /**
   * Whether Redis still holds the data this node saw: after a restart without persistence it holds
   * nothing, and with it went every node's owned set — a node that died around then would leave its
   * attempts pending and its reservations held for good. Each live node writes its owned set again,
   * and a lease later (every live node has looked by then) one of them resolves what nobody owns.
   */
  private async checkEpoch(): Promise<void> {
    const r = this.redis;
    const created = await r.call<string | null>("SET", [EPOCH, crypto.randomUUID(), "NX"]);
    const current = await r.call<string | null>("GET", [EPOCH]);
    if (!current.ok || current.value === null) return;
    const seen = this.epoch;
    if (seen === null) this.joinedFreshData = created.ok && created.value === "OK";
    this.epoch = current.value;
    if (seen === null || seen === current.value || this.stopped) return;
    this.log.warn("redis_data_lost", { node_id: this.nodeId, owned: this.owned.size });
    r.fire("SADD", [this.ownedKey, this.writerMember, ...this.owned]);
    // And who owns each attempt: a receipt reaching another node finds its owner, instead of that node
    // adopting a live attempt as an orphan.
    const now = Date.now();
    for (const [key, expiresAt] of this.ownerRecords) if (expiresAt > now) r.fire("SET", [`gw:att:${key}`, this.nodeId, "PX", expiresAt - now]);
    this.sweepLater();
  }

  /**
   * In a lease (every live node has re-announced itself and written its owned set again by then), one
   * node resolves what the store holds unresolved and no live node owns.
   */
  sweepLater(): void {
    const epoch = this.epoch;
    if (epoch !== null) setTimeout(() => void this.sweep(epoch), this.leaseMs).unref?.();
  }

  private async sweep(epoch: string): Promise<void> {
    if (this.stopped || this.epoch !== epoch) return;
    const won = await this.redis.call("SET", [`gw:swept:${epoch}`, this.nodeId, "NX", "PX", this.leaseMs * 6]);
    if (!won.ok || won.value !== "OK") return;
    await this.handlers!.sweepOrphans(async () => {
      const result = await this.redis.call<string[]>("EVAL", [LIVE_OWNED, 1, NODES]);
      return result.ok ? new Set(result.value) : null;
    }).catch((error) => this.log.error("cluster_sweep_failed", { error: String(error) }));
  }

  private publishChanges(): void {
    this.publishScheduled = false;
    if (this.changedSessions.size === 0 && this.goneSessions.size === 0) return;
    const changed = this.changedSessions;
    const views = this.handlers!.localViews().filter((v) => changed.has(v.sessionId));
    const message: RegistryMessage<V> = { node: this.nodeId, incarnation: this.incarnation, full: false, views, gone: [...this.goneSessions] };
    this.changedSessions = new Set();
    this.goneSessions = new Set();
    this.redis.fire("PUBLISH", [this.redis.channel(REGISTRY_CHANNEL), JSON.stringify(message)]);
  }

  private applyRegistry(message: RegistryMessage<V>): void {
    if (message.node === this.nodeId) return;
    let entry = this.mirror.get(message.node);
    if (entry?.incarnation !== undefined && message.incarnation !== undefined && entry.incarnation !== message.incarnation) {
      // The node was restarted under its id before its membership lapsed: its previous process is
      // gone, with its sessions and jobs. Let go of them as for a death; the new process resolves
      // what the old one owned (predecessorOwned).
      this.mirror.delete(message.node);
      entry = undefined;
      this.links?.forget(message.node);
      this.log.warn("cluster_node_restarted", { node_id: message.node });
      this.safely("node_death_failed", () => this.handlers!.nodeDied(message.node, false));
    }
    if (!entry || message.full) {
      entry = { expiresAt: 0, incarnation: message.incarnation, heard: 0, views: new Map() };
      this.mirror.set(message.node, entry);
    }
    entry.heard = ++this.heard;
    if (message.full) {
      // A full broadcast without a link address: the node left, or reaches us over pub/sub only.
      if (message.link) this.links?.connect(message.node, message.link);
      else this.links?.forget(message.node);
      entry.expiresAt = this.now() + this.leaseMs;
      // A node heard from is alive again (it came back, or Redis did).
      this.dead.delete(message.node);
    }
    for (const view of message.views) entry.views.set(view.sessionId, view);
    for (const id of message.gone) entry.views.delete(id);
  }

  private async loadRegistries(): Promise<void> {
    const keys = await this.redis.call<string[]>("KEYS", ["gw:registry:*"]);
    if (!keys.ok || keys.value.length === 0) return;
    const values = await this.redis.call<(string | null)[]>("MGET", keys.value);
    if (!values.ok) return;
    for (const text of values.value) if (text) this.applyRegistry(JSON.parse(text) as RegistryMessage<V>);
  }

  private async findDeadNodes(): Promise<void> {
    const asked = this.heard;
    const result = await this.redis.call<string[]>("EVAL", [DEAD_NODES, 1, NODES]);
    if (!result.ok) return;
    for (const nodeId of result.value) {
      // Heard from since the script ran (its answer and the node's broadcasts come on different
      // connections): it is back, restarted under its id; the verdict is stale.
      if ((this.mirror.get(nodeId)?.heard ?? 0) > asked) continue;
      if (nodeId === this.nodeId) {
        // Our own lease lapsed (Redis was unreachable for longer than it): take it again.
        this.refreshLease();
        continue;
      }
      if (this.dead.has(nodeId)) continue;
      this.dead.add(nodeId);
      this.mirror.delete(nodeId);
      this.links?.forget(nodeId);
      // Every survivor lets go of its work with it and tries to take over what it owned (takeOwned:
      // one of them gets it). One removes it from the member set.
      const won = await this.redis.call("SET", [`gw:reaped:${nodeId}`, this.nodeId, "NX", "PX", this.leaseMs * 6]);
      const reaper = won.ok && won.value === "OK";
      this.log.warn("cluster_node_died", { node_id: nodeId, reaper });
      this.safely("node_death_failed", () => this.handlers!.nodeDied(nodeId, true));
      // Every node must see it dead first (they look every tenth of a lease), so it leaves the member
      // set only a few leases later.
      if (reaper) setTimeout(() => this.redis.fire("SREM", [NODES, nodeId]), this.leaseMs * 3).unref?.();
    }
  }

  /**
   * Records that this node owns an attempt (key `request#n`) or a request (`r:` + id) until it is
   * settled or ended (`done`): for the reaper, and for a node that gets an attempt's receipt without
   * knowing whose it is (`ownerOf`). `ttlMs` bounds how long an attempt's owner is looked up.
   */
  own(member: string, done: boolean, ttlMs = 0): void {
    if (done) this.owned.delete(member);
    else this.owned.add(member);
    this.redis.fire(done ? "SREM" : "SADD", done ? [this.ownedKey, member] : [this.ownedKey, member, this.writerMember]);
    if (member.startsWith("r:")) return;
    if (done) {
      this.ownerRecords.delete(member);
      this.redis.fire("DEL", [`gw:att:${member}`]);
    } else {
      const ttl = Math.max(1, ttlMs);
      this.ownerRecords.set(member, Date.now() + ttl);
      this.redis.fire("SET", [`gw:att:${member}`, this.nodeId, "PX", ttl]);
    }
  }

  /** A request this node recorded in its owned set itself (with its slot, src/cluster/slots.ts). */
  ownedRequest(requestId: string): void {
    this.owned.add(`r:${requestId}`);
  }

  /** This node's set of what it owns (attempt keys and `r:` request ids): what a survivor takes over. */
  get ownedKey(): string {
    return `gw:owned:${this.nodeId}`;
  }

  /**
   * The member of the owned set that names this process's store writer (`w:` + incarnation), added with
   * every other member: whoever takes the set marks the writer reaped before resolving the rest, so a
   * write of this process held in the network cannot land after (docs/scale-out.md, "Fencing").
   */
  get writerMember(): string {
    return `w:${this.incarnation}`;
  }

  /** The node that owns an attempt, when one is recorded. */
  async ownerOf(key: string): Promise<string | null> {
    const result = await this.redis.call<string | null>("GET", [`gw:att:${key}`]);
    return result.ok ? result.value : null;
  }

  /**
   * What a dead node owned (attempt keys, `r:` request ids and `w:` writers), taken: the first caller gets it, later
   * ones nothing; nothing either once the node is a member again (it then resolves it itself).
   */
  async takeOwned(nodeId: string): Promise<string[]> {
    const result = await this.redis.call<string[]>("EVAL", [TAKE_OWNED, 2, `gw:owned:${nodeId}`, memberKey(nodeId)]);
    return result.ok ? result.value : [];
  }

  /** What the previous process under this node's id owned and left unsettled (taken at start). */
  predecessorOwned(): Promise<string[]> {
    return this.predecessor;
  }
}
