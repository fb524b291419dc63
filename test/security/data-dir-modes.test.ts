// The data folder holds the HMAC secret and key hashes: 0700, every file 0600 (WAL and shm included),
// and a startup warning for an existing folder or file with looser modes.
import { afterEach, expect, test } from "bun:test";
import { chmodSync, existsSync, mkdirSync, rmSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { loadConfig } from "../../src/config/index.ts";
import { createLog } from "../../src/log.ts";
import { startGateway } from "../../src/compositionRoot.ts";
import { openStore } from "../../src/store/index.ts";
import { catalogModel, tempDir } from "../support/harness.ts";

const roots: string[] = [];
afterEach(() => {
  for (const root of roots.splice(0)) rmSync(root, { recursive: true, force: true });
});

const modeOf = (path: string) => (statSync(path).mode & 0o777).toString(8);

function config(dataDir: string) {
  const loaded = loadConfig([], {});
  if (!loaded.ok) throw new Error(loaded.message);
  return { ...loaded.config, port: 0, dataDir };
}

test("a fresh data folder is 0700 and the database, its WAL and shm, keys and catalog files are 0600", async () => {
  const root = tempDir("gw-modes-");
  roots.push(root);
  chmodSync(root, 0o755);
  const dataDir = join(root, "nested", "data");
  const lines: string[] = [];
  const gateway = await startGateway(config(dataDir), { log: createLog("info", (l) => lines.push(l)), catalogModels: [catalogModel("m")] });
  try {
    await gateway.store.createAccount({ name: "a", tier: "free" }); // a write, so the WAL exists
    gateway.store.flushCommits();
    expect(modeOf(dataDir)).toBe("700");
    const files = ["gateway.db", "gateway.db-wal", "gateway.db-shm", "catalog-operator.key", "catalog.json", "catalog.json.sig"];
    for (const file of files) {
      const path = join(dataDir, file);
      expect({ file, exists: existsSync(path) }).toEqual({ file, exists: true });
      expect({ file, mode: modeOf(path) }).toEqual({ file, mode: "600" });
    }
    expect(lines.filter((l) => l.includes("data_dir_mode_loose"))).toEqual([]);
  } finally {
    await gateway.stop();
  }
});

test("operator commands create the folder and database private too", async () => {
  const root = tempDir("gw-modes-");
  roots.push(root);
  const dataDir = join(root, "data");
  const store = openStore(join(dataDir, "gateway.db"));
  await store.createAccount({ name: "a", tier: "free" });
  await store.close();
  expect(modeOf(dataDir)).toBe("700");
  expect(modeOf(join(dataDir, "gateway.db"))).toBe("600");
});

test("an existing folder or file with looser modes gets one warning each at startup, and is left as it is", async () => {
  const root = tempDir("gw-modes-");
  roots.push(root);
  const dataDir = join(root, "data");
  mkdirSync(dataDir, { mode: 0o755 });
  chmodSync(dataDir, 0o755);
  writeFileSync(join(dataDir, "gateway.db"), "");
  chmodSync(join(dataDir, "gateway.db"), 0o644);
  const lines: string[] = [];
  const gateway = await startGateway(config(dataDir), { log: createLog("info", (l) => lines.push(l)) });
  try {
    const warnings = lines.map((l) => JSON.parse(l)).filter((l) => l.event === "data_dir_mode_loose");
    expect(warnings).toEqual([
      expect.objectContaining({ level: "warn", path: dataDir, mode: "0755", expected: "0700", hint: `chmod 700 ${dataDir}` }),
      expect.objectContaining({ level: "warn", path: join(dataDir, "gateway.db"), mode: "0644", expected: "0600" }),
    ]);
    expect(modeOf(dataDir)).toBe("755");
  } finally {
    await gateway.stop();
  }
});
