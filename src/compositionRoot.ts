// Composition root of `gateway serve`: store, actors, provider endpoint and buyer API on one Bun server.
import { randomBytes } from "node:crypto";
import { join } from "node:path";
import { createActor, type InspectionEvent } from "xstate";
import type { Serve, Server } from "bun";
import { gatewayMachine } from "../actors/gateway.ts";
import type { GatewayConfig } from "./config/index.ts";
import { admitProvider } from "./gateway/admission.ts";
import { providerWebSocketHandler, type SocketData } from "./gateway/providerEndpoint.ts";
import { watchStalls } from "./gateway/stallWatch.ts";
import { createRoutingState, routingSettingsFrom, type RoutingState } from "./gateway/routingState.ts";
import { createMemoryStickyMap } from "./store/sticky.ts";
import { Registry } from "./gateway/registry.ts";
import { createRequestRunner } from "./gateway/requests.ts";
import { createHttpApp } from "./http/app.ts";
import { admissionGate } from "./http/admissionGate.ts";
import { createReplayCache } from "./http/idempotency.ts";
import { quotaPolicy } from "./http/quotas.ts";
import { createBuyerSurface } from "./http/signup/index.ts";
import { errorResponse, errorTable, gatewayError } from "./http/errors.ts";
import { createLog, type Log } from "./log.ts";
import { createPrometheusMetrics, type PrometheusMetrics } from "./metrics.ts";
import { openStore, type StoreOptions } from "./store/index.ts";
import { asyncStore, type AsyncStore } from "./store/asyncStore.ts";
import { openPostgresStore } from "./store/postgres/index.ts";
import { looseModes } from "./store/dataDir.ts";
import { pollCatalog, startCatalog, type CatalogLive, type CatalogModel } from "./catalog/index.ts";
import { buildRateCard, RateRowConfig } from "./ledger/index.ts";
import { createSettlements, type Settlements } from "./gateway/settlements.ts";
import { workerJudge, type ReceiptJudge } from "./receipts/judge.ts";
import { hexId, timeOrderedId } from "./gateway/ids.ts";
import { openReplayFile } from "./store/replays.ts";
import { REPLAY_WINDOW_MS } from "./http/idempotency.ts";
import { ClusterNode } from "./cluster/node.ts";
import type { ClusterRedis } from "./cluster/redis.ts";
import { sharedSlots } from "./cluster/slots.ts";
import { redisStickyMap } from "./cluster/sticky.ts";
import { redisReplays } from "./cluster/replays.ts";
import { clusterBridge, type SharedProviderView } from "./gateway/clusterBridge.ts";
import type { ChangeMessage } from "./cluster/messages.ts";
import { CloseCode } from "./wire/frames.ts";
import { CONSOLE_PATH, createConsole, teeMetrics } from "./console/index.ts";

export const PROVIDER_CONNECT_PATH = "/v1/provider/connect";

export interface GatewayPorts {
  now?: () => number;
  randomBytes?: (n: number) => Uint8Array;
  log?: Log;
  inspect?: (event: InspectionEvent) => void;
  /** High-resolution clock (ms) for latency metrics; default performance.now. */
  monotonicNow?: () => number;
  /** Models added to (or updated in) the signed catalog at start, e.g. the demo's. */
  catalogModels?: readonly CatalogModel[];
  /** Every timer of the gateway (actors' delays, end-of-turn commits, polls); default the real ones. */
  timers?: GatewayTimers;
  /** Where receipts are judged; default a worker thread (src/receipts/judge.ts). */
  judge?: ReceiptJudge;
  /** The listening socket: HTTP and provider WebSockets; default Bun.serve. */
  serve?: (options: Serve.Options<SocketData>) => Pick<Server<SocketData>, "port" | "stop">;
  /** How the store schedules and makes its group commits durable (the simulation's, test/sim/). */
  storeHooks?: Pick<StoreOptions, "endOfTurn" | "lazyCommitTimer" | "syncWal" | "commitFails" | "onCommitFailed">;
  /** A connected Redis (src/cluster/redis.ts): this gateway runs as a cluster node (docs/scale-out.md). */
  redis?: ClusterRedis;
}

/**
 * The gateway's timers as one port, so a simulation (test/sim/) drives them all from its own clock.
 * `setImmediate`: runs at the end of the current event-loop turn.
 */
