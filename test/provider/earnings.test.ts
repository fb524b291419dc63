// `settled` frames go to a local earnings log beside the key file (JSON lines, mode 0600, ids and
// credits only), and `gateway provider earnings` totals it by label with the quarantine reasons.
import { afterAll, describe, expect, test } from "bun:test";
import { chmod, mkdtemp, readFile, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { runProviderCommand, type CommandIo } from "../../src/provider/cli.ts";
import { createEarningsLog, summarizeEarnings, type EarningRecord } from "../../src/provider/earnings.ts";
import type { SettledFrame } from "../../src/wire/frames.ts";
import { makeJob, startFakeGateway, withTimeout } from "./fake-gateway.ts";

const HASH = "ef".repeat(32);
const dir = await mkdtemp(join(tmpdir(), "provider-earnings-"));
afterAll(() => rm(dir, { recursive: true, force: true }));

function capture(until?: Promise<unknown>) {
  const out: string[] = [];
  const err: string[] = [];
  const io: CommandIo = { stdout: (l) => out.push(l), stderr: (l) => err.push(l), until };
  return { io, out, err };
}

const settled = (request_id: string, label: SettledFrame["label"], reason: string | null, provider_credits: number): SettledFrame => ({
  type: "settled",
  request_id,
  attempt_n: 0,
  label,
  reason,
  provider_credits,
});

describe("earnings log", () => {
  test("a running provider appends every settled frame beside its key file; `earnings` totals them", async () => {
    const keyDir = join(dir, "run");
    const keyFile = join(keyDir, "provider.pem");
    const gateway = startFakeGateway({ heartbeatIntervalMs: 60_000 });
    let finish!: () => void;
    const run = capture(new Promise<void>((resolve) => (finish = resolve)));
    let allSettled!: () => void;
    const sevenSettled = new Promise<void>((resolve) => (allSettled = resolve));
    const print = run.io.stdout;
    run.io.stdout = (line) => {
      print(line);
      if (run.out.filter((l) => JSON.parse(l).event === "settled").length === 7) allSettled();
    };
    const exit = runProviderCommand(
      ["--gateway", gateway.url, "--id", "prov-earn", "--key-file", keyFile, "--engine", "synthetic", "--model", `m=${HASH}`],
      run.io,
    );
    try {
      const session = await gateway.session(0);
      await session.welcomed;
      // A job with a secret prompt: nothing of it may reach the earnings log.
      session.send(makeJob({ request_id: "r1", model_id: "m", messages: [{ role: "user", content: "secret words" }] }));
      await session.take((f) => f.type === "end");
      session.send(settled("r1", "verified", null, 900));
      session.send(settled("r2", "quarantined", "output_mismatch", 0));
      session.send(settled("r3", "quarantined", "no_receipt", 0));
      session.send(settled("r4", "zero_settled", "nothing_delivered", 0));
      session.send(settled("r5", "pending", null, 0));
      session.send(settled("r5", "verified", null, 45));
      session.send(settled("r1", "verified", null, 900)); // a repeat must not count twice
      await withTimeout(sevenSettled, 2000, "seven settled frames");
    } finally {
      finish();
      await exit; // the runtime flushes the earnings log before the command returns
      await gateway.stop();
    }

    const file = join(keyDir, "earnings.jsonl");
    expect((await stat(file)).mode & 0o777).toBe(0o600);
    const text = await readFile(file, "utf8");
    expect(text).not.toContain("secret");
    const lines = text.trim().split("\n").map((l) => JSON.parse(l) as EarningRecord);
    expect(lines).toHaveLength(7);
    expect(Object.keys(lines[0]!).sort()).toEqual(["attempt_n", "label", "provider_credits", "provider_id", "reason", "request_id", "ts"]);
    expect(lines[1]).toMatchObject({ provider_id: "prov-earn", request_id: "r2", label: "quarantined", reason: "output_mismatch" });

    const json = capture();
    expect(await runProviderCommand(["earnings", "--key-file", keyFile, "--json"], json.io)).toBe(0);
    expect(json.out).toHaveLength(1);
    expect(JSON.parse(json.out[0]!)).toEqual({
      earnings_file: file,
      attempts: 5,
      provider_credits: 945,
      by_label: {
        verified: { attempts: 2, provider_credits: 945 },
        quarantined: { attempts: 2, provider_credits: 0 },
        zero_settled: { attempts: 1, provider_credits: 0 },
        pending: { attempts: 0, provider_credits: 0 },
      },
      quarantine_reasons: { output_mismatch: 1, no_receipt: 1 },
      zero_settled_reasons: { nothing_delivered: 1 },
    });

    const human = capture();
    expect(await runProviderCommand(["earnings", "--key-file", keyFile], human.io)).toBe(0);
    const printed = human.out.join("\n");
    expect(printed).toContain("provider credits: 945");
    expect(printed).toContain("quarantine reasons:");
    expect(printed).toMatch(/output_mismatch\s+1/);
  });

  test("no log yet: zero totals; a torn line is skipped with a warning; a loose mode is reported", async () => {
    const keyFile = join(dir, "empty", "provider.pem");
    const none = capture();
    expect(await runProviderCommand(["earnings", "--key-file", keyFile, "--json"], none.io)).toBe(0);
    expect(JSON.parse(none.out[0]!)).toMatchObject({ attempts: 0, provider_credits: 0 });

    const file = join(dir, "torn", "earnings.jsonl");
    await Bun.write(file, `${JSON.stringify({ ts: "t", provider_id: "p", request_id: "a", attempt_n: 0, label: "verified", reason: null, provider_credits: 7 })}\n{"ts":"t","req`);
    await chmod(file, 0o644);
    const torn = capture();
    expect(await runProviderCommand(["earnings", "--key-file", join(dir, "torn", "provider.pem"), "--json"], torn.io)).toBe(0);
    expect(JSON.parse(torn.out[0]!)).toMatchObject({ attempts: 1, provider_credits: 7 });
    expect(torn.err.join("\n")).toContain("1 unreadable line");
    expect(torn.err.join("\n")).toContain("readable by group or others");
  });

  test("missing --key-file is a usage error", async () => {
    const { io, err } = capture();
    expect(await runProviderCommand(["earnings", "--json"], io)).toBe(64);
    expect(err[0]).toContain("--key-file is required");
  });

  test("appends are serialised and the file is created 0600", async () => {
    const file = join(dir, "direct.jsonl");
    const log = createEarningsLog({ file, providerId: "p", now: () => Date.UTC(2026, 0, 2) });
    await Promise.all(Array.from({ length: 20 }, (_, i) => log.append(settled(`r${i}`, "verified", null, i))));
    const lines = (await readFile(file, "utf8")).trim().split("\n").map((l) => JSON.parse(l) as EarningRecord);
    expect(lines.map((l) => l.request_id)).toEqual(Array.from({ length: 20 }, (_, i) => `r${i}`));
    expect(lines[0]!.ts).toBe("2026-01-02T00:00:00.000Z");
    expect((await stat(file)).mode & 0o777).toBe(0o600);
    expect(summarizeEarnings(lines).provider_credits).toBe(190);
  });

  test("an existing earnings file readable by others is reported once when appending", async () => {
    const file = join(dir, "loose.jsonl");
    await writeFile(file, "", { mode: 0o644 });
    await chmod(file, 0o644);
    const events: string[] = [];
    const log = createEarningsLog({ file, providerId: "p", log: (e) => events.push(e) });
    await log.append(settled("a", "verified", null, 1));
    await log.append(settled("b", "verified", null, 1));
    expect(events).toEqual(["earnings_file_insecure_mode"]);
  });
});
