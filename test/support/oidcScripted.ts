// A small scripted OpenID provider for the cases the stock one cannot produce: an ID token from
// another issuer, an expired one, one issued an hour in the future, one signed with a key outside the
// JWKS, one for another audience.
// Otherwise it behaves: discovery, JWKS, an authorization endpoint that logs the user in at once, and a
// token endpoint that checks client credentials, the code, its redirect_uri and PKCE.
import { createHash, randomBytes } from "node:crypto";
import { exportJWK, generateKeyPair, SignJWT, type CryptoKey } from "jose";

export type IdTokenMode = "good" | "foreign_issuer" | "expired" | "wrong_key" | "wrong_audience" | "issued_in_future";

interface IssuedCode {
  clientId: string;
  redirectUri: string;
  nonce: string | null;
  challenge: string | null;
}

export interface ScriptedIdp {
  issuer: string;
  /** How the next ID tokens are made. */
  mode: IdTokenMode;
  /** Subject of the user who "logs in". */
  subject: string;
  /** Token requests that got an ID token. */
  tokensIssued: number;
  stop(): void;
}

/** client_secret_basic (RFC 6749 §2.3.1): both parts form-urlencoded, then base64 of `id:secret`. */
function clientAuthenticated(header: string | null, client: { clientId: string; clientSecret: string }): boolean {
  const match = /^Basic ([A-Za-z0-9+/=]+)$/.exec(header ?? "");
  if (!match) return false;
  const decoded = Buffer.from(match[1]!, "base64").toString("utf8");
  const colon = decoded.indexOf(":");
  const formDecode = (s: string) => decodeURIComponent(s.replace(/\+/g, " "));
  return colon > 0 && formDecode(decoded.slice(0, colon)) === client.clientId && formDecode(decoded.slice(colon + 1)) === client.clientSecret;
}

export async function startScriptedIdp(client: { clientId: string; clientSecret: string }): Promise<ScriptedIdp> {
  const signing = await generateKeyPair("RS256");
  const stranger = await generateKeyPair("RS256");
  const publicJwk = { ...(await exportJWK(signing.publicKey)), kid: "k1", alg: "RS256", use: "sig" };
  const codes = new Map<string, IssuedCode>();

  const state: ScriptedIdp = { issuer: "", mode: "good", subject: "scripted-user", tokensIssued: 0, stop: () => server.stop(true) };

  const idToken = async (code: IssuedCode): Promise<string> => {
    const now = Math.floor(Date.now() / 1000);
    const expired = state.mode === "expired";
    const key: CryptoKey = state.mode === "wrong_key" ? stranger.privateKey : signing.privateKey;
    const claims: Record<string, unknown> = { email: `${state.subject}@scripted.test` };
    if (code.nonce !== null) claims.nonce = code.nonce;
    return new SignJWT(claims)
      .setProtectedHeader({ alg: "RS256", kid: "k1" })
      .setIssuer(state.mode === "foreign_issuer" ? "https://foreign-issuer.example" : state.issuer)
      .setSubject(state.subject)
      .setAudience(state.mode === "wrong_audience" ? "someone-else" : code.clientId)
      .setIssuedAt(expired ? now - 7200 : state.mode === "issued_in_future" ? now + 3600 : now)
      .setExpirationTime(expired ? now - 3600 : now + 600)
      .sign(key);
  };

  const oauthError = (error: string, status = 400) => Response.json({ error }, { status });

  const server = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    async fetch(request) {
      const url = new URL(request.url);
      switch (url.pathname) {
        case "/.well-known/openid-configuration":
          return Response.json({
            issuer: state.issuer,
            authorization_endpoint: `${state.issuer}/authorize`,
            token_endpoint: `${state.issuer}/token`,
            jwks_uri: `${state.issuer}/jwks`,
            response_types_supported: ["code"],
            subject_types_supported: ["public"],
            id_token_signing_alg_values_supported: ["RS256"],
            code_challenge_methods_supported: ["S256"],
            token_endpoint_auth_methods_supported: ["client_secret_basic"],
          });
        case "/jwks":
          return Response.json({ keys: [publicJwk] });
        case "/authorize": {
          const p = url.searchParams;
          const redirectUri = p.get("redirect_uri") ?? "";
          if (p.get("client_id") !== client.clientId) return oauthError("invalid_client");
          const code = randomBytes(24).toString("base64url");
          codes.set(code, { clientId: client.clientId, redirectUri, nonce: p.get("nonce"), challenge: p.get("code_challenge") });
          const back = new URL(redirectUri);
          back.searchParams.set("code", code);
          if (p.get("state") !== null) back.searchParams.set("state", p.get("state")!);
          return new Response(null, { status: 302, headers: { location: back.href } });
        }
        case "/token": {
          if (!clientAuthenticated(request.headers.get("authorization"), client)) return oauthError("invalid_client", 401);
          const form = new URLSearchParams(await request.text());
          const code = codes.get(form.get("code") ?? "");
          codes.delete(form.get("code") ?? "");
          if (!code || form.get("redirect_uri") !== code.redirectUri) return oauthError("invalid_grant");
          const verifier = form.get("code_verifier");
          if (code.challenge !== null || verifier !== null) {
            const computed = verifier === null ? null : createHash("sha256").update(verifier).digest("base64url");
            if (computed !== code.challenge) return oauthError("invalid_grant");
          }
          state.tokensIssued++;
          return Response.json({ access_token: randomBytes(16).toString("hex"), token_type: "Bearer", expires_in: 600, id_token: await idToken(code) });
        }
        default:
          return new Response("not found", { status: 404 });
      }
    },
  });
  state.issuer = `http://127.0.0.1:${server.port}`;
  return state;
}
