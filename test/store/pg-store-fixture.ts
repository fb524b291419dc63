// A PostgreSQL store on a fresh database of the shared test server (test/support/postgres.ts), with
// credits granted to acct_1, and a side connection for the plain SQL a test checks the rows with.
import { SQL } from "bun";
import type { AsyncStore } from "../../src/store/asyncStore.ts";
import { openPostgresStore } from "../../src/store/postgres/index.ts";
import { sharedPostgres } from "../support/postgres.ts";

export interface PgStoreFixture {
  url: string;
  store: AsyncStore;
  side: SQL;
  close(): Promise<void>;
}

export async function pgStoreWithSide(credits: number): Promise<PgStoreFixture> {
  const url = await (await sharedPostgres()).freshDatabase();
  const store = await openPostgresStore(url, { maxConnections: 4, now: () => 1_000 });
  const side = new SQL(url, { max: 1 });
  await store.grantCredits("acct_1", credits);
  return {
    url,
    store,
    side,
    close: async () => {
      await side.close();
      await store.close();
    },
  };
}
