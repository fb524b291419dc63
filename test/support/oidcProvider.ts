// A real OpenID Connect provider for sign-up tests: the `oidc-provider` package, run as a child
// process on 127.0.0.1 (`bun test/support/oidcProvider.ts '<json options>'`). Logins go through its
// development interactions (any login name, any password), which the tests drive with fetch.
// Prints one JSON line `{"ready": true, "issuer": …}` on stdout once listening.
import Provider from "oidc-provider";

interface Options {
  port: number;
  clients: { client_id: string; client_secret: string; redirect_uris: string[] }[];
}

const options = JSON.parse(process.argv[2] ?? "{}") as Options;
const issuer = `http://127.0.0.1:${options.port}`;

const provider = new Provider(issuer, {
  clients: options.clients.map((c) => ({
    ...c,
    grant_types: ["authorization_code"],
    response_types: ["code"],
    token_endpoint_auth_method: "client_secret_basic",
  })),
  // The login name becomes the subject; every account has a verified address under example.test.
  async findAccount(_ctx, sub) {
    return { accountId: sub, claims: async () => ({ sub, email: `${sub}@example.test`, email_verified: true }) };
  },
  claims: { openid: ["sub"], email: ["email", "email_verified"] },
  // Put scope claims (email) in the ID token too: the gateway reads the ID token only.
  conformIdTokenClaims: false,
  cookies: { keys: ["oidc-test-cookie-key-0123456789abcdef"] },
  features: { devInteractions: { enabled: true } },
  // PKCE stays optional at the authorization endpoint so that a request stripped of its challenge
  // reaches the token endpoint, where the gateway's verifier must then be refused.
  pkce: { required: () => false },
});

provider.listen(options.port, "127.0.0.1", () => {
  process.stdout.write(`${JSON.stringify({ ready: true, issuer })}\n`);
});
