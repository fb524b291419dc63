// Composition root of `gateway serve`: store, actors, provider endpoint and buyer API on one Bun server.
import { randomBytes } from "node:crypto";
import { join } from "node:path";
import { createActor, type InspectionEvent } from "xstate";
import { gatewayMachine } from "../actors/gateway.ts";
import type { GatewayConfig } from "./config/index.ts";
import { admitProvider } from "./gateway/admission.ts";
import { providerWebSocketHandler, type SocketData } from "./gateway/providerEndpoint.ts";
import { Registry } from "./gateway/registry.ts";
import { createRequestRunner } from "./gateway/requests.ts";
import { createHttpApp } from "./http/app.ts";
import { errorResponse, gatewayError } from "./http/errors.ts";
import { createLog, type Log } from "./log.ts";
import { openStore, type Store } from "./store/index.ts";

export const PROVIDER_CONNECT_PATH = "/v1/provider/connect";

export interface GatewayPorts {
  now?: () => number;
  randomBytes?: (n: number) => Uint8Array;
  log?: Log;
  inspect?: (event: InspectionEvent) => void;
}

export interface RunningGateway {
  url: string;
  port: number;
  store: Store;
  registry: Registry;
  /** Stops taking requests, tells providers to drain, resolves when idle or the grace period ends. */
  drain(): Promise<void>;
  stop(): Promise<void>;
}

const hexId = (prefix: string, random: (n: number) => Uint8Array) => () => prefix + Buffer.from(random(12)).toString("hex");

export function databasePath(dataDir: string): string {
  return join(dataDir, "gateway.db");
}

export function startGateway(config: GatewayConfig, ports: GatewayPorts = {}): RunningGateway {
  const now = ports.now ?? Date.now;
  const random = ports.randomBytes ?? ((n: number) => new Uint8Array(randomBytes(n)));
  const log = ports.log ?? createLog(config.logLevel);
  const store = openStore(databasePath(config.dataDir), { keyPrefix: config.keyPrefix, now });
  const gatewaySecret = store.getOrCreateSecret("gateway_hmac", 32);
  const registry = new Registry();

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
    { inspect: ports.inspect },
  ).start();
  const accepting = () => supervisor.getSnapshot().matches("running");

  const runner = createRequestRunner({
    registry,
    now,
    maxAttempts: config.maxAttempts,
    firstByteTimeoutMs: config.firstByteTimeoutMs,
    streamIdleTimeoutMs: config.streamIdleTimeoutMs,
    requestDeadlineMs: config.requestDeadlineMs,
    inspect: ports.inspect,
    onClosed: () => supervisor.send({ type: "request.closed" }),
    log,
  });

  const newRequestId = hexId("req_", random);
  const handleHttp = createHttpApp({
    store,
    runner: {
      ...runner,
      start: (spec) => {
        supervisor.send({ type: "request.opened" });
        return runner.start(spec);
      },
    },
    maxBodyBytes: config.maxBodyBytes,
    requestTokenCap: config.requestTokenCap,
    settlementMode: config.settlementMode,
    gatewaySecret,
    accepting,
    now,
    providerViews: () => [...registry.providerViews()],
    newRequestId,
    log,
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
    catalogId: () => "",
    onAdmitted: () => supervisor.send({ type: "session.admitted" }),
    onClosed: (_session, wasAdmitted) => {
      if (wasAdmitted) supervisor.send({ type: "session.closed" });
    },
    inspect: ports.inspect,
    log,
  });

  const server = Bun.serve<SocketData>({
    port: config.port,
    hostname: config.host,
    // Routes stop reading at maxBodyBytes and answer with the error envelope; this is only the
    // backstop for bodies no route reads (Bun's own 413 carries no envelope).
    maxRequestBodySize: 1024 * 1024 * 1024,
    // Streams may wait long for a cold provider's first token (no keep-alive bytes before it).
    idleTimeout: 0,
    fetch(request, srv) {
      if (new URL(request.url).pathname === PROVIDER_CONNECT_PATH) {
        if (srv.upgrade(request, { data: {} })) return undefined;
        return errorResponse(gatewayError("invalid_request", "Expected a WebSocket upgrade."), newRequestId());
      }
      return handleHttp(request);
    },
    websocket,
    error(error) {
      log.error("http_server_error", { error: String(error) });
      return errorResponse(gatewayError("internal_error", "The gateway hit an internal error. Retry the request."), newRequestId());
    },
  });

  const port = server.port!;
  log.info("gateway_listening", { host: config.host, port, settlement_mode: config.settlementMode });

  return {
    url: `http://${config.host}:${port}`,
    port,
    store,
    registry,
    async drain() {
      supervisor.send({ type: "gateway.drain" });
      await stoppedPromise;
    },
    async stop() {
      server.stop(true);
      for (const session of registry.sessions.values()) session.close(1001, "gateway_stopping");
      supervisor.stop();
      store.close();
    },
  };
}
