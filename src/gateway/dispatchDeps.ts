// What one attempt's dispatch works with (its dependencies) and the sessions it may route to — apart
// from dispatch.ts, so that the hedge's module (hedgedAttempt.ts), which dispatch.ts calls, can use
// them too without an import cycle.
import type { Log } from "../log.ts";
import type { MetricsPort } from "../metrics.ts";
import type { ChunkFrame } from "../wire/frames.ts";
import type { ChunkMeter } from "./chunkMeter.ts";
import { isRemote, type Registry, type RemoteSession, type SessionHandle } from "./registry.ts";
import type { RequestHandle } from "./requestHandle.ts";
import type { ProviderView } from "./routing.ts";
import type { RoutingState } from "./routingState.ts";
import type { Settlements } from "./settlements.ts";

export interface DispatchDeps {
  registry: Registry;
  settlements: Settlements;
  now: () => number;
  requestDeadlineMs: number;
  log: Log;
  metrics: MetricsPort;
  clock: () => number;
  /** The handler of a live attempt's chunks. */
  chunkSink: (handle: RequestHandle, meter: ChunkMeter) => (frame: ChunkFrame) => void;
  /** What routing learned, the admission queue and its counters (docs/routing.md); absent = plain choice, no waiting. */
  routing?: RoutingState;
  /** A cluster node's view of the other nodes' providers (src/gateway/clusterBridge.ts). */
  remote?: RemoteProviders;
}

/** Other nodes' provider sessions, routed to like local ones (docs/scale-out.md). */
export interface RemoteProviders {
  /** Views of remote sessions that may serve `model` (advertising `expectedHash` when not null). */
  views(model: string, expectedHash: string | null): Iterable<ProviderView>;
  /** Every remote session's view (status, models list, metrics). */
  all(): Iterable<ProviderView>;
  /** The link to a remote session by id, while its node is alive. */
  session(sessionId: string): RemoteSession | undefined;
}

/**
 * Sessions that may serve `model`: when the catalog knows the model, only those advertising its
 * hash and not caught measuring another one on this session (docs/catalog.md).
 */
export function routableViews(deps: DispatchDeps, model: string): Iterable<ProviderView> {
  const { registry } = deps;
  const views = registry.providerViews();
  const expected = deps.settlements.expectedHash(model);
  const local =
    expected === null
      ? views
      : [...views].filter((view) => {
          const session = registry.sessions.get(view.sessionId);
          if (!session || session.refusedModels.has(model)) return false;
          return session.actor.getSnapshot().context.models.some((m) => m.model_id === model && m.model_hash === expected);
        });
  // A cluster node's candidates include every other node's sessions: the provider need not be local.
  return deps.remote ? [...local, ...deps.remote.views(model, expected)] : local;
}

/** The receipt key of a local or another node's session. */
export const publicKeyOf = (session: SessionHandle | RemoteSession): Uint8Array =>
  isRemote(session) ? session.publicKey : session.actor.getSnapshot().context.hello!.receipt_public_key;

