// Browser demo tokens: `demo_<claims>.<mac>`, where claims is base64url JSON and mac is
// HMAC-SHA256 over `demo_<claims>` under a key derived from the gateway secret. Verified by the MAC
// alone (no database read per request); bound to the client's IP key and expiring.
import { Type, type Static } from "@sinclair/typebox";
import { TypeCompiler } from "@sinclair/typebox/compiler";
import { createHmac, hkdfSync, timingSafeEqual } from "node:crypto";

export const DEMO_TOKEN_PREFIX = "demo_";

const DemoClaims = Type.Object(
  {
    v: Type.Literal(1),
    /** The demo session (a row in demo_sessions, kept for counting). */
    sid: Type.String({ minLength: 1, maxLength: 64 }),
    /** The client IP key the token was issued to: `a.b.c.d/32` or `<ipv6 prefix>::/64`. */
    ip: Type.String({ minLength: 1, maxLength: 64 }),
    iat: Type.Integer({ minimum: 0 }),
    exp: Type.Integer({ minimum: 0 }),
  },
  { additionalProperties: false },
);
export type DemoClaims = Static<typeof DemoClaims>;
const demoClaimsChecker = TypeCompiler.Compile(DemoClaims);

export type DemoTokenVerdict =
  | { ok: true; claims: DemoClaims }
  | { ok: false; reason: "malformed" | "bad_signature" | "expired" | "other_ip" };

/** Longer than any honest issuance clock skew between nodes; a token "from the future" is forged. */
const ISSUED_AT_SKEW_MS = 60_000;

const TOKEN_SHAPE = /^demo_([A-Za-z0-9_-]{1,700})\.([A-Za-z0-9_-]{43})$/;

/**
 * The demo-token MAC key: HKDF of the gateway secret with its own label, so a demo MAC can never be
 * confused with any other HMAC the gateway computes under the same secret (account_scope, sessions).
 */
export function demoTokenKey(gatewaySecret: Uint8Array): Uint8Array {
  return new Uint8Array(hkdfSync("sha256", gatewaySecret, new Uint8Array(0), "gateway demo token v1", 32));
}

const mac = (key: Uint8Array, signed: string): Buffer => createHmac("sha256", key).update(signed, "utf8").digest();

export function signDemoToken(key: Uint8Array, claims: DemoClaims): string {
  const signed = DEMO_TOKEN_PREFIX + Buffer.from(JSON.stringify(claims), "utf8").toString("base64url");
  return `${signed}.${mac(key, signed).toString("base64url")}`;
}

/** Checks shape, MAC (constant-time), claims, expiry and the IP binding, in that order. */
export function verifyDemoToken(key: Uint8Array, token: string, clientIpKey: string | null, now_ms: number): DemoTokenVerdict {
  const match = TOKEN_SHAPE.exec(token);
  if (!match) return { ok: false, reason: "malformed" };
  const signed = DEMO_TOKEN_PREFIX + match[1]!;
  const given = Buffer.from(match[2]!, "base64url");
  const expected = mac(key, signed);
  if (given.length !== expected.length || !timingSafeEqual(given, expected)) return { ok: false, reason: "bad_signature" };
  let claims: unknown;
  try {
    claims = JSON.parse(Buffer.from(match[1]!, "base64url").toString("utf8"));
  } catch {
    return { ok: false, reason: "malformed" };
  }
  // A valid MAC over bad claims means a bug in issuance, not an attack; refuse all the same.
  if (!demoClaimsChecker.Check(claims)) return { ok: false, reason: "malformed" };
  if (claims.exp <= now_ms || claims.iat > now_ms + ISSUED_AT_SKEW_MS) return { ok: false, reason: "expired" };
  if (clientIpKey === null || claims.ip !== clientIpKey) return { ok: false, reason: "other_ip" };
  return { ok: true, claims };
}
