// deploy/gateway.jsonc, the commented sample config: every key in it (set, or commented out) is a row of
// docs/configuration.md, every row is in it once, and `gateway serve --config` accepts it as it is.
import { expect, test } from "bun:test";
import { readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { loadConfig, settingSpecs } from "../../src/config/index.ts";

const root = join(import.meta.dir, "../..");
const samplePath = join(root, "deploy/gateway.jsonc");
const sample = readFileSync(samplePath, "utf8");
const doc = readFileSync(join(root, "docs/configuration.md"), "utf8");
const docKeys = doc.split("\n").flatMap((line) => /^\| `([a-zA-Z]+)` \| `--/.exec(line)?.[1] ?? []);

/** `"key": value,` lines, whether set or commented out with `//`. */
const sampleKeys = [...sample.matchAll(/^\s*(?:\/\/\s*)?"([a-zA-Z]+)":/gm)].map((m) => m[1]!);

/** The lines a setting has in the sample: its help as a comment, then the key with its default. */
function sampleLines(key: string): string {
  const spec = settingSpecs.find((s) => s.key === key);
  if (!spec) return `  // "${key}": …,`;
  const value = spec.default === undefined ? `  // "${key}": "…",` : `  "${key}": ${JSON.stringify(spec.default)},`;
  return `  // ${spec.help}\n${value}`;
}

test("every key of the sample is a documented setting, and every documented setting is in it once", () => {
  const missing = docKeys.filter((k) => !sampleKeys.includes(k));
  // The failure prints what to paste into deploy/gateway.jsonc for a setting added to the table.
  expect({ "paste into deploy/gateway.jsonc": missing.map(sampleLines) }).toEqual({ "paste into deploy/gateway.jsonc": [] });
  expect(sampleKeys.filter((k) => !docKeys.includes(k))).toEqual([]);
  expect(sampleKeys.length).toBe(new Set(sampleKeys).size);
  expect(docKeys.sort()).toEqual(settingSpecs.map((s) => s.key).sort());
});

test("each key has a comment, and the values set are the defaults", () => {
  const lines = sample.split("\n");
  for (const spec of settingSpecs) {
    const at = lines.findIndex((l) => new RegExp(`^\\s*(//\\s*)?"${spec.key}":`).test(l));
    expect({ key: spec.key, commented: lines[at - 1]?.trim().startsWith("//") }).toEqual({ key: spec.key, commented: true });
  }
  const loaded = loadConfig(["--config", samplePath], {});
  if (!loaded.ok) throw new Error(loaded.message);
  const defaults = loadConfig([], {});
  if (!defaults.ok) throw new Error(defaults.message);
  expect(loaded.config).toEqual(defaults.config);
});

test("uncommenting every optional key still loads (the examples are valid values)", () => {
  const uncommented = sample.replace(/^(\s*)\/\/\s*("[a-zA-Z]+":)/gm, "$1$2");
  const file = join(import.meta.dir, `.sample-${process.pid}.jsonc`);
  try {
    writeFileSync(file, uncommented);
    const loaded = loadConfig(["--config", file], {});
    expect(loaded.ok ? "ok" : loaded.message).toBe("ok");
  } finally {
    rmSync(file, { force: true });
  }
});
