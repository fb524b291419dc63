// deploy/gateway.service: systemd accepts it (systemd-analyze verify, where installed), its ExecStart is
// a valid `gateway serve` command line, and it keeps the data folder private.
import { afterAll, expect, test } from "bun:test";
import { chmodSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { loadConfig } from "../../src/config/index.ts";
import { tempDir } from "../support/harness.ts";

const unit = readFileSync(join(import.meta.dir, "../../deploy/gateway.service"), "utf8");
const dir = tempDir("gw-unit-");
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const hasSystemdAnalyze = Bun.which("systemd-analyze") !== null;
if (!hasSystemdAnalyze) console.warn("SKIPPED: systemd-analyze verify of deploy/gateway.service — systemd-analyze is not installed here");

test.skipIf(!hasSystemdAnalyze)("systemd-analyze verify accepts the unit", () => {
  // verify also checks that ExecStart's program exists: a stand-in stands where the binary would be.
  const binary = join(dir, "gateway");
  writeFileSync(binary, "#!/bin/sh\n");
  chmodSync(binary, 0o755);
  const path = join(dir, "gateway.service");
  writeFileSync(path, unit.replaceAll("/usr/local/bin/gateway", binary));
  const result = Bun.spawnSync(["systemd-analyze", "verify", path]);
  expect({ code: result.exitCode, stderr: result.stderr.toString() }).toEqual({ code: 0, stderr: "" });
});

test("ExecStart is a `gateway serve` command line the gateway accepts, on a private data folder", () => {
  const execStart = /^ExecStart=(.*)$/m.exec(unit)![1]!.split(/\s+/);
  expect(execStart.slice(0, 2)).toEqual(["/usr/local/bin/gateway", "serve"]);
  const loaded = loadConfig(execStart.slice(2), {});
  if (!loaded.ok) throw new Error(loaded.message);
  expect(loaded.config).toMatchObject({ dataDir: "/var/lib/gateway", host: "0.0.0.0", port: 8080 });
  expect(unit).toMatch(/^StateDirectory=gateway$/m);
  expect(unit).toMatch(/^StateDirectoryMode=0700$/m);
  expect(unit).toMatch(/^UMask=0077$/m);
  expect(unit).toMatch(/^KillSignal=SIGTERM$/m);
  // Stop timeout above the default drain grace (30 s), so a drain is never cut by systemd.
  expect(Number(/^TimeoutStopSec=(\d+)$/m.exec(unit)![1])).toBeGreaterThan(30);
});
