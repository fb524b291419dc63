// The store suite runs once per backend (docs/decisions.md, "One async store interface"): the embedded
// SQLite file and a private PostgreSQL (test/support/postgres.ts). A test written against `Backend`
// opens stores, reopens the same location (durability), and runs raw SQL past the store (the
// database's own guards). PostgreSQL tests are skipped, saying why, where it cannot run.

import { beforeAll, describe } from "bun:test";
import { Database } from "bun:sqlite";
import { SQL } from "bun";
import { asyncStore, type AsyncStore } from "../../src/store/asyncStore.ts";
import { openStore, type StoreOptions } from "../../src/store/index.ts";
import { openPostgresStore } from "../../src/store/postgres/index.ts";
import { postgresMissing, sharedPostgres } from "../support/postgres.ts";
import { tempDir } from "./temp-dir.ts";

export interface Backend {
  name: "sqlite" | "postgres";
  /** A new, empty place for a store: a file path or a database URL. */
  location(): Promise<string>;
  open(location: string, options?: StoreOptions): Promise<AsyncStore>;
  /** A fresh store at a new location. */
  fresh(options?: StoreOptions): Promise<{ store: AsyncStore; location: string }>;
  /** Runs one statement outside the store; rejects with the database's error. Returns rows. */
  exec(location: string, statement: string): Promise<Record<string, unknown>[]>;
  /** Runs several statements outside the store (one implicit transaction on PostgreSQL). */
  script(location: string, statements: string): Promise<void>;
  /** The boolean literal `true` in this dialect. */
  readonly TRUE: string;
}

const tmp = tempDir();

const sqlite: Backend = {
  name: "sqlite",
  location: async () => tmp.path("store.db"),
  open: async (location, options) => asyncStore(openStore(location, options)),
  async fresh(options) {
    const location = await this.location();
    return { store: await this.open(location, options), location };
  },
  async exec(location, statement) {
    const db = new Database(location);
    try {
      return db.query(statement).all() as Record<string, unknown>[];
    } finally {
      db.close();
    }
  },
  async script(location, statements) {
    const db = new Database(location);
    try {
      db.run(statements);
    } finally {
      db.close();
    }
  },
  TRUE: "1",
};

const postgres: Backend = {
  name: "postgres",
  location: async () => (await sharedPostgres()).freshDatabase(),
  open: (location, options) => openPostgresStore(location, { maxConnections: 4, ...options }),
  async fresh(options) {
    const location = await this.location();
    return { store: await this.open(location, options), location };
  },
  async exec(location, statement) {
    const sql = new SQL(location, { max: 1 });
    try {
      return [...((await sql.unsafe(statement)) as Record<string, unknown>[])];
    } finally {
      await sql.close();
    }
  },
  async script(location, statements) {
    const sql = new SQL(location, { max: 1 });
    try {
      await sql.unsafe(statements).simple();
    } finally {
      await sql.close();
    }
  },
  TRUE: "true",
};

export const backends: readonly { backend: Backend; skip: string | null }[] = [
  { backend: sqlite, skip: null },
  { backend: postgres, skip: postgresMissing },
];

/** Declares the enclosed tests once per backend, in a `describe` named after it. */
export function eachBackend(body: (backend: Backend) => void): void {
  for (const { backend, skip } of backends) {
    describe.skipIf(skip !== null)(`[${backend.name}]`, () => {
      // Starting the shared server (initdb, pg_ctl) takes seconds: not inside a test's own timeout.
      if (backend.name === "postgres") beforeAll(() => sharedPostgres().then(() => {}), 120_000);
      body(backend);
    });
  }
}
