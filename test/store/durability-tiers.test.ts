// Durability tiers (docs/decisions.md): the request path's groups commit as a WAL append
// (synchronous=NORMAL), so a job leaves without waiting for an fsync; a group that moved money
// acknowledges (the `settled` frame) only once the WAL is synced off the event loop; every write
// outside a group still commits with synchronous=FULL.
import { afterEach, expect, test } from "bun:test";
import { Database } from "bun:sqlite";
import { writeFileSync } from "node:fs";
import { withGroupCommit } from "../../src/store/groupCommit.ts";
import { walSyncer, type SyncWal } from "../../src/store/walSync.ts";
import { openStore } from "../../src/store/index.ts";
import { tempDir } from "./temp-dir.ts";

const files = tempDir();
const cleanup: (() => void)[] = [];
afterEach(() => {
  for (const f of cleanup.splice(0)) f();
});

const SYNCHRONOUS = { NORMAL: 1, FULL: 2 } as const;

/** A store of two grouped writes over a scratch table — one that holds, one that moves money — and
 *  one write outside any group; the sync is scripted: each request waits until the test releases it. */
function scripted() {
  const db = new Database(files.path("tiers.db"), { create: true });
  db.exec("PRAGMA journal_mode = WAL");
  db.exec("PRAGMA synchronous = FULL");
  db.exec("CREATE TABLE t (what TEXT, level INTEGER)");
  cleanup.push(() => db.close());
  const level = () => (db.query("PRAGMA synchronous").get() as { synchronous: number }).synchronous;
  const write = (what: string) => db.query("INSERT INTO t VALUES (?, ?)").run(what, level());
  const pendingSyncs: ((ok: boolean) => void)[] = [];
  const syncWal: SyncWal = (done) => void pendingSyncs.push(done);
  const turns: (() => void)[] = [];
  const store = withGroupCommit(
    { reserve: () => write("reserve"), settleAttempt: () => write("settle"), createAccount: () => write("account"), authenticateApiKey: () => write("key") },
    db,
    { syncWal, schedule: (run) => void turns.push(run), scheduleLazy: () => {} },
  );
  const endTurn = () => {
    for (const run of turns.splice(0)) run();
  };
  const levels = () => db.query("SELECT what, level FROM t").all() as { what: string; level: number }[];
  return { store, pendingSyncs, endTurn, levels, level };
}

test("a job's group commits as a WAL append: its effect follows the COMMIT and asks for no sync", () => {
  const { store, pendingSyncs, endTurn, levels, level } = scripted();
  store.reserve();
  const sent: boolean[] = [];
  store.afterCommit((committed) => sent.push(committed));
  endTurn();
  expect(sent).toEqual([true]);
  expect(pendingSyncs).toHaveLength(0);
  expect(levels()).toEqual([{ what: "reserve", level: SYNCHRONOUS.NORMAL }]);
});

test("groups that follow each other switch the level once; the first write outside them switches it back", () => {
  const { store, endTurn, levels, level } = scripted();
  const switches: string[] = [];
  for (let i = 0; i < 3; i++) {
    store.reserve();
    store.afterCommit(() => {});
    endTurn();
    switches.push(level() === SYNCHRONOUS.NORMAL ? "normal" : "full");
  }
  // Between groups the connection stays at NORMAL: nothing outside a group wrote meanwhile.
  expect(switches).toEqual(["normal", "normal", "normal"]);
  store.createAccount();
  expect(level()).toBe(SYNCHRONOUS.FULL);
  expect(levels().map((r) => r.level)).toEqual([SYNCHRONOUS.NORMAL, SYNCHRONOUS.NORMAL, SYNCHRONOUS.NORMAL, SYNCHRONOUS.FULL]);
});

test("the key lookup writes inside an open group, and at FULL outside one", () => {
  const { store, endTurn, levels } = scripted();
  store.reserve();
  store.authenticateApiKey();
  store.afterCommit(() => {});
  endTurn();
  store.authenticateApiKey();
  expect(levels()).toEqual([
    { what: "reserve", level: SYNCHRONOUS.NORMAL },
    { what: "key", level: SYNCHRONOUS.NORMAL },
    { what: "key", level: SYNCHRONOUS.FULL },
  ]);
});

