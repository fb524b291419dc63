// Holds a PostgreSQL table lock from a connection of its own until released: writes to the table wait
// inside the server (a write in flight that a test can order other statements around).
import { SQL } from "bun";

export interface TableLock {
  /** Lets the waiting writes go on; resolves once the lock's transaction ended. */
  release(): Promise<void>;
}

/** Takes `LOCK TABLE <table> IN SHARE MODE` (inserts and updates wait; reads do not) and holds it. */
export async function holdShareLock(url: string, table: string): Promise<TableLock> {
  const sql = new SQL(url, { max: 1 });
  const held = Promise.withResolvers<void>();
  const taken = Promise.withResolvers<void>();
  const locking = sql.begin(async (tx) => {
    await tx.unsafe(`LOCK TABLE ${table} IN SHARE MODE`);
    taken.resolve();
    await held.promise;
  });
  locking.catch(taken.reject);
  await taken.promise;
  return {
    async release() {
      held.resolve();
      await locking;
      await sql.close();
    },
  };
}
