// The receipt outbox on disk: a snapshot (the JSON array an earlier runtime wrote, which still loads)
// and a journal of the changes since it. A crash is simulated by copying the files as they are at that
// moment and loading the copy, the writer left running without a clean close. Also: expiry is exact
// although the outbox skips its scan until the earliest deadline.
import { afterAll, describe, expect, test } from "bun:test";
import { copyFile, mkdir, mkdtemp, readFile, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ReceiptOutbox } from "../../src/provider/outbox.ts";
import { JOURNAL_MIN_CHARS, journalFileOf, readOutboxFiles } from "../../src/provider/outboxJournal.ts";
import type { ReceiptFrame } from "../../src/wire/frames.ts";

const dir = await mkdtemp(join(tmpdir(), "provider-outbox-"));
afterAll(() => rm(dir, { recursive: true, force: true }));

let places = 0;
/** A fresh folder and the outbox file's path in it. */
async function place(): Promise<string> {
  const folder = join(dir, `p${places++}`);
  await mkdir(folder);
  return join(folder, "provider.receipts-outbox.json");
}

/** The files as a crash at this moment leaves them, copied to a fresh place. */
async function crashCopy(file: string): Promise<string> {
  const copy = await place();
  for (const [from, to] of [
    [file, copy],
    [journalFileOf(file), journalFileOf(copy)],
  ] as const) {
    await copyFile(from, to).catch((error: NodeJS.ErrnoException) => {
      if (error.code !== "ENOENT") throw error;
    });
  }
  return copy;
}

type Held = Array<[string, number, string]>;
/** What the outbox would send a new session, in order. */
function held(outbox: ReceiptOutbox): Held {
  const frames: ReceiptFrame[] = [];
  outbox.flush({}, (f) => (frames.push(f as ReceiptFrame), true));
  return frames.map((f) => [f.request_id, f.attempt_n, f.receipt]);
}

const T0 = 10_000;
const reloaded = async (file: string, now = T0) => held(await ReceiptOutbox.load({ file: await crashCopy(file), now: () => now, deadlineMs: 1_000 }));
const ids = (request_id: string, attempt_n = 0) => ({ request_id, attempt_n });
const nextTurn = () => new Promise<void>((resolve) => setImmediate(resolve));

