// The gateway checks receipt signatures with WebCrypto (off the main thread); the CLI and the ledger
// audit with node:crypto. Both must give the same answer for every input — valid, forged, a
// non-canonical S, small-order and invalid keys, wrong lengths — or a receipt's verdict would depend
// on which path judged it.
import { describe, expect, test } from "bun:test";
import { createHash, sign } from "node:crypto";
import { verifySignature, verifySignatureAsync } from "../../src/receipts/index.ts";
import { keyFromSeed, rawPublic } from "./independent-signer.ts";

/** The Ed25519 group order ℓ. */
const L = (1n << 252n) + 27742317777372353535851937790883648493n;
const fromLittleEndian = (b: Uint8Array) => b.reduceRight((n, byte) => (n << 8n) | BigInt(byte), 0n);
const toLittleEndian = (n: bigint, length: number) => Uint8Array.from({ length }, (_, i) => Number((n >> BigInt(8 * i)) & 255n));
/** Deterministic pseudo-random bytes: SHA-256 of a label. */
const bytesOf = (label: string, length = 32) => {
  let out = Buffer.alloc(0);
  for (let i = 0; out.length < length; i++) out = Buffer.concat([out, createHash("sha256").update(`${label}/${i}`).digest()]);
  return new Uint8Array(out.subarray(0, length));
};

const key = keyFromSeed(bytesOf("seed"));
const publicKey = rawPublic(key);
const otherPublic = rawPublic(keyFromSeed(bytesOf("other seed")));
const flip = (b: Uint8Array, bit: number) => {
  const c = b.slice();
  c[(bit >> 3) % c.length]! ^= 1 << (bit & 7);
  return c;
};

type Case = [name: string, signed: Uint8Array, signature: Uint8Array, publicKey: Uint8Array];
const cases: Case[] = [];
for (let i = 0; i < 24; i++) {
  const message = bytesOf(`message ${i}`, 40 + 37 * i);
  const signature = new Uint8Array(sign(null, message, key));
  cases.push(
    [`valid #${i}`, message, signature, publicKey],
    [`signature bit flipped #${i}`, message, flip(signature, 21 * i + 3), publicKey],
    [`message bit flipped #${i}`, flip(message, 13 * i + 1), signature, publicKey],
    [`key bit flipped #${i}`, message, signature, flip(publicKey, 11 * i + 5)],
    [`another key #${i}`, message, signature, otherPublic],
    [`random signature #${i}`, message, bytesOf(`signature ${i}`, 64), publicKey],
    [`random key #${i}`, message, signature, bytesOf(`key ${i}`)],
  );
  // S + ℓ: the same signature with a non-canonical scalar (when it still fits in 32 bytes).
  const s = fromLittleEndian(signature.subarray(32));
  if (s + L < 1n << 256n) {
    const malleated = signature.slice();
    malleated.set(toLittleEndian(s + L, 32), 32);
    cases.push([`S + ℓ #${i}`, message, malleated, publicKey]);
  }
}
// Small-order and non-canonical point encodings, as keys and as R with S = 0.
const specialPoints = [
  "0100000000000000000000000000000000000000000000000000000000000000",
  "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
  "0000000000000000000000000000000000000000000000000000000000000000",
  "0000000000000000000000000000000000000000000000000000000000000080",
  "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05",
  "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a",
  "edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
  "eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
].map((hex) => new Uint8Array(Buffer.from(hex, "hex")));
const shortMessage = bytesOf("short message", 30);
for (const [k, point] of specialPoints.entries()) {
  for (const [r, rPoint] of specialPoints.entries()) {
    const signature = new Uint8Array(64);
    signature.set(rPoint);
    cases.push([`small-order key ${k}, R ${r}, S = 0`, shortMessage, signature, point]);
  }
  cases.push([`small-order key ${k}, random signature`, shortMessage, bytesOf(`sig for ${k}`, 64), point]);
}
const valid = new Uint8Array(sign(null, shortMessage, key));
cases.push(
  ["a 31-byte key", shortMessage, valid, publicKey.subarray(0, 31)],
  ["a 33-byte key", shortMessage, valid, Uint8Array.from([...publicKey, 0])],
  ["a 63-byte signature", shortMessage, valid.subarray(0, 63), publicKey],
  ["an empty message", new Uint8Array(0), new Uint8Array(sign(null, new Uint8Array(0), key)), publicKey],
);

describe("verifySignatureAsync answers as verifySignature", () => {
  test.each(cases)("%s", async (_name, signed, signature, key) => {
    const envelope = { signed: new Uint8Array(signed), signature: new Uint8Array(signature) };
    expect(await verifySignatureAsync(envelope, key)).toBe(verifySignature(envelope, key));
  });

  test("the table holds valid signatures and forgeries", () => {
    const answers = cases.map(([, signed, signature, key]) => verifySignature({ signed: new Uint8Array(signed), signature: new Uint8Array(signature) }, key));
    expect(answers.filter(Boolean).length).toBeGreaterThanOrEqual(24);
    expect(answers.filter((a) => !a).length).toBeGreaterThan(100);
  });
});
