// Sign-up through an external identity provider (docs/signup.md) and the account page.
//
//   GET  /auth/<idp>/start     → 303 to the IdP: authorization code + PKCE (S256) + state + nonce.
//   GET  /auth/<idp>/callback  → checks everything (via openid-client), finds or creates the account
//                                linked to (issuer, sub), opens a session, 303 → /account.
//   GET  /account              → keys (prefix only) and, once, a newly issued key.
//   POST /account/keys[/<id>/rotate|/<id>/revoke], /account/logout — forms with a CSRF token.
//
// The pending login lives in SQLite keyed by `state` and is deleted by the first callback that names
// it, so a replayed callback (same state and code) finds nothing. It is also bound to the browser that
// started it (a cookie whose hash the row holds), so an attacker cannot finish their own login in a
// victim's browser.
import { Type } from "@sinclair/typebox";
import { TypeCompiler } from "@sinclair/typebox/compiler";
import { Elysia } from "elysia";
import * as oidc from "openid-client";
import { readBody } from "../body.ts";
import { errorResponse, gatewayError, type GatewayError } from "../errors.ts";
import type { Log } from "../../log.ts";
import type { AsyncStore as Store } from "../../store/asyncStore.ts";
import { describeOidcError, type IdentityProvider, type IdpRegistry } from "./idps.ts";
import { accountPage, htmlErrorPage, signInPage } from "./pages.ts";
import {
  cookieNames,
  csrfTokens,
  isCookieToken,
  newCookieToken,
  openForSession,
  readCookie,
  sameBytes,
  sealForSession,
  setCookie,
  sha256,
  type RandomBytes,
} from "./session.ts";

/** How long a started sign-in may take at the IdP. */
export const PENDING_LOGIN_TTL_MS = 10 * 60_000;
/** Lifetime of an account-page session. */
export const ACCOUNT_SESSION_TTL_MS = 8 * 60 * 60_000;
/** How long a newly issued key waits for its one display before it is dropped (rotate again then). */
export const KEY_REVEAL_TTL_MS = 10 * 60_000;
/** Live keys one account may hold; rotation does not count against it. */
export const MAX_LIVE_KEYS = 10;

export interface SignupDeps {
  store: Store;
  idps: IdpRegistry;
  /** Scheme, host and port browsers use to reach the gateway, without a trailing slash. */
  publicBaseUrl: () => string;
  gatewaySecret: Uint8Array;
  now: () => number;
  randomBytes: RandomBytes;
  requestId: (request: Request) => string;
  log: Log;
}

const FormBody = Type.Object({ csrf: Type.String({ minLength: 1, maxLength: 128 }) });
const formBodyChecker = TypeCompiler.Compile(FormBody);
const FORM_BODY_LIMIT = 4096;

const redirect = (location: string, headers: Record<string, string> = {}, cookies: string[] = []): Response => {
  const h = new Headers({ location, "cache-control": "no-store", ...headers });
  for (const c of cookies) h.append("set-cookie", c);
  return new Response(null, { status: 303, headers: h });
};

const RESTART = "Start again from the sign-in page.";

