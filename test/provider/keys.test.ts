import { afterAll, describe, expect, test } from "bun:test";
import { createPublicKey, verify } from "node:crypto";
import { chmod, mkdtemp, readFile, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { loadOrCreateProviderKey } from "../../src/provider/keys.ts";
import { handshakeMessage, signHandshake, verifyHandshake } from "../../src/wire/handshake.ts";

const dir = await mkdtemp(join(tmpdir(), "provider-keys-"));
afterAll(() => rm(dir, { recursive: true, force: true }));

describe("provider key file", () => {
  test("is created with mode 0600 (parent folders too) and reused on the next load", async () => {
    const keyFile = join(dir, "nested", "deeper", "provider.pem");
    const first = await loadOrCreateProviderKey(keyFile);
    expect(first.created).toBe(true);
    expect(first.insecureMode).toBe(false);
    expect((await stat(keyFile)).mode & 0o777).toBe(0o600);
    expect(await readFile(keyFile, "utf8")).toStartWith("-----BEGIN PRIVATE KEY-----");

    const second = await loadOrCreateProviderKey(keyFile);
    expect(second.created).toBe(false);
    expect(second.publicKeyBase64).toBe(first.publicKeyBase64);
    expect(Buffer.from(second.publicKeyRaw).equals(Buffer.from(first.publicKeyRaw))).toBe(true);
  });

  test("the public key is the raw 32 bytes (the tail of the SPKI DER), standard base64", async () => {
    const key = await loadOrCreateProviderKey(join(dir, "raw.pem"));
    const spki = createPublicKey(key.privateKey).export({ format: "der", type: "spki" });
    expect(key.publicKeyRaw.byteLength).toBe(32);
    expect(Buffer.from(key.publicKeyRaw).equals(spki.subarray(spki.byteLength - 32))).toBe(true);
    expect(Buffer.from(key.publicKeyBase64, "base64").equals(Buffer.from(key.publicKeyRaw))).toBe(true);
  });

  test("a group/world readable key file is reported, not changed", async () => {
    const keyFile = join(dir, "loose.pem");
    await loadOrCreateProviderKey(keyFile);
    await chmod(keyFile, 0o644);
    const key = await loadOrCreateProviderKey(keyFile);
    expect(key.insecureMode).toBe(true);
    expect((await stat(keyFile)).mode & 0o777).toBe(0o644);
  });

  test("a file that is not an Ed25519 PKCS#8 key is refused with a clear error", async () => {
    const keyFile = join(dir, "junk.pem");
    await writeFile(keyFile, "not a key", { mode: 0o600 });
    await expect(loadOrCreateProviderKey(keyFile)).rejects.toThrow(/PKCS#8 PEM/);
  });
});

describe("handshake signature", () => {
  test("verifies with node:crypto over the documented message", async () => {
    const key = await loadOrCreateProviderKey(join(dir, "hs.pem"));
    const nonce = new Uint8Array(32).map((_, i) => i * 7);
    const signature = signHandshake(key.privateKey, "sess-42", "prov.a-1", nonce);
    expect(signature.byteLength).toBe(64);

    const expected = `provider-auth-v1\nsess-42\nprov.a-1\n${Buffer.from(nonce).toString("hex")}`;
    expect(new TextDecoder().decode(handshakeMessage("sess-42", "prov.a-1", nonce))).toBe(expected);
    const publicKey = createPublicKey({
      key: { kty: "OKP", crv: "Ed25519", x: Buffer.from(key.publicKeyRaw).toString("base64url") },
      format: "jwk",
    });
    expect(verify(null, Buffer.from(expected), publicKey, signature)).toBe(true);
    expect(verifyHandshake(key.publicKeyRaw, "sess-42", "prov.a-1", nonce, signature)).toBe(true);
  });

  test.each([
    ["another session", "sess-43", "prov.a-1", 0],
    ["another provider id", "sess-42", "prov.a-2", 0],
    ["another nonce", "sess-42", "prov.a-1", 1],
  ])("does not verify for %s", async (_, sessionId, providerId, nonceDelta) => {
    const key = await loadOrCreateProviderKey(join(dir, "hs.pem"));
    const nonce = new Uint8Array(32);
    const signature = signHandshake(key.privateKey, "sess-42", "prov.a-1", nonce);
    const other = nonce.map((b, i) => (i === 0 ? b + nonceDelta : b));
    expect(verifyHandshake(key.publicKeyRaw, sessionId, providerId, other, signature)).toBe(false);
  });

  test("verifyHandshake never throws on malformed keys or signatures", () => {
    expect(verifyHandshake(new Uint8Array(5), "s", "p", new Uint8Array(32), new Uint8Array(64))).toBe(false);
  });
});
