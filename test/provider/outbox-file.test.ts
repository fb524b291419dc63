// The receipt outbox's file and expiry: the file is exactly the JSON array of the held entries (the
// format a previous runtime wrote and a restarted one reads), and expiry is exact although the
// outbox skips its scan until the earliest deadline.
import { afterAll, describe, expect, test } from "bun:test";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ReceiptOutbox } from "../../src/provider/outbox.ts";

const dir = await mkdtemp(join(tmpdir(), "provider-outbox-"));
afterAll(() => rm(dir, { recursive: true, force: true }));

describe("receipt outbox file", () => {
  test("holds JSON.stringify of the held entries, in age order, after every change", async () => {
    const file = join(dir, "format.json");
    const outbox = new ReceiptOutbox({ now: () => 1_000, file, deadlineMs: 300_000 });
    outbox.keep({ request_id: "r1", attempt_n: 0 }, "env.1", 1_000, null);
    outbox.keep({ request_id: "r2", attempt_n: 1 }, 'env "2" é', 1_500, {});
    outbox.keep({ request_id: "r1", attempt_n: 0 }, "env.1b", 2_000, null); // re-kept: now the youngest
    await outbox.saved();
    expect(await readFile(file, "utf8")).toBe(
      JSON.stringify([
        { request_id: "r2", attempt_n: 1, receipt: 'env "2" é', deadline_ms: 301_500 },
        { request_id: "r1", attempt_n: 0, receipt: "env.1b", deadline_ms: 302_000 },
      ]),
    );
    outbox.settled({ request_id: "r2", attempt_n: 1 }, "verified");
    await outbox.saved();
    expect(JSON.parse(await readFile(file, "utf8"))).toEqual([{ request_id: "r1", attempt_n: 0, receipt: "env.1b", deadline_ms: 302_000 }]);
  });

  test("a file written in the previous format loads", async () => {
    const file = join(dir, "previous.json");
    await Bun.write(file, JSON.stringify([{ request_id: "r9", attempt_n: 3, receipt: "env.9", deadline_ms: 10_000 }]));
    const outbox = await ReceiptOutbox.load({ file, now: () => 5_000 });
    expect(outbox.ids()).toEqual([{ request_id: "r9", attempt_n: 3 }]);
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
