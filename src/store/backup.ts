// Online backup of the gateway's SQLite file: `VACUUM INTO` reads one consistent snapshot inside a
// read transaction (WAL lets the running gateway keep writing meanwhile) and writes a compact copy.
// bun:sqlite has no binding for SQLite's incremental backup API; VACUUM INTO needs none.

import { Database } from "bun:sqlite";
import { randomBytes } from "node:crypto";
import { chmodSync, closeSync, existsSync, fsyncSync, linkSync, openSync, rmSync, statSync } from "node:fs";
import { dirname, resolve } from "node:path";

export type BackupResult =
  | { ok: true; path: string; bytes: number }
  | { ok: false; code: "target_exists" | "no_database" | "no_target_dir" | "backup_failed"; message: string };

/**
 * Copies the database at `sourcePath` to `targetPath` while other connections may be reading and
 * writing it. Never overwrites: an existing target is refused, also one created while the copy ran
 * (the finished copy is hard-linked into place, which fails when the name exists). The copy is
 * integrity-checked and fsynced before it appears under its name, so a visible backup is complete.
 * The file is created mode 0600: it holds the gateway's secrets.
 */
export function backupDatabase(sourcePath: string, targetPath: string): BackupResult {
  const target = resolve(targetPath);
  if (existsSync(target)) return { ok: false, code: "target_exists", message: `${target} already exists; refusing to overwrite it` };
  if (!existsSync(sourcePath)) return { ok: false, code: "no_database", message: `no gateway database at ${sourcePath}` };
  if (!existsSync(dirname(target))) return { ok: false, code: "no_target_dir", message: `directory ${dirname(target)} does not exist` };

  const partial = `${target}.partial-${randomBytes(6).toString("hex")}`;
  try {
    // Not openDatabase(): a backup must never migrate (or otherwise write) the live file.
    const source = new Database(sourcePath, { create: false, readwrite: true });
    try {
      source.exec("PRAGMA busy_timeout = 5000");
      source.query("VACUUM INTO ?").run(partial);
    } finally {
      source.close();
    }
    const copy = new Database(partial, { readonly: true });
    try {
      const check = copy.query("PRAGMA integrity_check").get() as { integrity_check: string };
      if (check.integrity_check !== "ok") throw new Error(`integrity check of the copy failed: ${check.integrity_check}`);
    } finally {
      copy.close();
    }
    chmodSync(partial, 0o600);
    const fd = openSync(partial, "r");
    try {
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    try {
      linkSync(partial, target);
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === "EEXIST") {
        return { ok: false, code: "target_exists", message: `${target} already exists; refusing to overwrite it` };
      }
      throw error;
    }
    return { ok: true, path: target, bytes: statSync(target).size };
  } catch (error) {
    return { ok: false, code: "backup_failed", message: error instanceof Error ? error.message : String(error) };
  } finally {
    rmSync(partial, { force: true });
  }
}
