// The handshake signature of protocol v1 (docs/protocol.md) and raw Ed25519 key conversions, shared by the
// gateway (verify) and the provider runtime (sign). All cryptography is node:crypto.
import { createPublicKey, sign, verify, type KeyObject } from "node:crypto";

const HANDSHAKE_DOMAIN = "provider-auth-v1";

/** Raw 32-byte public key of an Ed25519 key object (private or public). */
export function rawPublicKey(key: KeyObject): Uint8Array {
  const publicKey = key.type === "private" ? createPublicKey(key) : key;
  const jwk = publicKey.export({ format: "jwk" });
  if (jwk.kty !== "OKP" || jwk.crv !== "Ed25519" || typeof jwk.x !== "string") {
    throw new Error("key is not an Ed25519 key");
  }
  return new Uint8Array(Buffer.from(jwk.x, "base64url"));
}

/** Ed25519 public key object from its raw 32 bytes (what a gateway receives in `hello`). */
export function publicKeyFromRaw(raw: Uint8Array): KeyObject {
  if (raw.byteLength !== 32) throw new Error("an Ed25519 public key is 32 bytes");
  const x = Buffer.from(raw).toString("base64url");
  return createPublicKey({ key: { kty: "OKP", crv: "Ed25519", x }, format: "jwk" });
}

/** The exact bytes signed in the `auth` frame (docs/protocol.md, handshake step 3). */
export function handshakeMessage(sessionId: string, providerId: string, nonce: Uint8Array): Uint8Array {
  const text = `${HANDSHAKE_DOMAIN}\n${sessionId}\n${providerId}\n${Buffer.from(nonce).toString("hex")}`;
  return new TextEncoder().encode(text);
}

/** Ed25519 signature (64 bytes) for the `auth` frame. */
export function signHandshake(
  privateKey: KeyObject,
  sessionId: string,
  providerId: string,
  nonce: Uint8Array,
): Uint8Array {
  return new Uint8Array(sign(null, handshakeMessage(sessionId, providerId, nonce), privateKey));
}

/** Checks an `auth` signature against the raw public key sent in `hello`. Never throws. */
export function verifyHandshake(
  publicKeyRaw: Uint8Array,
  sessionId: string,
  providerId: string,
  nonce: Uint8Array,
  signature: Uint8Array,
): boolean {
  try {
    return verify(null, handshakeMessage(sessionId, providerId, nonce), publicKeyFromRaw(publicKeyRaw), signature);
  } catch {
    return false;
  }
}
