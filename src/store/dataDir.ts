// The data folder holds the HMAC secret, key hashes and signing keys: it is created 0700 and every file
// in it 0600 (docs/operator.md, "The data folder"). Modes already looser are reported, never changed:
// the operator may have a reason (a backup group), and silently tightening would hide it.
import { closeSync, existsSync, mkdirSync, openSync, readdirSync, statSync } from "node:fs";
import { join } from "node:path";

export const DATA_DIR_MODE = 0o700;
export const DATA_FILE_MODE = 0o600;

/** Creates `dir` (0700, parents as needed) when it is missing. */
export function ensureDataDir(dir: string): void {
  if (!existsSync(dir)) mkdirSync(dir, { recursive: true, mode: DATA_DIR_MODE });
}

/**
 * Creates `path` empty with mode 0600 when it is missing, so that SQLite, which gives its -wal and -shm
 * files the database file's own mode, creates those 0600 too.
 */
export function ensurePrivateFile(path: string): void {
  closeSync(openSync(path, "a", DATA_FILE_MODE));
}

export interface LooseMode {
  path: string;
  /** e.g. "0644" */
  mode: string;
  expected: string;
}

const octal = (mode: number) => mode.toString(8).padStart(4, "0");

/** `dir` itself and every folder and file under it that group or others may read or write. */
export function looseModes(dir: string): LooseMode[] {
  if (!existsSync(dir)) return [];
  const found: LooseMode[] = [];
  const check = (path: string, expected: number) => {
    const mode = statSync(path).mode & 0o777;
    if ((mode & 0o077) !== 0) found.push({ path, mode: octal(mode), expected: octal(expected) });
  };
  const walk = (path: string) => {
    check(path, DATA_DIR_MODE);
    for (const entry of readdirSync(path, { withFileTypes: true })) {
      const child = join(path, entry.name);
      if (entry.isDirectory()) walk(child);
      else if (entry.isFile()) check(child, DATA_FILE_MODE);
    }
  };
  walk(dir);
  return found;
}