export interface GatewayTimers {
  setTimeout(run: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
  setInterval(run: () => void, ms: number): unknown;
  clearInterval(handle: unknown): void;
  setImmediate(run: () => void): void;
}

export interface RunningGateway {
  url: string;
  port: number;
  /** The durable store: PostgreSQL on a cluster node (databaseUrl), else the SQLite file of dataDir. */
  store: AsyncStore;
  registry: Registry;
  /** Routing's live state: cooldowns, what it learned, the admission queue (docs/routing.md). */
  routing: RoutingState;
  /** The signed catalog in force (reloaded on change). */
  catalog: CatalogLive;
  settlements: Settlements;
  /** This gateway's own metrics (its own prom-client Registry). */
  metrics: PrometheusMetrics;
  /** Buyer requests whose actor is still running. */
  liveRequests: () => number;
  /** Results the retry-replay copy holds in memory now, in flight ones included (diagnostics and tests). */
  replayEntries: () => number;
  /** The cluster node, when this gateway is one; `ready` resolves once it joined. */
  cluster: { node: ClusterNode<SharedProviderView>; ready: Promise<void>; announce(change: ChangeMessage): Promise<boolean> } | null;
  /** The HTTP routes mounted (method, path, hidden from the API reference or not). */
  httpRoutes: () => { method: string; path: string; hidden: boolean }[];
  /** Stops taking requests, tells providers to drain, resolves when idle or the grace period ends. */
  drain(): Promise<void>;
  stop(): Promise<void>;
}

/** After the drain: longest wait for open HTTP responses to finish writing before they are cut. */
const DRAIN_FLUSH_MS = 1000;

/** The `rateCard` setting: a JSON array of rows (validated by buildRateCard). */
function parseRateCardSetting(text: string | undefined): { ok: true; rows: RateRowConfig[] } | { ok: false; message: string } {
  if (text === undefined || text.trim() === "") return { ok: true, rows: [] };
  try {
    const rows: unknown = JSON.parse(text);
    return Array.isArray(rows) ? { ok: true, rows: rows as RateRowConfig[] } : { ok: false, message: "must be a JSON array of rows" };
  } catch {
    return { ok: false, message: "is not valid JSON" };
  }
}

export function databasePath(dataDir: string): string {
  return join(dataDir, "gateway.db");
}

export async function startGateway(config: GatewayConfig, ports: GatewayPorts = {}): Promise<RunningGateway> {
  const now = ports.now ?? Date.now;
  const random = ports.randomBytes ?? ((n: number) => new Uint8Array(randomBytes(n)));
  const log = ports.log ?? createLog(config.logLevel);
  for (const loose of looseModes(config.dataDir)) {
    log.warn("data_dir_mode_loose", { ...loose, hint: `chmod ${loose.expected.slice(1)} ${loose.path}` });
  }
  // A failed group COMMIT (disk error) stops the process: its writes are lost while memory acted on
  // them; the restart recovers from what is durable (docs/decisions.md, "Fail-stop on a failed commit").
  const failStop = () => {
    log.error("store_commit_failed", { action: "exit" });
    process.exit(70);
  };
  // A cluster node's durable state is PostgreSQL; the embedded node's, the SQLite file, with group
  // commit: the request path's ledger writes share one durable commit per event-loop turn.
  // A cluster node's process is one incarnation of its node id, and its store connections say so: the
  // store then refuses its writes of attempts another node adopted (docs/scale-out.md, "Fencing").
  const incarnation = ports.redis ? crypto.randomUUID() : undefined;
  const store: AsyncStore =
    config.databaseUrl !== undefined
      ? await openPostgresStore(config.databaseUrl, {
          keyPrefix: config.keyPrefix,
          now,
          writer: incarnation,
          // Each call is retried alone and answered, so nothing is lost; a failing batch is still news.
          onBatchFailed: (what, size, error) => log.warn("store_batch_failed", { what, size, error: String(error), action: "retried_one_by_one" }),
        })
      : asyncStore(
          openStore(databasePath(config.dataDir), { keyPrefix: config.keyPrefix, now, randomBytes: random, groupCommit: true, onCommitFailed: failStop, ...ports.storeHooks }),
        );
  const gatewaySecret = await store.getOrCreateSecret("gateway_hmac", 32);
  const catalogStart = await startCatalog({ dataDir: config.dataDir, store, now, random, models: ports.catalogModels });
  if (!catalogStart.ok) {
    await store.close();
    throw new Error(`catalog: ${catalogStart.message}`);
  }
  const catalog = catalogStart.live;
  const rateCardRows = parseRateCardSetting(config.rateCard);
  const builtCard = rateCardRows.ok ? buildRateCard({ rows: rateCardRows.rows }) : rateCardRows;
  if (!builtCard.ok) {
    await store.close();
    throw new Error(`rateCard: ${builtCard.message}`);
  }
  const rateCard = builtCard.card;
  const buyerSurface = createBuyerSurface({ config, store, gatewaySecret, now, randomBytes: random, log });
  const timers = ports.timers;
  const registry = new Registry(timers?.setImmediate);
  const routing = createRoutingState(routingSettingsFrom(config), { now, log, ...(timers ? { timers, defer: timers.setImmediate } : {}) });
  registry.capacityChanged = () => routing.queue.wake();
  const redis = ports.redis;
  // Sticky pins are shared by a cluster's nodes (in Redis); the embedded node keeps them in memory.
  const sticky = !config.stickyRouting
    ? undefined
    : redis
      ? redisStickyMap(redis, { idleTtlMs: config.stickyTtlMs })
      : createMemoryStickyMap({ idleTtlMs: config.stickyTtlMs });
  const node = redis
    ? new ClusterNode<SharedProviderView>({
        nodeId: config.nodeId ?? hexId("node_", random)(),
        redis,
        leaseMs: config.clusterLeaseMs,
        log,
        now,
        link: config.clusterLinkHost === "off" ? null : { host: config.clusterLinkHost, port: config.clusterLinkPort, announce: config.clusterLinkAnnounce },
        incarnation,
      })
    : null;
  // Retry results outlive the process: in Redis for a cluster, else in a SQLite file beside the store.
  const replayFile = node ? null : openReplayFile(join(config.dataDir, "replays.db"), { now, windowMs: REPLAY_WINDOW_MS });
  const replayBackend = node
    ? redisReplays(node.redis, {
        nodeId: node.nodeId,
        incarnation: node.incarnation,
        windowMs: REPLAY_WINDOW_MS,
        inFlightMs: config.requestDeadlineMs,
        nodeAlive: (id, incarnation) => node.alive(id, incarnation),
      })
    : replayFile!;
  // A request is recorded as this node's with its slot, before its reservation is written: a node killed
  // in between leaves a survivor the request to resolve (docs/scale-out.md, "Leases and failure").
  const slots = node
    ? sharedSlots(node.redis, config.clusterLeaseMs, { key: node.ownedKey, writerMember: node.writerMember, owned: (id) => node.ownedRequest(id) })
    : null;
  const replays = createReplayCache({ now, backend: replayBackend, maxEntries: config.replayCacheEntries });

  let stopped: () => void = () => {};
  const stoppedPromise = new Promise<void>((r) => (stopped = r));
  const supervisor = createActor(
    gatewayMachine.provide({
      actions: {
        drainProviders: () => {
          for (const session of registry.admittedByProvider.values()) session.actor.send({ type: "gateway.drain" });
        },
        stopServing: () => stopped(),
      },
      delays: { drainGrace: config.drainGraceMs },
    }),
    { inspect: ports.inspect, ...(timers ? { clock: timers } : {}) },
  ).start();
  const accepting = () => supervisor.getSnapshot().matches("running");
  const monotonicNow = ports.monotonicNow ?? (() => performance.now());
  // Live streams first: new requests' admission work, a bounded number a turn (docs/architecture.md).
  const admission = admissionGate({
    perTurn: config.admissionsPerTurn,
    maxWaitMs: config.admissionQueueMs,
    now: monotonicNow,
    nextTurn: timers ? timers.setImmediate : (turn) => void setImmediate(turn),
  });
  const prometheus = createPrometheusMetrics({
    providerViews: () => registry.providerViews(),
    handshakingSessions: () => registry.sessions.size - registry.admittedByProvider.size,
    ignoredFrames: () => registry.ignoredFrames,
    routing: () => routing.metrics(),
    ignoredReceipts: () => registry.ignoredReceipts,
    liveRequests: () => runner.liveRequests(),
    draining: () => supervisor.getSnapshot().matches("draining"),
    engines: node ? () => ({ redis: node.redis.up }) : undefined,
    storeUp: () => store.health().up,
    waitingRetries: () => replays.waitingRetries(),
    admissionGate: () => ({ waiting: admission.waiting, ...admission.counts }),
  });

  const settlements = createSettlements({
    store,
    now,
    mode: config.settlementMode,
    pendingDeadlineMs: config.pendingDeadlineMs,
    gatewaySecret,
    catalog: () => catalog.current(),
    rateCard: () => rateCard,
    sendToProvider: (providerId, frame) => {
      if (bridge) bridge.sendToProvider(providerId, frame);
      else registry.admittedByProvider.get(providerId)?.send(frame);
    },
    log,
    inspect: ports.inspect,
    onSettled: (label, providerId) => {
      metrics.settlementLabelled(label);
      routing.settled(providerId, label);
    },
    onIgnoredReceipt: (why) => registry.ignoredReceipts[why]++,
    // With no request in flight a lone receipt is judged on the main thread (src/receipts/judge.ts).
    judge: ports.judge ?? workerJudge((error) => log.warn("receipt_judge_thread_failed", { error }), undefined, () => runner.liveRequests() === 0),
    clock: timers,
    ownership: node
      ? { opened: (key, ttlMs) => node.own(key, false, ttlMs), settled: (key) => node.own(key, true), requestEnded: (id) => node.own(`r:${id}`, true) }
      : undefined,
    adoptedElsewhere: node ? () => node.adoptedElsewhere() : undefined,
  });
  // The operator console (/console) sees what the metrics see: the prometheus port, teed.
  const operatorConsole = await createConsole({
    consoleToken: config.consoleToken,
    store,
    registry,
    supervisor,
    runner: () => runner,
    settlements,
    log,
    now,
  });
  const metrics = teeMetrics(prometheus, operatorConsole.live);
  /** Another node (or the operator CLI) announced a change: every node applies it within a second. */
  const applyChange = (change: ChangeMessage) => {
    log.info("cluster_change", { kind: change.kind });
    switch (change.kind) {
      case "catalog_signed":
        catalog.reload();
        return;
      case "provider_banned":
        registry.admittedByProvider.get(change.provider_id)?.close(CloseCode.banned, "banned");
        return;
      default:
        // Key and tier changes: the store's cached key lookups are dropped (a store of another engine
        // may cache them; SQLite's cache also sees other processes' commits by itself).
        store.forgetCachedKeys?.();
        return;
    }
  };
  const bridge = node
    ? clusterBridge({
        node,
        registry,
        settlements,
        log,
        requestEnded: (id) => settlements.requestEnded(id),
        changed: applyChange,
        // Called only once the node runs (a lease later at the earliest), after the runner below exists.
        fenced: () => runner.fence(),
        unresolved: async () => ({
          attempts: (await store.listSettlements({ label: "pending" })).map((row) => `${row.request_id}#${row.attempt_n}`),
          requests: await store.unendedHeldReservations(),
        }),
      })
    : null;
  let clusterReady: Promise<void> = Promise.resolve();
  if (node && bridge) {
    registry.sessionChanged = (sessionId) => node.sessionChanged(sessionId);
    // A cluster node resumes only what it owns: the others' pending settlements are theirs, and a dead
    // node's are resolved by the survivor that notices its death (clusterBridge.ts, reap). The first
    // node of a cold cluster (no other member alive) resumes everything, as a single node would —
    // unless Redis itself was empty, where no member proves nothing: then a lease later, by the sweep.
    clusterReady = node.start(bridge.handlers).then(async () => {
      const others = await node.redis.call<number>("EVAL", [
        "local n = 0 for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do if id ~= ARGV[1] and redis.call('EXISTS', 'gw:node:' .. id) == 1 then n = n + 1 end end return n",
        1,
        "gw:nodes",
        node.nodeId,
      ]);
      if (others.ok && others.value === 0 && node.joinedEmptyRedis) {
        // Redis was empty: live nodes may not have re-announced themselves yet (docs/scale-out.md, "When
        // Redis loses its data"). What nobody owns is resolved a lease later, as after a data loss.
        log.info("cluster_cold_start_deferred", { node_id: node.nodeId, lease_ms: node.leaseMs });
        node.sweepLater();
      } else if (others.ok && others.value === 0) {
        const resumed = await settlements.resumePending();
        if (resumed.resumed + resumed.interrupted > 0) log.info("settlements_resumed", resumed);
      } else {
        // Restarted under its id while the others live (its lease may not have lapsed, so none of them
        // took over): what its previous process owned is this one's to resolve.
        await bridge.resolvePredecessor();
      }
      log.info("cluster_joined", { node_id: node.nodeId });
    });
  } else {
    const resumed = await settlements.resumePending();
    if (resumed.resumed + resumed.interrupted > 0) log.info("settlements_resumed", resumed);
  }
  const stopCatalogPoll = pollCatalog(
    catalog,
    (result) => log.info("catalog_reloaded", { ok: result.ok, catalog_id: catalog.current()?.catalog_id ?? null }),
    { timers },
  );

  const runner = createRequestRunner({
    registry,
    now,
    maxAttempts: config.maxAttempts,
    firstByteTimeoutMs: config.firstByteTimeoutMs,
    streamIdleTimeoutMs: config.streamIdleTimeoutMs,
    requestDeadlineMs: config.requestDeadlineMs,
    inspect: ports.inspect,
    actorClock: timers,
    onClosed: () => {
      if (!accepting()) supervisor.send({ type: "request.closed" });
    },
    log,
    metrics,
    monotonicNow,
    settlements,
    remote: bridge?.remote,
    fenced: node ? () => node.noticeStall() : undefined,
    failureStatus: (code) => errorTable[code].status,
    routing,
    sticky,
  });

  const newRequestId = timeOrderedId("req_", now, random);
  const handleHttp = createHttpApp({
    store,
    runner: {
      ...runner,
      start: (spec) => {
        // While running, the supervisor is not told (the drain brings the live count); once it left
        // `running`, each request is counted so the drain waits for it too.
        if (!accepting()) supervisor.send({ type: "request.opened" });
        return runner.start(spec);
      },
    },
    maxBodyBytes: config.maxBodyBytes,
    requestBodyTimeoutMs: config.requestBodyTimeoutMs,
    stream: { maxBufferedBytes: config.streamBufferBytes, stallMs: config.streamStallMs },
    admission,
    requestTokenCap: config.requestTokenCap,
    sticky: sticky ? { map: sticky, secret: gatewaySecret } : undefined,
    routingStatus: () => ({ queued: routing.queue.depth, cooldowns: routing.cooldownList() }),
    settlementMode: config.settlementMode,
    accepting,
    now,
    // A cluster node lists every node's providers (models, status): any of them may serve its buyers.
    providerViews: () => (bridge ? [...registry.providerViews(), ...bridge.remote.all()] : [...registry.providerViews()]),
    newRequestId,
    log,
    signup: buyerSurface.signup,
    demo: buyerSurface.demo,
    metrics,
    exposition: metrics,
    metricsToken: config.metricsToken,
    monotonicNow,
    messagesFacade: config.messagesFacade,
    responsesFacade: config.responsesFacade,
    catalog,
    rateCard: () => rateCard,
    settlements,
    quotas: quotaPolicy(config),
    replays,
    sharedSlots: slots ?? undefined,
    engines: node ? () => ({ redis: node.redis.up }) : undefined,
    feedbackPerHour: config.feedbackPerHour,
    excludedEntrypoints: (config.excludedEntrypoints ?? "")
      .split(",")
      .map((e) => e.trim())
      .filter(Boolean),
  });

  // A stall of this process (SIGSTOP, a paused VM) is not its providers' silence: a heartbeat window
  // it spent standing still starts again (docs/protocol.md, "Gateway side").
  const stalls = watchStalls({
    thresholdMs: config.heartbeatIntervalMs,
    monotonic: monotonicNow,
    ...(timers ? { timers } : {}),
    stalled: (ms) => log.warn("gateway_stalled", { stalled_ms: ms }),
  });
  const websocket = providerWebSocketHandler({
    registry,
    admit: (input) =>
      admitProvider(
        {
          store,
          now,
          provisionalAdmissionsPerHour: config.provisionalAdmissionsPerHour,
          provisionalMaxSessions: config.provisionalMaxSessions,
          provisionalSessionCount: () => registry.provisionalSessionCount(),
        },
        input,
      ),
    newSessionId: hexId("sess_", random),
    randomBytes: random,
    heartbeatIntervalMs: config.heartbeatIntervalMs,
    handshakeTimeoutMs: config.handshakeTimeoutMs,
    catalogId: () => catalog.current()?.catalog_id ?? "",
    settlements,
    now,
    receiptFrames: { perSecond: config.receiptFramesPerSecond, burst: config.receiptFrameBurst },
    maxChunkBytesPerToken: config.maxChunkBytesPerToken,
    onAdmitted: () => supervisor.send({ type: "session.admitted" }),
    onClosed: (_session, wasAdmitted) => {
      if (wasAdmitted) supervisor.send({ type: "session.closed" });
    },
    inspect: ports.inspect,
    log,
    clock: timers,
    stoodStill: (withinMs) => stalls.stoodStillWithin(withinMs),
    cluster: bridge?.endpoint,
  });

  const serve = ports.serve ?? ((options: Serve.Options<SocketData>) => Bun.serve<SocketData>(options));
  const server = serve({
    port: config.port,
    hostname: config.host,
    // Routes stop reading at maxBodyBytes and answer with the error envelope; this is only the
    // backstop for bodies no route reads (Bun's own 413 carries no envelope).
    maxRequestBodySize: 1024 * 1024 * 1024,
    // Streams may wait long for a cold provider's first token (no keep-alive bytes before it).
    idleTimeout: 0,
    fetch(request, srv) {
      const pathname = new URL(request.url).pathname;
      if (pathname === CONSOLE_PATH || pathname.startsWith(`${CONSOLE_PATH}/`)) return operatorConsole.handle(request).then((r) => r ?? handleHttp(request));
      if (pathname === PROVIDER_CONNECT_PATH) {
        if (srv.upgrade(request, { data: {} })) return undefined;
        return errorResponse(gatewayError("invalid_request", "Expected a WebSocket upgrade."), newRequestId());
      }
      buyerSurface.bind(request, srv.requestIP(request)?.address ?? null);
      return handleHttp(request);
    },
    websocket,
    error(error) {
      log.error("http_server_error", { error: String(error) });
      return errorResponse(gatewayError("internal_error", "The gateway hit an internal error. Retry the request."), newRequestId());
    },
  });

  const port = server.port!;
  buyerSurface.listening(port);
  log.info("gateway_listening", { host: config.host, port, settlement_mode: config.settlementMode });

  return {
    url: `http://${config.host}:${port}`,
    port,
    store,
    registry,
    routing,
    catalog,
    settlements,
    metrics,
    liveRequests: () => runner.liveRequests(),
    replayEntries: () => replays.size(),
    cluster: node ? { node, ready: clusterReady, announce: (change) => node.announce(change) } : null,
    httpRoutes: handleHttp.routes,
    async drain() {
      supervisor.send({ type: "gateway.drain", liveRequests: runner.liveRequests() });
      await stoppedPromise;
      // Stop listening, then give finished responses a moment to reach buyers before stop() cuts
      // connections: a stream's last bytes ([DONE]) are queued, not yet written, when its actor ends.
      // Provider sockets close first, so a stream still running past the grace period ends with the
      // in-band provider_disconnected error instead of a bare cut.
      const closed = server.stop(false);
      for (const session of registry.sessions.values()) session.close(1001, "gateway_stopping");
      await Promise.race([closed, Bun.sleep(DRAIN_FLUSH_MS)]);
    },
    async stop() {
      server.stop(true);
      for (const session of registry.sessions.values()) session.close(1001, "gateway_stopping");
      supervisor.stop();
      stalls.stop();
      stopCatalogPoll();
      settlements.stop();
      slots?.stop();
      if (node) {
        await node.stop();
        node.redis.close();
      }
      // The store first: closing it commits its open group, and what waited for that commit (a
      // stream's end, which keeps its answer for retries) still writes to the replay file.
      await store.close();
      replayFile?.close();
    },
  };
}
