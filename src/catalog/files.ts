// The published form of the catalog in the data dir: catalog.json (exact signed bytes) and
// catalog.json.sig (base64 signature, no newline). The store's history is the source of truth; these
// files are a copy for publishing (e.g. a static host or a CDN) and for reading without the database.
// A crash between the store append and this write leaves old files, which the next publish repairs.
import { createHash } from "node:crypto";
import { readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";

export const CATALOG_FILE = "catalog.json";
export const CATALOG_SIG_FILE = "catalog.json.sig";

export interface PublishableCatalog {
  body: Uint8Array;
  signature: string;
  body_digest: string;
}

function readOrNull(path: string): Buffer | null {
  try {
    return readFileSync(path);
  } catch {
    return null;
  }
}

/** Writes one file atomically (temp file + rename), so a reader never sees a torn file. */
function writeAtomic(path: string, data: Uint8Array | string): void {
  const temp = `${path}.${process.pid}.tmp`;
  try {
    writeFileSync(temp, data, { mode: 0o600 }); // the data folder is private; buyers read it over HTTP
    renameSync(temp, path);
  } finally {
    rmSync(temp, { force: true });
  }
}

/**
 * Makes catalog.json and catalog.json.sig in `dataDir` hold `entry`; returns whether anything was
 * written. The pair is not replaced atomically together: a reader between the two renames sees a new
 * body with the old signature, fails verification and should read again.
 */
export function publishCatalogFiles(dataDir: string, entry: PublishableCatalog): boolean {
  const bodyPath = join(dataDir, CATALOG_FILE);
  const sigPath = join(dataDir, CATALOG_SIG_FILE);
  const body = readOrNull(bodyPath);
  const sig = readOrNull(sigPath);
  const bodyCurrent = body !== null && createHash("sha256").update(body).digest("hex") === entry.body_digest;
  const sigCurrent = sig !== null && sig.toString("latin1") === entry.signature;
  if (bodyCurrent && sigCurrent) return false;
  if (!bodyCurrent) writeAtomic(bodyPath, entry.body);
  if (!sigCurrent) writeAtomic(sigPath, entry.signature);
  return true;
}

/** The published pair as raw bytes and signature text, or null when either file is missing. */
export function readCatalogFiles(dataDir: string): { body: Uint8Array; signature: string } | null {
  const body = readOrNull(join(dataDir, CATALOG_FILE));
  const sig = readOrNull(join(dataDir, CATALOG_SIG_FILE));
  if (body === null || sig === null) return null;
  return { body: new Uint8Array(body), signature: sig.toString("latin1") };
}
