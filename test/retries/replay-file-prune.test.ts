// The embedded replay file (src/store/replays.ts): a result past the replay window is never returned,
// and expired rows are deleted at most once per PRUNE_EVERY_MS instead of with every write.
import { afterEach, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
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
  const replays = openReplayFile(join(dir, "replays.db"), { now: () => now, windowMs: WINDOW_MS });
  return { replays, advance: (ms: number) => (now += ms) };
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
  const { replays, advance } = file();
  replays.finished(null, "a", result("a")); // t = 0: prunes (nothing to delete)
  advance(PRUNE_EVERY_MS / 2);
  replays.finished(null, "e", result("e")); // no prune yet
  advance(WINDOW_MS + 1 - PRUNE_EVERY_MS / 2);
  replays.finished(null, "b", result("b")); // prunes: "a" has expired, "e" not yet
  expect(replays.count()).toBe(2);
  advance(PRUNE_EVERY_MS / 2 + 99);
  // "e" has expired now: never returned, but kept until the next prune.
  expect(await replays.latest("e")).toBeNull();
  replays.finished(null, "c", result("c"));
  expect(replays.count()).toBe(3);
  advance(PRUNE_EVERY_MS / 2 - 99);
  replays.finished(null, "d", result("d")); // PRUNE_EVERY_MS after the last prune: "e" goes
  expect(replays.count()).toBe(3);
  expect((await replays.latest("b")) as unknown).toMatchObject({ state: "succeeded" });
  replays.close();
});
