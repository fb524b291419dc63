// Background WAL checkpoints (src/store/checkpoints.ts): the gateway's store copies committed WAL
// pages into the database file from a worker thread, so the committing (event-loop) thread never does.
import { afterEach, expect, test } from "bun:test";
import { statSync } from "node:fs";
import { openStore, type Store } from "../../src/store/index.ts";
import { tempDir } from "./temp-dir.ts";

const files = tempDir();
let store: Store | null = null;
afterEach(() => {
  store?.close();
  store = null;
});

const reservation = (request_id: string, account_id: string) => ({
  request_id,
  account_id,
  payer: "promotion" as const,
  day: "2026-11-22",
  tokens: 10,
  credits: 10,
});

test("committed pages reach the database file without a checkpoint on the writing connection", async () => {
  const path = files.path("gateway.db");
  store = openStore(path, { groupCommit: true });
  const { account_id } = store.createAccount({ tier: "free" });
  store.flushCommits();
  const before = statSync(path).size;
  // A few dozen WAL pages: far below SQLite's automatic threshold (1,000), so only a checkpoint from
  // elsewhere — the worker — can grow the main file.
  for (let i = 0; i < 50; i++) store.reserve(reservation(`req_${i}`, account_id));
  store.flushCommits();
  const deadline = Date.now() + 5000;
  while (statSync(path).size === before && Date.now() < deadline) await Bun.sleep(20);
  expect(statSync(path).size).toBeGreaterThan(before);
  expect(store.getReservation("req_49")?.state).toBe("held");
});
