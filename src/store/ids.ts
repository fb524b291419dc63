// Identifier and API-key generation. Randomness is a parameter so a seeded simulation can replay.

import { createHash } from "node:crypto";

export type RandomBytes = (length: number) => Uint8Array;

const BASE32 = "abcdefghijklmnopqrstuvwxyz234567";

/** Lowercase RFC 4648 base32 without padding. */
function base32(bytes: Uint8Array): string {
  let out = "";
  let buffer = 0;
  let bits = 0;
  for (const byte of bytes) {
    buffer = ((buffer << 8) | byte) & 0xffff;
    bits += 8;
    while (bits >= 5) {
      bits -= 5;
      out += BASE32[(buffer >> bits) & 31];
    }
  }
  if (bits > 0) out += BASE32[(buffer << (5 - bits)) & 31];
  return out;
}

/** `<prefix>_` + 24 base32 chars (120 random bits): unguessable and collision-free in practice. */
export function newId(prefix: "acct" | "key", random: RandomBytes): string {
  return `${prefix}_${base32(random(15))}`;
}

/** 32 random bytes = 256 bits, base64url without padding (43 chars). */
const KEY_BYTES = 32;
/** Random chars kept after `<prefix>_` in the display prefix: enough to tell keys apart, ~48 bits. */
const DISPLAY_RANDOM_CHARS = 8;

export const KEY_PREFIX_PATTERN = /^[A-Za-z0-9]{1,16}$/;

export function newApiKey(keyPrefix: string, random: RandomBytes): { api_key: string; display_prefix: string } {
  const api_key = `${keyPrefix}_${Buffer.from(random(KEY_BYTES)).toString("base64url")}`;
  return { api_key, display_prefix: api_key.slice(0, keyPrefix.length + 1 + DISPLAY_RANDOM_CHARS) };
}

/** sha256 of the key's UTF-8 bytes. A fast hash suffices: the key carries 256 random bits, so
 *  there is nothing to brute-force that a slow password hash would protect. */
export function hashApiKey(api_key: string): Uint8Array {
  return createHash("sha256").update(api_key, "utf8").digest();
}