export function signupRoutes(deps: SignupDeps) {
  const csrf = csrfTokens(deps.gatewaySecret);
  const secure = () => deps.publicBaseUrl().startsWith("https:");
  const names = () => cookieNames(secure());
  const callbackUrl = (idp: IdentityProvider) => `${deps.publicBaseUrl()}/auth/${idp.name}/callback`;

  const refuse = (request: Request, err: GatewayError) => htmlErrorPage(err, deps.requestId(request), deps.idps.providers);
  const unknownIdp = (request: Request) =>
    errorResponse(gatewayError("not_found", "No identity provider of that name is configured on this gateway."), deps.requestId(request));

  async function start(request: Request, name: string): Promise<Response> {
    const idp = deps.idps.find(name);
    if (!idp) return unknownIdp(request);
    const discovered = await deps.idps.discover(idp);
    if (!discovered.ok) {
      deps.log.warn("oidc_discovery_failed", { idp: idp.name, reason: discovered.reason });
      return refuse(request, gatewayError("identity_provider_unavailable", `The identity provider ${idp.label} cannot be reached right now. Try again in a minute.`));
    }
    // One binding per browser, reused across tabs, so two sign-ins started side by side both work.
    const existing = readCookie(request, names().login);
    const binding = isCookieToken(existing) ? existing : newCookieToken(deps.randomBytes);
    const now = deps.now();
    const state = oidc.randomState();
    const nonce = oidc.randomNonce();
    const code_verifier = oidc.randomPKCECodeVerifier();
    await deps.store.savePendingLogin(
      { state, idp: idp.name, browser_hash: sha256(binding), code_verifier, nonce, created_at_ms: now, expires_at_ms: now + PENDING_LOGIN_TTL_MS },
      now,
    );
    const url = oidc.buildAuthorizationUrl(discovered.config, {
      redirect_uri: callbackUrl(idp),
      scope: idp.scope,
      state,
      nonce,
      code_challenge: await oidc.calculatePKCECodeChallenge(code_verifier),
      code_challenge_method: "S256",
    });
    return redirect(url.href, {}, [setCookie(names().login, binding, PENDING_LOGIN_TTL_MS / 1000, secure())]);
  }

  /** Clock skew allowed between this gateway and an identity provider, both ways (docs/signup.md). */
  const ID_TOKEN_SKEW_SECONDS = 30;

  async function callback(request: Request, name: string): Promise<Response> {
    const idp = deps.idps.find(name);
    if (!idp) return unknownIdp(request);
    const rid = deps.requestId(request);
    const params = new URL(request.url).searchParams;
    const state = params.get("state");
    const fail = (reason: string, message = `Sign-in could not be completed. ${RESTART}`) => {
      deps.log.warn("signin_refused", { idp: idp.name, reason, request_id: rid });
      return refuse(request, gatewayError("signin_failed", message));
    };
    if (!state) return fail("missing_state");
    // Taken (deleted) before anything else: whatever happens next, this state never works twice.
    const pending = await deps.store.takePendingLogin(state, deps.now());
    if (!pending) return fail("unknown_or_used_state", `This sign-in link has expired, was already used, or was not started here. ${RESTART}`);
    const binding = readCookie(request, names().login);
    if (pending.idp !== idp.name || !isCookieToken(binding) || !sameBytes(sha256(binding), pending.browser_hash)) {
      return fail("browser_mismatch", `This sign-in was started in another browser. ${RESTART}`);
    }
    if (params.has("error")) return fail(`idp_error:${(params.get("error") ?? "").slice(0, 64)}`);
    const discovered = await deps.idps.discover(idp);
    if (!discovered.ok) {
      deps.log.warn("oidc_discovery_failed", { idp: idp.name, reason: discovered.reason });
      return refuse(request, gatewayError("identity_provider_unavailable", `The identity provider ${idp.label} cannot be reached right now. ${RESTART}`));
    }
    // The URL the IdP redirected to, as the IdP saw it: its origin and path are the redirect_uri sent
    // to the token endpoint, so it is built from the public base URL, not from this hop's Host header.
    const current = new URL(callbackUrl(idp));
    current.search = new URL(request.url).search;
    let claims: oidc.IDToken | undefined;
    try {
      const tokens = await oidc.authorizationCodeGrant(discovered.config, current, {
        pkceCodeVerifier: pending.code_verifier,
        expectedState: pending.state,
        expectedNonce: pending.nonce,
        idTokenExpected: true,
      });
      claims = tokens.claims();
    } catch (error) {
      return fail(describeOidcError(error));
    }
    if (!claims || typeof claims.sub !== "string" || claims.sub === "") return fail("no_subject");
    // openid-client checks `exp` with its skew but takes any `iat`: a token "issued" in the future is
    // forged or from a broken clock, and docs/signup.md promises both within ID_TOKEN_SKEW_SECONDS.
    if (typeof claims.iat !== "number" || claims.iat > deps.now() / 1000 + ID_TOKEN_SKEW_SECONDS) return fail("iat_in_future");
    const email = typeof claims.email === "string" && claims.email.length <= 320 ? claims.email : null;
    const sessionToken = newCookieToken(deps.randomBytes);
    const now = deps.now();
    const result = await deps.store.signIn(
      {
        idp: idp.name,
        issuer: claims.iss,
        subject: claims.sub,
        email,
        session_hash: sha256(sessionToken),
        session_expires_at_ms: now + ACCOUNT_SESSION_TTL_MS,
        reveal_ttl_ms: KEY_REVEAL_TTL_MS,
      },
      (apiKey) => sealForSession(sessionToken, apiKey, deps.randomBytes),
      now,
    );
    deps.log.info("signin_completed", { idp: idp.name, account_id: result.account_id, created: result.created, request_id: rid });
    return redirect("/account", {}, [setCookie(names().session, sessionToken, ACCOUNT_SESSION_TTL_MS / 1000, secure())]);
  }

  /** The session of this request, or null; also returns the cookie value (it opens key reveals). */
  async function sessionOf(request: Request) {
    const token = readCookie(request, names().session);
    if (!isCookieToken(token)) return null;
    const hash = sha256(token);
    const session = await deps.store.getAccountSession(hash, deps.now());
    return session ? { token, hash, account_id: session.account_id } : null;
  }

  async function account(request: Request): Promise<Response> {
    const rid = deps.requestId(request);
    const session = await sessionOf(request);
    if (!session) return signInPage(deps.idps.providers, rid);
    const sealed = await deps.store.takeKeyReveal(session.hash, deps.now());
    return accountPage({
      accountId: session.account_id,
      identities: await deps.store.listIdentities(session.account_id),
      keys: await deps.store.listApiKeys(session.account_id),
      newKey: sealed ? openForSession(session.token, sealed) : null,
      csrf: csrf.tokenFor(session.hash),
      baseUrl: deps.publicBaseUrl(),
      requestId: rid,
    });
  }

  type FormAction = (session: { token: string; hash: Uint8Array; account_id: string }) => Promise<GatewayError | Response | null>;

  /** Shared checks of every account-page form: session, same origin, CSRF token. Then `action`. */
  async function form(request: Request, action: FormAction): Promise<Response> {
    const rid = deps.requestId(request);
    const session = await sessionOf(request);
    if (!session) return signInPage(deps.idps.providers, rid);
    // Browsers send Origin on POST; when present it must be ours (defence in depth beside the token).
    const origin = request.headers.get("origin");
    if (origin !== null && origin !== new URL(deps.publicBaseUrl()).origin) {
      return refuse(request, gatewayError("invalid_csrf_token", "This form was sent from another site. Reload the account page and try again."));
    }
    const body = await readBody(request, FORM_BODY_LIMIT);
    const fields = body ? Object.fromEntries(new URLSearchParams(new TextDecoder().decode(body))) : null;
    if (!fields || !formBodyChecker.Check(fields) || !csrf.verify(session.hash, fields.csrf)) {
      return refuse(request, gatewayError("invalid_csrf_token", "The form has expired or was not sent from the account page. Reload the account page and try again."));
    }
    const outcome = await action(session);
    if (outcome instanceof Response) return outcome;
    if (outcome) return refuse(request, outcome);
    return redirect("/account");
  }

  function issue(request: Request, replaces_key_id?: string) {
    return form(request, async (session) => {
      const result = await deps.store.issueAccountKey(
        { account_id: session.account_id, session_hash: session.hash, replaces_key_id, reveal_ttl_ms: KEY_REVEAL_TTL_MS, max_live_keys: MAX_LIVE_KEYS },
        (apiKey) => sealForSession(session.token, apiKey, deps.randomBytes),
        deps.now(),
      );
      if (result.ok) return null;
      return result.code === "not_found"
        ? gatewayError("not_found", "That key is not an active key of this account.")
        : gatewayError("too_many_api_keys", `This account already has ${MAX_LIVE_KEYS} active keys. Revoke one first.`);
    });
  }

  return new Elysia()
    .get("/auth/:idp/start", ({ request, params }) => start(request, params.idp))
    .get("/auth/:idp/callback", ({ request, params }) => callback(request, params.idp))
    .get("/account", ({ request }) => account(request))
    .post("/account/keys", ({ request }) => issue(request), { parse: "none" })
    .post("/account/keys/:key_id/rotate", ({ request, params }) => issue(request, params.key_id), { parse: "none" })
    .post(
      "/account/keys/:key_id/revoke",
      ({ request, params }) =>
        form(request, async (session) =>
          (await deps.store.revokeAccountKey(session.account_id, params.key_id, deps.now()))
            ? null
            : gatewayError("not_found", "That key is not a key of this account."),
        ),
      { parse: "none" },
    )
    .post(
      "/account/logout",
      ({ request }) =>
        form(request, async (session) => {
          await deps.store.endAccountSession(session.hash, deps.now());
          return redirect("/account", {}, [setCookie(names().session, "", 0, secure())]);
        }),
      { parse: "none" },
    );
}
