// Buyer credentials: Authorization: Bearer <API key>. Unknown bearers are answered by their kind
// (demo tokens start with `demo_`, DESIGN §7).
import { gatewayError, type GatewayError } from "./errors.ts";
import type { AuthenticatedKey, Store } from "../store/index.ts";

export type AuthResult = { ok: true; key: AuthenticatedKey } | { ok: false; error: GatewayError };

export function bearerToken(request: Request): string | null {
  const header = request.headers.get("authorization");
  if (!header) return null;
  const match = /^Bearer\s+(\S+)\s*$/i.exec(header);
  return match ? match[1]! : null;
}

export function authenticateBuyer(store: Store, request: Request): AuthResult {
  const token = bearerToken(request);
  if (!token) {
    return {
      ok: false,
      error: gatewayError("missing_bearer_token", "No bearer token was sent. Add the header 'Authorization: Bearer <API key>'."),
    };
  }
  if (token.startsWith("demo_")) {
    return { ok: false, error: gatewayError("invalid_demo_token", "The demo token is not valid. Refresh the browser demo session.") };
  }
  const key = store.authenticateApiKey(token);
  if (!key) return { ok: false, error: gatewayError("invalid_api_key", "The API key is not valid or has been revoked.") };
  return { ok: true, key };
}
