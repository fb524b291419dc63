// Group commit (src/store/groupCommit.ts): the request path's ledger writes of one event-loop turn
// share one transaction, and nothing that depends on them happens before it is durable; every other
// store call commits the open group first; a key revoked by another process stops working at once.
import { afterEach, expect, spyOn, test } from "bun:test";
import { Database } from "bun:sqlite";
import { openStore, type Store } from "../../src/store/index.ts";
import { LAZY_COMMIT_MS } from "../../src/store/groupCommit.ts";
import { tempDir } from "./temp-dir.ts";

const files = tempDir();
const cleanup: (() => void)[] = [];
afterEach(() => {
  for (const f of cleanup.splice(0)) f();
});

/** The store's lazy commits, run when the test says time has passed (LAZY_COMMIT_MS). */
function lazyTimers() {
  const due: (() => void)[] = [];
  return {
    timer: (run: () => void) => void due.push(run),
    /** LAZY_COMMIT_MS pass: every lazy commit scheduled so far runs. */
    elapse: () => {
      for (const run of due.splice(0)) run();
    },
  };
}

function open(): { store: Store; path: string; lazy: ReturnType<typeof lazyTimers> } {
  const path = files.path("gateway.db");
  const lazy = lazyTimers();
  const store = openStore(path, { groupCommit: true, lazyCommitTimer: lazy.timer });
  cleanup.push(() => store.close());
  return { store, path, lazy };
}

/** What another connection (another process) sees: only committed rows. */
function committedReservations(path: string): string[] {
  const other = new Database(path, { readonly: true });
  try {
    return (other.query("SELECT request_id FROM reservations ORDER BY request_id").all() as { request_id: string }[]).map((r) => r.request_id);
  } finally {
    other.close();
  }
}

const reservation = (request_id: string, account_id: string) => ({
  request_id,
  account_id,
  payer: "promotion" as const,
  day: "2026-11-22",
  tokens: 10,
  credits: 10,
});

test("writes of one turn commit together at the end of the turn; their effect waits for the commit", async () => {
  const { store, path } = open();
  const { account_id } = store.createAccount({ tier: "free" });
  expect(store.reserve(reservation("req_a", account_id)).ok).toBe(true);
  expect(store.reserve(reservation("req_b", account_id)).ok).toBe(true);
  const effects: boolean[] = [];
  store.afterCommit((committed) => effects.push(committed));
  // Not durable yet: another connection sees nothing, and the effect has not run.
  expect(committedReservations(path)).toEqual([]);
  expect(effects).toEqual([]);
  // This connection reads its own writes.
  expect(store.getReservation("req_a")?.state).toBe("held");
  await new Promise((r) => setImmediate(r));
  expect(effects).toEqual([true]);
  expect(committedReservations(path)).toEqual(["req_a", "req_b"]);
});

test("with no write waiting, an effect runs at once", () => {
  const { store } = open();
  const effects: boolean[] = [];
  store.afterCommit((committed) => effects.push(committed));
  expect(effects).toEqual([true]);
});

test("a group no effect waits for stays open for the next turns' writes, at most LAZY_COMMIT_MS", async () => {
  const { store, path, lazy } = open();
  const { account_id } = store.createAccount({ tier: "free" });
  store.reserve(reservation("req_l1", account_id));
  await new Promise((r) => setImmediate(r));
  // No effect waited: the turn ended without a commit (no fsync on this turn's path).
  expect(committedReservations(path)).toEqual([]);
  // A later turn's write joins the same group; its effect commits both at the end of that turn.
  store.reserve(reservation("req_l2", account_id));
  const effects: boolean[] = [];
  store.afterCommit((committed) => effects.push(committed));
  expect(effects).toEqual([]);
  await new Promise((r) => setImmediate(r));
  expect(effects).toEqual([true]);
  expect(committedReservations(path)).toEqual(["req_l1", "req_l2"]);
  // A lone write with no effect is still committed within LAZY_COMMIT_MS.
  store.reserve(reservation("req_l3", account_id));
  await new Promise((r) => setImmediate(r));
  expect(committedReservations(path)).toEqual(["req_l1", "req_l2"]);
  lazy.elapse();
  expect(committedReservations(path)).toEqual(["req_l1", "req_l2", "req_l3"]);
});

