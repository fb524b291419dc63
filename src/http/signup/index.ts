// Public face of sign-up, demo sessions and the client-IP edge, as the composition root
// (src/compositionRoot.ts) wires them: settings checked once at start, routes for the HTTP app, and the binder
// that gives each request its client IP before routing.
import type { GatewayConfig } from "../../config/index.ts";
import type { Log } from "../../log.ts";
import type { AsyncStore as Store } from "../../store/asyncStore.ts";
import { createBuyerEdge } from "../auth.ts";
import { parseTrustedProxies } from "../clientIp.ts";
import type { DemoRouteDeps } from "../demo/routes.ts";
import { createIdpRegistry, parseOidcProviders } from "./idps.ts";
import type { SignupDeps } from "./routes.ts";

export { signupRoutes, type SignupDeps } from "./routes.ts";
export { parseOidcProviders, createIdpRegistry, type IdentityProvider, type IdpRegistry } from "./idps.ts";

export type SignupOptions = Omit<SignupDeps, "requestId">;
export type DemoOptions = Omit<DemoRouteDeps, "requestId">;

export interface BuyerSurface {
  signup: SignupOptions;
  demo: DemoOptions;
  /** Call with every HTTP request and its socket peer address before routing. */
  bind(request: Request, socketAddress: string | null): void;
  /** Tells the surface the bound port (the default public base URL needs it). */
  listening(port: number): void;
}

/** Parses a public base URL setting: http(s), no path, query or fragment; returned without a trailing slash. */
export function parsePublicBaseUrl(text: string): { ok: true; url: string } | { ok: false; message: string } {
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    return { ok: false, message: "publicBaseUrl: not a URL" };
  }
  if ((url.protocol !== "https:" && url.protocol !== "http:") || url.pathname !== "/" || url.search || url.hash || url.username) {
    return { ok: false, message: "publicBaseUrl: expected scheme://host[:port] with no path, e.g. https://gateway.example.com" };
  }
  return { ok: true, url: url.origin };
}

/** Checks the settings and builds the surface; throws with an operator-readable message on a bad setting. */
export function createBuyerSurface(input: {
  config: GatewayConfig;
  store: Store;
  gatewaySecret: Uint8Array;
  now: () => number;
  randomBytes: (n: number) => Uint8Array;
  log: Log;
}): BuyerSurface {
  const { config } = input;
  const trusted = parseTrustedProxies(config.trustedProxies);
  if (!trusted.ok) throw new Error(trusted.message);
  const idps = parseOidcProviders(config.oidcProviders);
  if (!idps.ok) throw new Error(idps.message);
  let publicBaseUrl = "";
  if (config.publicBaseUrl !== undefined) {
    const parsed = parsePublicBaseUrl(config.publicBaseUrl);
    if (!parsed.ok) throw new Error(parsed.message);
    publicBaseUrl = parsed.url;
  }
  const bind = createBuyerEdge({ gatewaySecret: input.gatewaySecret, now: input.now, trustedProxies: trusted.proxies });
  return {
    signup: {
      store: input.store,
      idps: createIdpRegistry(idps.providers),
      publicBaseUrl: () => publicBaseUrl,
      gatewaySecret: input.gatewaySecret,
      now: input.now,
      randomBytes: input.randomBytes,
      log: input.log,
    },
    demo: { store: input.store, gatewaySecret: input.gatewaySecret, now: input.now, sessionsPerHour: config.demoSessionsPerHour, signupEnabled: idps.providers.length > 0 },
    bind,
    listening(port) {
      if (publicBaseUrl !== "") return;
      const host = config.host === "0.0.0.0" || config.host === "::" ? "127.0.0.1" : config.host;
      publicBaseUrl = `http://${host.includes(":") ? `[${host}]` : host}:${port}`;
      if (idps.providers.length > 0) {
        input.log.warn("public_base_url_defaulted", { public_base_url: publicBaseUrl, hint: "set publicBaseUrl to the URL browsers use" });
      }
    },
  };
}
