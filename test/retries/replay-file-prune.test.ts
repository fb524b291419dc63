// The embedded replay file (src/store/replays.ts): the results of one event-loop turn are written
// together at its end (a read or close writes them first), a result past the replay window is never
// returned, and expired rows are deleted at most once per PRUNE_EVERY_MS instead of with every write.
import { afterEach, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Database } from "bun:sqlite";
import { openReplayFile, PRUNE_EVERY_MS } from "../../src/store/replays.ts";

const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

const WINDOW_MS = 10_000;
const result = (fingerprint: string) => ({ fingerprint, status: 200, headers: ["content-type", "application/json"], body: new TextEncoder().encode("{}").buffer as ArrayBuffer });

function file() {
  const dir = mkdtempSync(join(tmpdir(), "replay-prune-"));
  dirs.push(dir);
  let now = 1_000_000;
  const turns: (() => void)[] = [];
  const path = join(dir, "replays.db");
  const replays = openReplayFile(path, { now: () => now, windowMs: WINDOW_MS, endOfTurn: (run) => void turns.push(run) });
  const endTurn = () => {
    for (const run of turns.splice(0)) run();
  };
  return { replays, path, turns, endTurn, advance: (ms: number) => (now += ms) };
}

test("a result past the window is not replayed, pruned or not", async () => {
  const { replays, advance } = file();
  replays.finished(null, "a", result("a"));
  advance(WINDOW_MS - 1);
  expect((await replays.latest("a")) as unknown).toMatchObject({ state: "succeeded", fingerprint: "a" });
  advance(1);
  expect(await replays.latest("a")).toBeNull();
  replays.close();
});

test("expired rows are deleted at most once per PRUNE_EVERY_MS", async () => {
  const { replays, advance, endTurn } = file();
  const finished = (f: string) => {
    replays.finished(null, f, result(f));
    endTurn();
  };
  finished("a"); // t = 0: prunes (nothing to delete)
  advance(PRUNE_EVERY_MS / 2);
  finished("e"); // no prune yet
  advance(WINDOW_MS + 1 - PRUNE_EVERY_MS / 2);
  finished("b"); // prunes: "a" has expired, "e" not yet
  expect(replays.count()).toBe(2);
  advance(PRUNE_EVERY_MS / 2 + 99);
  // "e" has expired now: never returned, but kept until the next prune.
  expect(await replays.latest("e")).toBeNull();
  finished("c");
  expect(replays.count()).toBe(3);
  advance(PRUNE_EVERY_MS / 2 - 99);
  finished("d"); // PRUNE_EVERY_MS after the last prune: "e" goes
  expect(replays.count()).toBe(3);
  expect((await replays.latest("b")) as unknown).toMatchObject({ state: "succeeded" });
  replays.close();
});

test("one turn's results are written at its end, in one transaction; a read or close writes them first", async () => {
  const { replays, path, turns, endTurn } = file();
  replays.finished("k1", "a", result("a"));
  replays.finished(null, "b", result("b"));
  // One end-of-turn write for the whole turn.
  expect(turns).toHaveLength(1);
  const other = new Database(path, { readonly: true });
  const rows = () => (other.query("SELECT COUNT(*) AS n FROM replay_results").get() as { n: number }).n;
  expect(rows()).toBe(0);
  endTurn();
  expect(rows()).toBe(3); // k:k1, b:a, b:b
  // A failed run removes its body's entry; a read in the same turn already sees that.
  replays.finished(null, "b", null);
  expect(await replays.latest("b")).toBeNull();
  replays.finished(null, "c", result("c"));
  replays.close();
  expect(rows()).toBe(3); // k:k1, b:a, b:c
  other.close();
  endTurn(); // the scheduled write finds the file closed and does nothing
});