test("a group that moved money acknowledges only after the WAL sync; the job in it does not wait", () => {
  const { store, pendingSyncs, endTurn } = scripted();
  store.reserve();
  store.settleAttempt();
  const settled: boolean[] = [];
  const sent: boolean[] = [];
  store.afterLazyCommit((committed) => settled.push(committed));
  store.afterCommit((committed) => sent.push(committed));
  endTurn();
  expect(sent).toEqual([true]);
  expect(settled).toEqual([]);
  expect(pendingSyncs).toHaveLength(1);
  pendingSyncs.shift()!(true);
  expect(settled).toEqual([true]);
});

test("a failed sync withholds the acknowledgement (the provider re-sends its receipt)", () => {
  const { store, pendingSyncs, endTurn } = scripted();
  store.settleAttempt();
  const settled: boolean[] = [];
  store.afterLazyCommit((committed) => settled.push(committed));
  store.afterCommit(() => {});
  endTurn();
  pendingSyncs.shift()!(false);
  expect(settled).toEqual([false]);
});

test("while a sync is in flight, every later acknowledgement waits for a sync too", () => {
  const { store, pendingSyncs, endTurn } = scripted();
  store.settleAttempt();
  store.afterCommit(() => {});
  endTurn();
  expect(pendingSyncs).toHaveLength(1);
  // A later group without money, and an acknowledgement with no group open: neither may overtake.
  store.reserve();
  const later: boolean[] = [];
  store.afterLazyCommit((committed) => later.push(committed));
  store.afterCommit(() => {});
  endTurn();
  const outside: boolean[] = [];
  store.afterLazyCommit((committed) => outside.push(committed));
  expect(later).toEqual([]);
  expect(outside).toEqual([]);
  for (const done of pendingSyncs.splice(0)) done(true);
  expect(later).toEqual([true]);
  expect(outside).toEqual([true]);
  // Nothing in flight: an acknowledgement with no group open runs at once.
  const idle: boolean[] = [];
  store.afterLazyCommit((committed) => idle.push(committed));
  expect(idle).toEqual([true]);
});

test("writes outside a group commit with synchronous=FULL", () => {
  const { store, endTurn, levels } = scripted();
  store.reserve();
  store.afterCommit(() => {});
  endTurn();
  store.createAccount();
  expect(levels()).toEqual([
    { what: "reserve", level: SYNCHRONOUS.NORMAL },
    { what: "account", level: SYNCHRONOUS.FULL },
  ]);
});

test("the WAL syncer coalesces: a request made during a sync waits for the next one, which serves all waiting", () => {
  const path = files.path("wal");
  writeFileSync(path, "frames");
  const calls: ((error: Error | null) => void)[] = [];
  const syncer = walSyncer(path, ((_fd: number, callback: (error: Error | null) => void) => void calls.push(callback)) as never);
  cleanup.push(() => syncer.close());
  const done: string[] = [];
  syncer.sync((ok) => done.push(`a:${ok}`));
  syncer.sync((ok) => done.push(`b:${ok}`));
  syncer.sync((ok) => done.push(`c:${ok}`));
  expect(calls).toHaveLength(1);
  calls.shift()!(null);
  expect(done).toEqual(["a:true"]);
  // b and c share the second sync, started as the first ended.
  expect(calls).toHaveLength(1);
  calls.shift()!(new Error("EIO"));
  expect(done).toEqual(["a:true", "b:false", "c:false"]);
});

test("a real WAL file is synced before the acknowledgement; a missing one withholds it", async () => {
  for (const [walOf, expected] of [[(db: string) => `${db}-wal`, true], [(db: string) => `${db}-missing`, false]] as const) {
    const path = files.path("real.db");
    const db = new Database(path, { create: true });
    db.exec("PRAGMA journal_mode = WAL");
    db.exec("CREATE TABLE t (x)");
    const syncer = walSyncer(walOf(path));
    cleanup.push(() => (syncer.close(), db.close()));
    const store = withGroupCommit({ settleAttempt: () => db.run("INSERT INTO t VALUES (1)") }, db, { syncWal: syncer.sync });
    store.settleAttempt();
    const acknowledged = new Promise<boolean>((resolve) => store.afterLazyCommit(resolve));
    store.flushCommits();
    expect(await acknowledged).toBe(expected);
  }
});

test("the gateway's store (group commit on a file, WAL syncer wired) commits its groups", () => {
  const path = files.path("gateway.db");
  const store = openStore(path, { groupCommit: true });
  cleanup.push(() => store.close());
  const { account_id } = store.createAccount({ tier: "free" });
  store.reserve({ request_id: "req_t", account_id, payer: "promotion", day: "2026-11-27", tokens: 10, credits: 10 });
  store.flushCommits();
  expect(store.getReservation("req_t")?.state).toBe("held");
});
