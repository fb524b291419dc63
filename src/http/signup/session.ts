// Browser state of sign-up and the account page: cookies, CSRF tokens, and the one-time key reveal.
// Invariants:
// - Cookies hold random 256-bit values; the database holds only their sha256, so a copy of it yields
//   no usable session or login binding.
// - A newly issued API key waits for its one display sealed (AES-256-GCM) under a key derived from the
//   session cookie itself: the database alone cannot open it, and the reveal is deleted when shown.
// - CSRF tokens are an HMAC of the session hash under a key derived from the gateway secret: nothing to
//   store, and worthless for any other session.
import { createCipheriv, createDecipheriv, createHash, createHmac, hkdfSync, timingSafeEqual } from "node:crypto";

export type RandomBytes = (n: number) => Uint8Array;

const TOKEN_BYTES = 32;
const TOKEN_SHAPE = /^[A-Za-z0-9_-]{43}$/;

/** A fresh random cookie value: 32 bytes, base64url. */
export const newCookieToken = (random: RandomBytes): string => Buffer.from(random(TOKEN_BYTES)).toString("base64url");

export const isCookieToken = (value: string | undefined): value is string => value !== undefined && TOKEN_SHAPE.test(value);

export const sha256 = (value: string): Uint8Array => new Uint8Array(createHash("sha256").update(value, "utf8").digest());

export const sameBytes = (a: Uint8Array, b: Uint8Array): boolean => a.length === b.length && timingSafeEqual(a, b);

const derive = (secret: Uint8Array | string, label: string): Buffer =>
  Buffer.from(hkdfSync("sha256", typeof secret === "string" ? Buffer.from(secret, "utf8") : secret, new Uint8Array(0), label, 32));

const IV_BYTES = 12;
const TAG_BYTES = 16;

/** Seals `apiKey` for one display to the holder of `sessionToken`: iv ‖ ciphertext ‖ tag. */
export function sealForSession(sessionToken: string, apiKey: string, random: RandomBytes): Uint8Array {
  const iv = random(IV_BYTES);
  const cipher = createCipheriv("aes-256-gcm", derive(sessionToken, "gateway key reveal v1"), iv);
  const body = Buffer.concat([cipher.update(apiKey, "utf8"), cipher.final()]);
  return new Uint8Array(Buffer.concat([iv, body, cipher.getAuthTag()]));
}

/** Opens a reveal sealed by sealForSession; null when it was sealed for another session or altered. */
export function openForSession(sessionToken: string, sealed: Uint8Array): string | null {
  if (sealed.length <= IV_BYTES + TAG_BYTES) return null;
  try {
    const decipher = createDecipheriv("aes-256-gcm", derive(sessionToken, "gateway key reveal v1"), sealed.subarray(0, IV_BYTES));
    decipher.setAuthTag(sealed.subarray(sealed.length - TAG_BYTES));
    return Buffer.concat([decipher.update(sealed.subarray(IV_BYTES, sealed.length - TAG_BYTES)), decipher.final()]).toString("utf8");
  } catch {
    return null;
  }
}

/** CSRF tokens for the account page's forms, bound to one session. */
export function csrfTokens(gatewaySecret: Uint8Array) {
  const key = derive(gatewaySecret, "gateway account csrf v1");
  const tokenFor = (sessionHash: Uint8Array): string => createHmac("sha256", key).update(sessionHash).digest("base64url");
  return {
    tokenFor,
    verify(sessionHash: Uint8Array, given: string): boolean {
      const expected = Buffer.from(tokenFor(sessionHash), "utf8");
      const actual = Buffer.from(given, "utf8");
      return actual.length === expected.length && timingSafeEqual(actual, expected);
    },
  };
}

/** Cookie names: with https the `__Host-` prefix pins them to this host, path / and Secure. */
export function cookieNames(secure: boolean) {
  const prefix = secure ? "__Host-" : "";
  return { session: `${prefix}gw_session`, login: `${prefix}gw_login` };
}

export function readCookie(request: Request, name: string): string | undefined {
  const header = request.headers.get("cookie");
  if (!header) return undefined;
  for (const part of header.split(";")) {
    const eq = part.indexOf("=");
    if (eq > 0 && part.slice(0, eq).trim() === name) return part.slice(eq + 1).trim();
  }
  return undefined;
}

/**
 * A Set-Cookie value: HttpOnly, SameSite=Lax, Path=/, Secure on https. Lax rather than Strict because
 * the IdP's redirect back to the callback is a cross-site navigation, and Strict cookies are withheld
 * from it (and from the redirect chain that follows); POST forms are covered by CSRF tokens instead.
 */
export function setCookie(name: string, value: string, maxAgeSeconds: number, secure: boolean): string {
  return `${name}=${value}; Max-Age=${maxAgeSeconds}; Path=/; HttpOnly; SameSite=Lax${secure ? "; Secure" : ""}`;
}
