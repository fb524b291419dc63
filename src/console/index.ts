// The operator console's wiring (docs/console.md): its token, its view of the live gateway and its
// actions, from the parts the composition root already has. Nothing runs until a console connects.
import type { AnyActorRef } from "xstate";
import type { Registry } from "../gateway/registry.ts";
import type { RequestRunner } from "../gateway/requests.ts";
import type { Settlements } from "../gateway/settlements.ts";
import type { Log } from "../log.ts";
import type { AsyncStore as Store } from "../store/asyncStore.ts";
import { consoleActions } from "./actions.ts";
import { createConsoleAuth, operatorToken } from "./auth.ts";
import { createConsoleLive } from "./live.ts";
import { createConsoleHandler } from "./routes.ts";

export { CONSOLE_PATH } from "./routes.ts";
export { teeMetrics } from "./live.ts";

/** The name of the operator token in the store's secrets (when no `consoleToken` is configured). */
export const CONSOLE_TOKEN_SECRET = "console_token";

export interface ConsoleParts {
  consoleToken: string | undefined;
  store: Store;
  registry: Registry;
  supervisor: AnyActorRef;
  /** Late-bound: the runner is built after the metrics the console tees. */
  runner: () => Pick<RequestRunner, "actors">;
  settlements: Settlements;
  log: Log;
  now: () => number;
}

export async function createConsole(parts: ConsoleParts) {
  const { store, registry } = parts;
  const token = await operatorToken(parts.consoleToken, () => store.getOrCreateSecret(CONSOLE_TOKEN_SECRET, 32));
  const live = createConsoleLive({
    supervisor: () => parts.supervisor,
    *sessions() {
      for (const s of registry.sessions.values()) yield { sessionId: s.sessionId, actor: s.actor, inFlight: s.attempts.size };
    },
    requests: () => parts.runner().actors(),
    settlements: () => parts.settlements.actors(),
    bindings: () => store.listProviders(),
    ledgerBalances: () => store.ledgerBalances(),
    now: parts.now,
  });
  const actions = consoleActions({
    banProvider: (id) => store.banProvider(id),
    unbanProvider: (id) => store.unbanProvider(id),
    getProviderBinding: (id) => store.getProviderBinding(id),
    pinProvider: (id, key) => store.pinProvider(id, key),
    revokeApiKey: (id) => store.revokeApiKey(id),
    session: (id) => registry.admittedByProvider.get(id),
  });
  const handle = createConsoleHandler({ auth: createConsoleAuth(token, parts.now), live, actions, log: parts.log });
  return { handle, live };
}
