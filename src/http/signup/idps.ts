// Identity providers for sign-up: the `oidcProviders` setting, and each provider's OpenID Connect
// configuration discovered through `openid-client` (a maintained, certified OIDC client — no
// protocol code of our own). Discovery is lazy and memoised; a failed discovery is retried next time.
import { Type, type Static } from "@sinclair/typebox";
import { TypeCompiler } from "@sinclair/typebox/compiler";
import * as oidc from "openid-client";
import { parseAddress } from "../clientIp.ts";

const OidcProviderSetting = Type.Object(
  {
    /** The `<idp>` of /auth/<idp>/start: lowercase letters, digits and dashes. */
    name: Type.String({ pattern: "^[a-z0-9][a-z0-9-]{0,31}$" }),
    /** Issuer URL exactly as the provider's discovery document states it. */
    issuer: Type.String({ minLength: 1, maxLength: 2048 }),
    clientId: Type.String({ minLength: 1, maxLength: 512 }),
    clientSecret: Type.String({ minLength: 1, maxLength: 4096 }),
    /** Shown on the sign-in page; default the name. */
    label: Type.Optional(Type.String({ minLength: 1, maxLength: 64 })),
    /** Space-separated scopes; `openid` is always requested. Default `openid email`. */
    scopes: Type.Optional(Type.String({ maxLength: 512 })),
    tokenEndpointAuthMethod: Type.Optional(Type.Union([Type.Literal("client_secret_basic"), Type.Literal("client_secret_post")])),
  },
  { additionalProperties: false },
);
export type OidcProviderSetting = Static<typeof OidcProviderSetting>;
const settingsChecker = TypeCompiler.Compile(Type.Array(OidcProviderSetting, { maxItems: 32 }));

export interface IdentityProvider {
  name: string;
  label: string;
  issuer: URL;
  clientId: string;
  clientSecret: string;
  scope: string;
  tokenEndpointAuthMethod: "client_secret_basic" | "client_secret_post";
}

/** Plain http is tolerated for issuers on this machine only (development and tests). */
function isLoopbackHost(hostname: string): boolean {
  if (hostname === "localhost") return true;
  const address = parseAddress(hostname.replace(/^\[|\]$/g, ""));
  return address !== null && address.range() === "loopback";
}

/** Parses and checks the `oidcProviders` setting (a JSON array); absent means sign-up is off. */
export function parseOidcProviders(text: string | undefined): { ok: true; providers: IdentityProvider[] } | { ok: false; message: string } {
  if (text === undefined || text.trim() === "") return { ok: true, providers: [] };
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    return { ok: false, message: "oidcProviders: not valid JSON (expected an array of {name, issuer, clientId, clientSecret})" };
  }
  if (!settingsChecker.Check(json)) {
    const first = settingsChecker.Errors(json).First();
    return { ok: false, message: `oidcProviders: ${first ? `${first.path || "/"} ${first.message}` : "invalid"}` };
  }
  const providers: IdentityProvider[] = [];
  for (const entry of json) {
    if (providers.some((p) => p.name === entry.name)) return { ok: false, message: `oidcProviders: name ${entry.name} appears twice` };
    let issuer: URL;
    try {
      issuer = new URL(entry.issuer);
    } catch {
      return { ok: false, message: `oidcProviders: ${entry.name}: issuer is not a URL` };
    }
    if (issuer.protocol !== "https:" && !(issuer.protocol === "http:" && isLoopbackHost(issuer.hostname))) {
      return { ok: false, message: `oidcProviders: ${entry.name}: issuer must be https (plain http only on loopback)` };
    }
    const scopes = new Set(["openid", ...(entry.scopes ?? "email").split(/\s+/).filter(Boolean)]);
    providers.push({
      name: entry.name,
      label: entry.label ?? entry.name,
      issuer,
      clientId: entry.clientId,
      clientSecret: entry.clientSecret,
      scope: [...scopes].join(" "),
      tokenEndpointAuthMethod: entry.tokenEndpointAuthMethod ?? "client_secret_basic",
    });
  }
  return { ok: true, providers };
}

export type Discovered = { ok: true; config: oidc.Configuration } | { ok: false; reason: string };

export interface IdpRegistry {
  providers: readonly IdentityProvider[];
  find(name: string): IdentityProvider | undefined;
  /** The provider's discovered configuration; cached once it succeeds. */
  discover(provider: IdentityProvider): Promise<Discovered>;
}

/** Seconds allowed for each request to an identity provider (discovery, token endpoint, JWKS). */
const IDP_TIMEOUT_SECONDS = 10;

export function createIdpRegistry(providers: readonly IdentityProvider[]): IdpRegistry {
  const cache = new Map<string, Promise<oidc.Configuration>>();
  return {
    providers,
    find: (name) => providers.find((p) => p.name === name),
    async discover(provider) {
      let pending = cache.get(provider.name);
      if (!pending) {
        const auth =
          provider.tokenEndpointAuthMethod === "client_secret_post"
            ? oidc.ClientSecretPost(provider.clientSecret)
            : oidc.ClientSecretBasic(provider.clientSecret);
        // Non-repudiation checks: the ID token's signature is verified against the provider's JWKS
        // too, not only trusted for having come over TLS from the token endpoint.
        const execute = [oidc.enableNonRepudiationChecks];
        if (provider.issuer.protocol === "http:") execute.push(oidc.allowInsecureRequests);
        pending = oidc.discovery(provider.issuer, provider.clientId, undefined, auth, { execute, timeout: IDP_TIMEOUT_SECONDS });
        cache.set(provider.name, pending);
      }
      try {
        return { ok: true, config: await pending };
      } catch (error) {
        // Forget the failure so the next sign-in tries again (the provider may be back).
        if (cache.get(provider.name) === pending) cache.delete(provider.name);
        return { ok: false, reason: describeOidcError(error) };
      }
    },
  };
}

/** A short, log-safe description of an openid-client failure (never shown to buyers). */
export function describeOidcError(error: unknown): string {
  if (error instanceof Error) {
    const code = (error as { code?: unknown }).code;
    const oauthError = (error as { error?: unknown }).error;
    return [typeof code === "string" ? code : error.name, typeof oauthError === "string" ? oauthError : null, error.message]
      .filter(Boolean)
      .join(": ")
      .slice(0, 300);
  }
  return String(error).slice(0, 300);
}
