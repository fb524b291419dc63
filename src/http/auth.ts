// Buyer credentials: `Authorization: Bearer <API key | demo token>`. Unknown bearers are answered by
// their kind (demo tokens start with `demo_`, docs/buyer-api.md). A request is authenticated as a principal:
// an API key's account, or a browser demo session whose account id is `demo:` + the client's IP key
// (its /32 or /64, docs/receipts.md) — the id quotas, account_scope and per-IP limits key on.
//
// What the socket layer knows (the client IP) and the per-gateway demo-token key reach this module
// through a per-request context bound once at the edge (`createBuyerEdge`, called from the Bun fetch
// handler), so every route authenticates with `authenticateBuyer(store, request, policy)` alone.
import { gatewayError, type GatewayError } from "./errors.ts";
import { ipKey, resolveClientIp, type TrustedProxies } from "./clientIp.ts";
import { DEMO_TOKEN_PREFIX, demoTokenKey, verifyDemoToken } from "./demo/token.ts";
import type { AccountTier } from "../store/index.ts";
import type { AsyncStore as Store } from "../store/asyncStore.ts";

export interface ApiKeyPrincipal {
  kind: "api_key";
  account_id: string;
  key_id: string;
  tier: AccountTier;
}

export interface DemoPrincipal {
  kind: "demo";
  /** `demo:` + ip_key, e.g. `demo:203.0.113.7/32`: the demo quota's and account_scope's account id. */
  account_id: string;
  /** The client's /32 (IPv4) or /64 (IPv6): per-IP demo limits count against this. */
  ip_key: string;
  session_id: string;
  expires_at_ms: number;
}

export type BuyerPrincipal = ApiKeyPrincipal | DemoPrincipal;

export type AuthResult = { ok: true; principal: BuyerPrincipal } | { ok: false; error: GatewayError };

/** Which credentials an endpoint takes: docs/buyer-api.md lets demo tokens into chat, responses, models, feedback. */
export type DemoPolicy = "demo_allowed" | "api_key_only";

/** What the edge knows about one request. */
export interface BuyerRequestContext {
  /** The client's address (socket peer, or per trusted-proxy X-Forwarded-For); null when unknown. */
  clientIp: string | null;
  /** This gateway's demo-token MAC key; null where demo tokens are not verified (e.g. bare unit apps). */
  demoKey: Uint8Array | null;
  now: () => number;
}

const contexts = new WeakMap<Request, BuyerRequestContext>();

export function bindBuyerContext(request: Request, context: BuyerRequestContext): void {
  contexts.set(request, context);
}

/** The client's address as resolved at the edge, or null when no edge bound one. */
export function clientIpOf(request: Request): string | null {
  return contexts.get(request)?.clientIp ?? null;
}

/** `demo:` + the IP key: the account id of demo traffic from this address. */
export const demoAccountId = (ip_key: string): string => `demo:${ip_key}`;

const RESOLVED_ADDRESSES_KEPT = 4096;

/**
 * The edge binder for one gateway: call it with every HTTP request and its socket address before
 * routing. Derives the demo key once, and resolves the client IP with the trusted-proxy rule.
 */
export function createBuyerEdge(input: { gatewaySecret: Uint8Array; now: () => number; trustedProxies: TrustedProxies }) {
  const demoKey = demoTokenKey(input.gatewaySecret);
  // resolveClientIp is pure and a client sends many requests from one address: recent answers are
  // remembered (bounded) instead of parsing the address per request (docs/benchmarks.md).
  const resolved = new Map<string, string | null>();
  return (request: Request, socketAddress: string | null): void => {
    const forwardedFor = request.headers.get("x-forwarded-for");
    const key = `${socketAddress}\n${forwardedFor}`;
    let clientIp = resolved.get(key);
    if (clientIp === undefined) {
      clientIp = resolveClientIp(socketAddress, forwardedFor, input.trustedProxies);
      if (resolved.size >= RESOLVED_ADDRESSES_KEPT) resolved.clear();
      resolved.set(key, clientIp);
    }
    bindBuyerContext(request, { clientIp, demoKey, now: input.now });
  };
}

export function bearerToken(request: Request): string | null {
  const header = request.headers.get("authorization");
  if (!header) return null;
  const match = /^Bearer\s+(\S+)\s*$/i.exec(header);
  return match ? match[1]! : null;
}

const REFRESH = "Refresh the browser demo session (reload the demo page, or POST /auth/demo-session for a new token).";

const demoRefusals = {
  malformed: `The demo token is not valid. ${REFRESH}`,
  bad_signature: `The demo token is not valid. ${REFRESH}`,
  expired: `The demo token has expired. ${REFRESH}`,
  other_ip: `The demo token was issued to another network address. ${REFRESH}`,
} as const;

/**
 * Authenticates the bearer of `request`. `policy` says whether this endpoint takes demo tokens; the
 * default refuses them, so a new endpoint is API-key-only unless it opts in.
 */
export async function authenticateBuyer(store: Store, request: Request, policy: DemoPolicy = "api_key_only"): Promise<AuthResult> {
  const token = bearerToken(request);
  if (!token) {
    return {
      ok: false,
      error: gatewayError("missing_bearer_token", "No bearer token was sent. Add the header 'Authorization: Bearer <API key>'."),
    };
  }
  if (token.startsWith(DEMO_TOKEN_PREFIX)) return authenticateDemo(request, token, policy);
  const key = await store.authenticateApiKey(token);
  if (!key) return { ok: false, error: gatewayError("invalid_api_key", "The API key is not valid or has been revoked.") };
  return { ok: true, principal: { kind: "api_key", ...key } };
}

function authenticateDemo(request: Request, token: string, policy: DemoPolicy): AuthResult {
  if (policy === "api_key_only") {
    const path = new URL(request.url).pathname;
    const message = `Demo tokens are accepted by /v1/chat/completions, /v1/responses, /v1/models and /v1/feedback only; ${path} needs an API key (sign up to get one).`;
    return { ok: false, error: gatewayError("invalid_demo_token", message) };
  }
  const context = contexts.get(request);
  if (!context?.demoKey) return { ok: false, error: gatewayError("invalid_demo_token", demoRefusals.malformed) };
  const clientKey = context.clientIp === null ? null : ipKey(context.clientIp);
  const verdict = verifyDemoToken(context.demoKey, token, clientKey, context.now());
  if (!verdict.ok) return { ok: false, error: gatewayError("invalid_demo_token", demoRefusals[verdict.reason]) };
  const { claims } = verdict;
  return {
    ok: true,
    principal: { kind: "demo", account_id: demoAccountId(claims.ip), ip_key: claims.ip, session_id: claims.sid, expires_at_ms: claims.exp },
  };
}
