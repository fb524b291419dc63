// `gateway backup --to FILE`: an online, consistent copy of the store — also while a gateway holds the
// database open and writes to it — that never overwrites an existing file.
import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { databasePath } from "../../src/compositionRoot.ts";
import { backupDatabase } from "../../src/store/backup.ts";
import { openStore } from "../../src/store/index.ts";
import { MAIN, startTestGateway, tempDir as harnessTempDir, type TestGateway } from "../support/harness.ts";
import { tempDir } from "./temp-dir.ts";

const files = tempDir();

const accountNames = (path: string) => {
  const store = openStore(path);
  try {
    return store.listAccounts().map((a) => a.name);
  } finally {
    store.close();
  }
};

describe("backupDatabase", () => {
  test("copies every account, including writes still in the WAL, into a file that opens as a store", () => {
    const source = files.path("gateway.db");
    const store = openStore(source);
    store.createAccount({ name: "alice", tier: "free" });
    store.createAccount({ name: "bob", tier: "paid" });
    const target = files.path("backup.db");
    // The source stays open: its writes sit in the WAL, not yet checkpointed into the main file.
    const result = backupDatabase(source, target);
    store.close();
    expect(result).toEqual({ ok: true, path: target, bytes: statSync(target).size });
    expect(accountNames(target).sort()).toEqual(["alice", "bob"]);
    expect(statSync(target).mode & 0o777).toBe(0o600);
    // No partial file is left beside it.
    expect(readdirSync(dirname(target)).filter((f) => f.includes(".partial-"))).toEqual([]);
  });

  test("refuses to overwrite an existing file and leaves it untouched", () => {
    const source = files.path("gateway.db");
    openStore(source).close();
    const target = files.path("existing.db");
    writeFileSync(target, "precious");
    const result = backupDatabase(source, target);
    expect(result).toMatchObject({ ok: false, code: "target_exists" });
    expect(readFileSync(target, "utf8")).toBe("precious");
  });

  test("reports a missing database or target directory as values", () => {
    expect(backupDatabase(files.path("absent.db"), files.path("x.db"))).toMatchObject({ ok: false, code: "no_database" });
    const source = files.path("gateway.db");
    openStore(source).close();
    expect(backupDatabase(source, join(files.path("no-such-dir"), "x.db"))).toMatchObject({ ok: false, code: "no_target_dir" });
  });
});

describe("gateway backup (CLI) against a running gateway", () => {
  let gw: TestGateway;
  const out = harnessTempDir("gw-backup-");
  afterAll(async () => {
    await gw?.close();
    rmSync(out, { recursive: true, force: true });
  });

  const backup = (...args: string[]) => Bun.spawn(["bun", MAIN, "backup", ...args, "--data-dir", gw.dataDir], { stdout: "pipe", stderr: "pipe" });

  test("copies the live database while the gateway keeps writing, prints {backup, bytes}, refuses to overwrite", async () => {
    gw = await startTestGateway();
    gw.gateway.store.createAccount({ name: "before-backup", tier: "paid" });
    const target = join(out, "gateway-backup.db");

    // The gateway keeps writing while the backup runs in another process.
    const proc = backup("--to", target);
    let written = 0;
    while (proc.exitCode === null) {
      gw.gateway.store.createAccount({ name: `during-${written++}`, tier: "free" });
      await Bun.sleep(1); // on purpose: a steady writer, about one account a millisecond, while the backup runs
    }
    expect(await proc.exited).toBe(0);
    const printed = JSON.parse(await new Response(proc.stdout).text());
    expect(printed).toEqual({ backup: target, bytes: statSync(target).size });
    expect(printed.bytes).toBeGreaterThan(0);

    // A consistent snapshot: the accounts from before, a prefix of the ones written meanwhile.
    const names = accountNames(target);
    expect(names).toContain("test");
    expect(names).toContain("before-backup");
    const during = names.filter((n) => n?.startsWith("during-")).map((n) => Number(n!.slice(7))).sort((a, b) => a - b);
    expect(during).toEqual([...during.keys()]);
    expect(during.length).toBeLessThanOrEqual(written);

    // The gateway still serves from its own file afterwards.
    expect((await fetch(`${gw.url}/healthz`)).status).toBe(200);
    expect(existsSync(databasePath(gw.dataDir))).toBe(true);

    // A second backup to the same name is refused, and the first copy stays as it was.
    const sizeBefore = statSync(target).size;
    const again = backup("--to", target);
    expect(await again.exited).toBe(1);
    expect(await new Response(again.stderr).text()).toContain("already exists");
    expect(statSync(target).size).toBe(sizeBefore);
  });

  test("--to is required (usage error, exit 64)", async () => {
    const proc = backup();
    expect(await proc.exited).toBe(64);
    expect(await new Response(proc.stderr).text()).toContain("usage: gateway backup --to FILE");
  });
});
