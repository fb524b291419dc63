// Opening the embedded SQLite database: durability pragmas and versioned migrations.

import { Database } from "bun:sqlite";
import { dirname } from "node:path";
import { ensureDataDir, ensurePrivateFile } from "./dataDir.ts";
import { migrations as defaultMigrations } from "./migrations.ts";

// bun:sqlite keeps the statement of `db.query(sql)` only for the first MAX_QUERY_CACHE_SIZE (20)
// distinct SQL texts a connection sees; every later text is prepared again on each call. The store
// uses about a hundred, and the first twenty include start-up and migration queries, so the whole
// per-request path was re-prepared per call (docs/benchmarks.md). No value
// is ever interpolated into SQL text (a few queries combine fixed clauses), so the set of texts is
// small and fixed, and the cap still bounds the cache.
Database.MAX_QUERY_CACHE_SIZE = Math.max(Database.MAX_QUERY_CACHE_SIZE, 256);

/**
 * Opens (creating when missing, mode 0600) the SQLite file at `path`, creating its parent directory
 * (0700), sets the connection pragmas and applies every migration not yet recorded in `schema_migrations`.
 * Throws when the file was migrated by a newer build (it holds versions this build does not know):
 * running old code against a newer schema could corrupt data.
 */
export function openDatabase(path: string, migrations: readonly string[] = defaultMigrations): Database {
  if (path !== ":memory:") {
    // 0700 folder, 0600 file: the WAL and shm files SQLite creates next to it take the file's mode.
    ensureDataDir(dirname(path));
    ensurePrivateFile(path);
  }
  const db = new Database(path, { create: true, strict: true });
  try {
    // busy_timeout first: switching to WAL takes a lock another process may hold.
    db.exec("PRAGMA busy_timeout = 5000");
    db.exec("PRAGMA journal_mode = WAL");
    // FULL: a committed ledger posting or key revocation survives power loss (docs/ledger.md).
    db.exec("PRAGMA synchronous = FULL");
    db.exec("PRAGMA foreign_keys = ON");
    // Statement journals of nested transactions (group commit uses SAVEPOINTs) stay in memory instead
    // of a temp file per transaction; durability of the database itself is unchanged.
    db.exec("PRAGMA temp_store = MEMORY");
    migrate(db, migrations);
  } catch (error) {
    db.close();
    throw error;
  }
  return db;
}

/** The highest migration version recorded, 0 for a fresh database. */
export function schemaVersion(db: Database): number {
  const row = db.query("SELECT MAX(version) AS v FROM schema_migrations").get() as { v: number | null };
  return row.v ?? 0;
}

function migrate(db: Database, migrations: readonly string[]): void {
  db.exec(
    "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL) STRICT",
  );
  const current = schemaVersion(db);
  if (current > migrations.length) {
    throw new Error(`database schema version ${current} is newer than this build supports (${migrations.length})`);
  }
  for (let version = current + 1; version <= migrations.length; version++) {
    const sql = migrations[version - 1]!;
    // IMMEDIATE takes the write lock up front, so two processes opening a fresh file at once
    // serialise here; the re-check inside makes the loser skip what the winner applied.
    db.transaction(() => {
      const done = db.query("SELECT 1 FROM schema_migrations WHERE version = ?").get(version);
      if (done !== null) return;
      db.exec("PRAGMA defer_foreign_keys = ON");
      db.exec(sql);
      db.query("INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)").run(version, Date.now());
    }).immediate();
  }
}