test("a lazy effect asks for no commit: it runs with the group's next commit, urgent or lazy", async () => {
  const { store, path, lazy: timers } = open();
  const { account_id } = store.createAccount({ tier: "free" });
  const lazy: boolean[] = [];
  // No group open: at once, like afterCommit.
  store.afterLazyCommit((committed) => lazy.push(committed));
  expect(lazy).toEqual([true]);
  // A write and a lazy effect: the turn ends without a commit, the effect still waits.
  store.reserve(reservation("req_z1", account_id));
  store.afterLazyCommit((committed) => lazy.push(committed));
  await new Promise((r) => setImmediate(r));
  expect(lazy).toEqual([true]);
  expect(committedReservations(path)).toEqual([]);
  // A later urgent effect commits the group: both effects run.
  store.reserve(reservation("req_z2", account_id));
  const urgent: boolean[] = [];
  store.afterCommit((committed) => urgent.push(committed));
  await new Promise((r) => setImmediate(r));
  expect(lazy).toEqual([true, true]);
  expect(urgent).toEqual([true]);
  expect(committedReservations(path)).toEqual(["req_z1", "req_z2"]);
  // With no urgent effect after it, the lazy commit runs it within LAZY_COMMIT_MS.
  store.reserve(reservation("req_z3", account_id));
  store.afterLazyCommit((committed) => lazy.push(committed));
  await new Promise((r) => setImmediate(r));
  expect(lazy).toEqual([true, true]);
  timers.elapse();
  expect(lazy).toEqual([true, true, true]);
  expect(committedReservations(path)).toEqual(["req_z1", "req_z2", "req_z3"]);
});

test("by default a group's lazy commit is scheduled LAZY_COMMIT_MS after it opens", () => {
  const path = files.path("gateway.db");
  const store = openStore(path, { groupCommit: true });
  cleanup.push(() => store.close());
  const { account_id } = store.createAccount({ tier: "free" });
  const timers = spyOn(globalThis, "setTimeout");
  try {
    store.reserve(reservation("req_d1", account_id));
    expect(timers.mock.calls.map((call) => call[1])).toEqual([LAZY_COMMIT_MS]);
  } finally {
    timers.mockRestore();
  }
});

test("any other store call commits the open group first", () => {
  const { store, path } = open();
  const { account_id } = store.createAccount({ tier: "free" });
  store.reserve(reservation("req_c", account_id));
  const effects: boolean[] = [];
  store.afterCommit((committed) => effects.push(committed));
  store.listAccounts();
  expect(effects).toEqual([true]);
  expect(committedReservations(path)).toEqual(["req_c"]);
});

test("a key revoked by another process stops authenticating at once (no cache window)", () => {
  const { store, path } = open();
  const { account_id } = store.createAccount({ tier: "free" });
  const { key_id, api_key } = store.createApiKey({ account_id });
  expect(store.authenticateApiKey(api_key)?.account_id).toBe(account_id);
  expect(store.authenticateApiKey(api_key)?.account_id).toBe(account_id); // cached now
  const cli = openStore(path);
  expect(cli.revokeApiKey(key_id)).toBe(true);
  cli.close();
  expect(store.authenticateApiKey(api_key)).toBeNull();
});

test("a failed COMMIT rolls the group back and calls onCommitFailed before any waiting effect hears false", async () => {
  const path = files.path("gateway.db");
  const heard: string[] = [];
  let fail = false;
  const store = openStore(path, {
    groupCommit: true,
    lazyCommitTimer: () => {},
    commitFails: () => fail,
    onCommitFailed: () => heard.push("failed"),
  });
  cleanup.push(() => store.close());
  const { account_id } = store.createAccount({ tier: "free" });
  expect(store.reserve(reservation("req_lost", account_id)).ok).toBe(true);
  store.afterCommit((committed) => heard.push(`effect ${committed}`));
  fail = true;
  await new Promise((r) => setImmediate(r));
  expect(heard).toEqual(["failed", "effect false"]);
  expect(committedReservations(path)).toEqual([]);
  fail = false;
  expect(store.getReservation("req_lost")).toBeNull();
});