describe("receipt outbox files", () => {
  test("the snapshot is JSON.stringify of the held entries, in age order; each change after it is one journal line", async () => {
    const file = await place();
    const outbox = await ReceiptOutbox.load({ file, now: () => 1_000, deadlineMs: 300_000 });
    outbox.keep(ids("r1"), "env.1", 1_000, null);
    outbox.keep(ids("r2", 1), 'env "2" é', 1_500, {});
    outbox.keep(ids("r1"), "env.1b", 2_000, null); // re-kept: now the youngest
    outbox.settled(ids("r2", 1), "pending"); // not final: no change
    outbox.settled(ids("r2", 1), "verified");
    await outbox.saved();
    expect(await readFile(file, "utf8")).toBe("[]");
    expect((await readFile(journalFileOf(file), "utf8")).split("\n")).toEqual([
      JSON.stringify({ request_id: "r1", attempt_n: 0, receipt: "env.1", deadline_ms: 301_000 }),
      JSON.stringify({ request_id: "r2", attempt_n: 1, receipt: 'env "2" é', deadline_ms: 301_500 }),
      JSON.stringify({ request_id: "r1", attempt_n: 0, receipt: "env.1b", deadline_ms: 302_000 }),
      JSON.stringify({ request_id: "r2", attempt_n: 1, removed: true }),
      "",
    ]);
    for (const f of [file, journalFileOf(file)]) expect((await stat(f)).mode & 0o777).toBe(0o600);

    // The next start compacts: the snapshot holds the state, the journal is empty.
    outbox.keep(ids("r3"), "env.3", 2_500, null);
    await outbox.saved();
    await ReceiptOutbox.load({ file, now: () => 1_000 });
    expect(await readFile(file, "utf8")).toBe(
      JSON.stringify([
        { request_id: "r1", attempt_n: 0, receipt: "env.1b", deadline_ms: 302_000 },
        { request_id: "r3", attempt_n: 0, receipt: "env.3", deadline_ms: 302_500 },
      ]),
    );
    expect(await readFile(journalFileOf(file), "utf8")).toBe("");
  });

  test("an outbox written in the previous format (the JSON array alone) loads, and is carried on", async () => {
    const file = await place();
    await writeFile(file, JSON.stringify([{ request_id: "r9", attempt_n: 3, receipt: "env.9", deadline_ms: 20_000 }]));
    const outbox = await ReceiptOutbox.load({ file, now: () => T0 });
    expect(held(outbox)).toEqual([["r9", 3, "env.9"]]);
    outbox.keep(ids("r10"), "env.10", T0, null);
    await outbox.saved();
    expect(await reloaded(file)).toEqual([
      ["r9", 3, "env.9"],
      ["r10", 0, "env.10"],
    ]);
  });

  test("a crash at any point loses no change that saved() confirmed, and an unconfirmed one is on disk or not (at worst a duplicate)", async () => {
    let now = T0;
    const file = await place();
    const outbox = await ReceiptOutbox.load({ file, now: () => now, deadlineMs: 1_000, maxEntries: 4 });
    const steps: Array<() => void> = [
      () => outbox.keep(ids("r1"), "env-1", T0, null),
      () => outbox.keep(ids("r2"), "env-2", T0, {}),
      () => outbox.keep(ids("r3", 2), "env-3", T0, null),
      () => outbox.settled(ids("r2"), "verified"),
      () => outbox.keep(ids("r1"), "env-1b", T0, null), // re-kept: the youngest
      () => outbox.keep(ids("late"), "env-late", T0 + 5_000, null),
      () => outbox.keep(ids("r4"), "env-4", T0, null),
      () => outbox.keep(ids("r5"), "env-5", T0, null), // five held: the oldest (r3) is dropped
      () => outbox.settled(ids("nobody"), "verified"), // not held: no change
      () => {
        now = T0 + 1_500; // every deadline but late's has passed
        void outbox.size;
      },
      () => outbox.settled(ids("late"), "quarantined"),
    ];
    let before = held(outbox);
    for (const step of steps) {
      step();
      const after = held(outbox);
      // Unconfirmed: no receipt invented, none lost that the change left alone (a change of several
      // lines, like a keep that drops the oldest, may be half on disk: a duplicate receipt at most).
      // Loaded at T0, before any deadline: an expiry must be in the files, not redone by the load.
      const crashed = await reloaded(file);
      const has = (state: Held, entry: Held[number]) => state.some((e) => e.join() === entry.join());
      expect(crashed.filter((e) => !has(before, e) && !has(after, e))).toEqual([]);
      expect(before.filter((e) => has(after, e) && !has(crashed, e))).toEqual([]);
      await outbox.saved();
      expect(await reloaded(file)).toEqual(after);
      before = after;
    }
    expect(before).toEqual([]);
  });

  test("a torn last line is skipped at every byte it can end on; the complete lines before it count", async () => {
    const file = await place();
    const first = await ReceiptOutbox.load({ file, now: () => T0 });
    first.keep(ids("s1"), "env-s1", T0, null);
    first.keep(ids("s2"), "env-s2", T0, null);
    await first.saved();
    const outbox = await ReceiptOutbox.load({ file, now: () => T0 }); // a restart: s1 and s2 in the snapshot
    const states: Array<{ end: number; held: Held }> = [{ end: 0, held: held(outbox) }];
    for (const step of [
      () => outbox.settled(ids("s1"), "verified"),
      () => outbox.keep(ids("j1", 1), "env-j1 \u00e9", T0, null),
      () => outbox.keep(ids("s2"), "env-s2b", T0, null),
      () => outbox.settled(ids("j1", 1), "zero_settled"),
      () => outbox.keep(ids("j2"), "env-j2", T0, null),
    ]) {
      step();
      await outbox.saved();
      states.push({ end: (await readFile(journalFileOf(file))).length, held: held(outbox) });
    }
    const snapshot = await readFile(file);
    const journal = await readFile(journalFileOf(file));
    const torn = await place();
    for (let cut = 0; cut <= journal.length; cut++) {
      await writeFile(torn, snapshot);
      await writeFile(journalFileOf(torn), journal.subarray(0, cut));
      const logs: string[] = [];
      const entries = await readOutboxFiles(torn, (event) => logs.push(event));
      // A line counts once its JSON is whole, with or without its newline.
      const expected = states.findLast((s) => s.end - 1 <= cut)!.held;
      expect(entries.map((e): [string, number, string] => [e.request_id, e.attempt_n, e.receipt])).toEqual(expected);
      const whole = states.some((s) => s.end === cut || s.end - 1 === cut);
      expect(logs).toEqual(whole ? [] : ["receipt_outbox_lines_skipped"]);
    }

    // Loaded for real, a torn tail (here: a power cut's zeros after half a line) is dropped by the
    // startup compaction, so the next line appended is not glued to it.
    await writeFile(torn, snapshot);
    await writeFile(journalFileOf(torn), Buffer.concat([journal.subarray(0, states[2]!.end + 7), Buffer.alloc(64)]));
    const logs: string[] = [];
    const restarted = await ReceiptOutbox.load({ file: torn, now: () => T0, log: (event) => logs.push(event) });
    expect(logs).toContain("receipt_outbox_lines_skipped");
    expect(held(restarted)).toEqual(states[2]!.held);
    restarted.keep(ids("after"), "env-after", T0, null);
    await restarted.saved();
    expect(await reloaded(torn)).toEqual([...states[2]!.held, ["after", 0, "env-after"]]);
  });

  test("one write and one fsync per batch: a turn's changes, and those made while the previous batch is written", async () => {
    const file = await place();
    const outbox = await ReceiptOutbox.load({ file, now: () => T0 });
    const start = { ...outbox.journalStats()! };
    expect(start.compactions).toBe(1); // the startup compaction
    for (let i = 0; i < 100; i++) outbox.keep(ids(`r${i}`), `env-${i}`, T0, null);
    for (let i = 0; i < 50; i++) outbox.settled(ids(`r${i}`), "verified");
    await outbox.saved();
    expect(outbox.journalStats()).toEqual({ appends: start.appends + 1, syncs: start.syncs + 1, compactions: 1 });

    outbox.keep(ids("a"), "env-a", T0, null);
    await nextTurn(); // the batch holding `a` is being written now
    for (const id of ["b", "c", "d"]) outbox.keep(ids(id), `env-${id}`, T0, null);
    await outbox.saved();
    expect(outbox.journalStats()).toEqual({ appends: start.appends + 3, syncs: start.syncs + 3, compactions: 1 });
    expect((await reloaded(file)).length).toBe(54);
  });

  test("a batch of removals only is written but not fsynced; the next kept receipt's fsync covers it", async () => {
    const file = await place();
    const outbox = await ReceiptOutbox.load({ file, now: () => T0 });
    for (const id of ["a", "b"]) outbox.keep(ids(id), `env-${id}`, T0, null);
    await outbox.saved();
    const start = { ...outbox.journalStats()! };

    outbox.settled(ids("a"), "verified");
    await outbox.saved();
    // Written (a restart reads it) without a sync of its own: lost in a power cut, it leaves `a`
    // held, re-sent once to a gateway that settled it already (a no-op there).
    expect(outbox.journalStats()).toEqual({ ...start, appends: start.appends + 1 });
    expect(await reloaded(file)).toEqual([["b", 0, "env-b"]]);

    outbox.settled(ids("b"), "verified");
    outbox.keep(ids("c"), "env-c", T0, null);
    await outbox.saved();
    expect(outbox.journalStats()).toEqual({ ...start, appends: start.appends + 2, syncs: start.syncs + 1 });
    expect(await reloaded(file)).toEqual([["c", 0, "env-c"]]);
  });

  test("the journal is compacted once it outgrows the live entries, and a crash on either side of that loses nothing", async () => {
    const file = await place();
    const outbox = await ReceiptOutbox.load({ file, now: () => T0 });
    const big = "e".repeat(40_000);
    // One entry held at a time, so the journal grows by two lines a step and the state stays small.
    const steps = Math.ceil(JOURNAL_MIN_CHARS / big.length) + 4;
    for (let i = 0; i < steps; i++) {
      outbox.keep(ids(`r${i}`), `${big}${i}`, T0, null);
      if (i > 0) outbox.settled(ids(`r${i - 1}`), "verified");
      await outbox.saved();
      expect(await reloaded(file)).toEqual([[`r${i}`, 0, `${big}${i}`]]);
    }
    expect(outbox.journalStats()!.compactions).toBe(2); // at startup, then once over the bound
    expect((await stat(journalFileOf(file))).size).toBeLessThan(JOURNAL_MIN_CHARS);
  });

  test("a crash mid-compaction: before the rename the old files load, after it the new snapshot with the old journal", async () => {
    const file = await place();
    const first = await ReceiptOutbox.load({ file, now: () => T0 });
    first.keep(ids("a"), "env-a", T0, null);
    first.keep(ids("b"), "env-b", T0, null);
    await first.saved();
    const outbox = await ReceiptOutbox.load({ file, now: () => T0 }); // snapshot [a, b]
    outbox.settled(ids("a"), "verified");
    outbox.keep(ids("c"), "env-c", T0, null);
    outbox.keep(ids("b"), "env-b2", T0, null);
    outbox.keep(ids("a"), "env-a2", T0, null); // back after its removal
    await outbox.saved();
    const state = held(outbox);
    expect(state).toEqual([
      ["c", 0, "env-c"],
      ["b", 0, "env-b2"],
      ["a", 0, "env-a2"],
    ]);

    // The temp file written, not yet renamed: it is not read.
    const beforeRename = await crashCopy(file);
    await writeFile(`${beforeRename}.4242.tmp`, '[{"request_id":"half');
    expect(await reloaded(beforeRename)).toEqual(state);

    // Renamed, the journal not yet emptied: replaying it over the snapshot it went into changes nothing.
    const afterRename = await crashCopy(file);
    await ReceiptOutbox.load({ file: afterRename, now: () => T0 }); // writes that snapshot
    await copyFile(journalFileOf(file), journalFileOf(afterRename));
    expect((await readFile(journalFileOf(afterRename), "utf8")).split("\n")).toHaveLength(5);
    expect(await reloaded(afterRename)).toEqual(state);
  });

  test("a failed write is retried as a compaction by the next change", async () => {
    const file = await place();
    await mkdir(journalFileOf(file)); // the journal cannot be opened
    const logs: string[] = [];
    const outbox = await ReceiptOutbox.load({ file, now: () => T0, log: (event) => logs.push(event) });
    outbox.keep(ids("r1"), "env-1", T0, null);
    await outbox.saved();
    expect(logs).toEqual(["receipt_outbox_unreadable", "receipt_outbox_write_failed", "receipt_outbox_write_failed"]);
    await rm(journalFileOf(file), { recursive: true });
    outbox.keep(ids("r2"), "env-2", T0, null);
    await outbox.saved();
    expect(await reloaded(file)).toEqual([
      ["r1", 0, "env-1"],
      ["r2", 0, "env-2"],
    ]);
  });

  test("expired entries are not restored, whether or not their removal reached the files", async () => {
    let now = T0;
    const file = await place();
    const outbox = await ReceiptOutbox.load({ file, now: () => now, deadlineMs: 1_000 });
    outbox.keep(ids("old"), "env-old", T0 - 500, null); // deadline T0 + 500
    outbox.keep(ids("new"), "env-new", T0, null); // deadline T0 + 1_000
    await outbox.saved();
    expect(await reloaded(file, T0 + 600)).toEqual([["new", 0, "env-new"]]);
    now = T0 + 600;
    expect(outbox.size).toBe(1);
    await outbox.saved();
    expect(await reloaded(file, T0)).toEqual([["new", 0, "env-new"]]);
  });

  test("each entry expires at its own deadline, whatever the order it was kept in", () => {
    let now = 0;
    const expired: string[] = [];
    const outbox = new ReceiptOutbox({ now: () => now, deadlineMs: 1_000, log: (event, fields) => event === "receipt_expired" && expired.push(String(fields.request_id)) });
    outbox.keep({ request_id: "late", attempt_n: 0 }, "e", 3_000, null); // deadline 4_000
    outbox.keep({ request_id: "early", attempt_n: 0 }, "e", 1_000, null); // deadline 2_000
    outbox.keep({ request_id: "mid", attempt_n: 0 }, "e", 2_000, null); // deadline 3_000
    now = 2_000;
    expect(outbox.size).toBe(3); // a deadline is still inside the window
    now = 2_001;
    expect(outbox.ids().map((i) => i.request_id)).toEqual(["late", "mid"]);
    now = 3_001;
    expect(outbox.ids().map((i) => i.request_id)).toEqual(["late"]);
    outbox.keep({ request_id: "soon", attempt_n: 0 }, "e", 2_500, null); // deadline 3_500
    now = 3_600;
    expect(outbox.ids().map((i) => i.request_id)).toEqual(["late"]);
    now = 4_001;
    expect(outbox.size).toBe(0);
    expect(expired).toEqual(["early", "mid", "soon", "late"]);
  });
});
