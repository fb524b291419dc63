import { Database } from "bun:sqlite";
import { expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { openDatabase, schemaVersion } from "../../src/store/db.ts";
import { migrations } from "../../src/store/migrations.ts";
import { openStore } from "../../src/store/index.ts";
import { tempDir } from "./temp-dir.ts";

const tmp = tempDir();

test("opening creates the parent directory and applies every migration once", () => {
  const path = join(tmp.path("nested"), "deeper", "gateway.db");
  openDatabase(path).close();
  expect(existsSync(path)).toBe(true);

  // Reopening twice more must not re-apply anything.
  openDatabase(path).close();
  const db = openDatabase(path);
  const rows = db.query("SELECT version FROM schema_migrations ORDER BY version").all() as { version: number }[];
  expect(rows.map((r) => r.version)).toEqual(migrations.map((_, i) => i + 1));
  expect(schemaVersion(db)).toBe(migrations.length);
  db.close();
});

test("the connection runs in WAL mode with synchronous=FULL, a busy timeout and foreign keys", () => {
  const db = openDatabase(tmp.path("pragmas.db"));
  expect(db.query("PRAGMA journal_mode").get()).toEqual({ journal_mode: "wal" });
  expect(db.query("PRAGMA synchronous").get()).toEqual({ synchronous: 2 }); // 2 = FULL
  expect(db.query("PRAGMA busy_timeout").get()).toEqual({ timeout: 5000 });
  expect(db.query("PRAGMA foreign_keys").get()).toEqual({ foreign_keys: 1 });
  db.close();
});

test("a store's file is left in WAL mode", () => {
  const path = tmp.path("store-wal.db");
  openStore(path).close();
  const raw = new Database(path);
  expect(raw.query("PRAGMA journal_mode").get()).toEqual({ journal_mode: "wal" });
  raw.close();
});

test("a later migration appended to the list is applied on the next open, earlier ones are not re-run", () => {
  const path = tmp.path("append.db");
  openDatabase(path).close();
  const extended = [...migrations, "CREATE TABLE later_feature (id INTEGER PRIMARY KEY) STRICT;"];
  const db = openDatabase(path, extended);
  expect(schemaVersion(db)).toBe(extended.length);
  expect(db.query("SELECT name FROM sqlite_master WHERE name = 'later_feature'").get()).toEqual({
    name: "later_feature",
  });
  db.close();
});

test("a failing migration rolls back entirely and is not recorded", () => {
  const path = tmp.path("failing.db");
  openDatabase(path).close();
  const broken = [...migrations, "CREATE TABLE half_done (id INTEGER) STRICT; THIS IS NOT SQL;"];
  expect(() => openDatabase(path, broken)).toThrow();
  const db = openDatabase(path);
  expect(schemaVersion(db)).toBe(migrations.length);
  expect(db.query("SELECT name FROM sqlite_master WHERE name = 'half_done'").get()).toBeNull();
  db.close();
});

test("a database migrated by a newer build is refused", () => {
  const path = tmp.path("newer.db");
  openDatabase(path, [...migrations, "CREATE TABLE from_the_future (id INTEGER) STRICT;"]).close();
  expect(() => openDatabase(path)).toThrow(/newer than this build/);
});
