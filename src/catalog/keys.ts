// The operator's catalog signing key: one Ed25519 PKCS#8 PEM file in the data dir, mode 0600.
// Invariant: the private key is never printed, logged or returned in any command's output; only its
// raw public half leaves this module in a printable form.
import { createPrivateKey, generateKeyPairSync, type KeyObject } from "node:crypto";
import { closeSync, fsyncSync, linkSync, mkdirSync, openSync, readFileSync, rmSync, statSync, writeSync } from "node:fs";
import { join } from "node:path";
import { rawPublicKey } from "../wire/handshake.ts";

/** File name of the operator key inside the data dir. */
export const OPERATOR_KEY_FILE = "catalog-operator.key";

export const operatorKeyPath = (dataDir: string): string => join(dataDir, OPERATOR_KEY_FILE);

export interface OperatorKey {
  privateKey: KeyObject;
  /** Raw 32-byte Ed25519 public key: what verifiers pin and GET /v1/catalog/pubkey serves. */
  publicKeyRaw: Uint8Array;
  /** Standard padded base64 of `publicKeyRaw`. */
  publicKeyBase64: string;
  /** True when the existing file is readable by group or others; callers should warn. */
  insecureMode: boolean;
}

export type OperatorKeyResult =
  | { ok: true; key: OperatorKey; created: boolean }
  | { ok: false; code: "missing" | "unreadable" | "not_ed25519"; message: string };

function describe(privateKey: KeyObject, insecureMode: boolean): OperatorKey {
  const publicKeyRaw = rawPublicKey(privateKey);
  return { privateKey, publicKeyRaw, publicKeyBase64: Buffer.from(publicKeyRaw).toString("base64"), insecureMode };
}

/** Reads the operator key from the data dir. Never throws for an expected failure. */
export function loadOperatorKey(dataDir: string): OperatorKeyResult {
  const path = operatorKeyPath(dataDir);
  let pem: string;
  let mode: number;
  try {
    pem = readFileSync(path, "utf8");
    mode = statSync(path).mode;
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === "ENOENT") return { ok: false, code: "missing", message: `no operator key at ${path} (run gateway catalog init)` };
    return { ok: false, code: "unreadable", message: `cannot read operator key ${path}: ${code ?? "error"}` };
  }
  let key: KeyObject;
  try {
    key = createPrivateKey({ key: pem, format: "pem" });
  } catch {
    // The message names the file only: echoing a parse error could quote key material.
    return { ok: false, code: "not_ed25519", message: `operator key ${path} is not a PKCS#8 PEM private key` };
  }
  if (key.asymmetricKeyType !== "ed25519") {
    return { ok: false, code: "not_ed25519", message: `operator key ${path} is not an Ed25519 key` };
  }
  // Only reported, never repaired: silently chmod-ing an operator's file would hide the exposure.
  const insecureMode = process.platform !== "win32" && (mode & 0o077) !== 0;
  return { ok: true, key: describe(key, insecureMode), created: false };
}

/**
 * Loads the operator key, or creates it (Ed25519, PKCS#8 PEM, mode 0600) when the file is missing.
 * The PEM is written and fsynced to a private temporary file first and then hard-linked into place:
 * link() is atomic and fails when the name exists, so the key file is never seen half-written or
 * briefly world-readable, and two processes initialising one data dir at once end up with the same
 * key (the loser reads the winner's file).
 */
export function loadOrCreateOperatorKey(dataDir: string): OperatorKeyResult {
  const loaded = loadOperatorKey(dataDir);
  if (loaded.ok || loaded.code !== "missing") return loaded;
  const { privateKey } = generateKeyPairSync("ed25519");
  const pem = privateKey.export({ format: "pem", type: "pkcs8" }).toString();
  const finalPath = operatorKeyPath(dataDir);
  const tempPath = `${finalPath}.${process.pid}.${Date.now()}.tmp`;
  try {
    mkdirSync(dataDir, { recursive: true, mode: 0o700 });
    const fd = openSync(tempPath, "wx", 0o600);
    try {
      writeSync(fd, pem);
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    linkSync(tempPath, finalPath);
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === "EEXIST") return loadOperatorKey(dataDir);
    return { ok: false, code: "unreadable", message: `cannot create operator key ${finalPath}: ${code ?? "error"}` };
  } finally {
    rmSync(tempPath, { force: true });
  }
  return { ok: true, key: describe(privateKey, false), created: true };
}
