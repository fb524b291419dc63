// A fresh temp directory per test file, removed afterwards: tests use real SQLite files.

import { afterAll } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

export function tempDir(): { path: (name: string) => string } {
  const dir = mkdtempSync(join(tmpdir(), "gw-store-"));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));
  let n = 0;
  // Each call gives a distinct file so tests stay independent.
  return { path: (name: string) => join(dir, `${n++}-${name}`) };
}
