// docs/configuration.md cannot drift from src/config/settings.ts: every setting has exactly the row
// this test renders from its spec (config key, flag, env name, kind, default, meaning), and the table
// has no row for a setting that does not exist. A failure prints the row to paste.
import { expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { settingSpecs } from "../../src/config/index.ts";
import type { SettingSpec } from "../../src/config/settings.ts";

const doc = readFileSync(join(import.meta.dir, "../../docs/configuration.md"), "utf8");

/** The reference row of one setting, as docs/configuration.md writes it. */
function settingRow(spec: SettingSpec): string {
  const kind = spec.kind === "enum" ? `enum (${spec.values!.join(", ")})` : spec.kind;
  const def = spec.default === undefined ? "—" : `\`${spec.default}\``;
  return `| \`${spec.key}\` | \`${spec.flag}\` | \`${spec.env}\` | ${kind} | ${def} | ${spec.help} |`;
}

const docRows = doc.split("\n").filter((line) => /^\| `[a-zA-Z]+` \| `--/.test(line));

test.each(settingSpecs.map((spec) => [spec.key, spec] as const))("docs/configuration.md documents %s exactly", (_, spec) => {
  expect(docRows).toContain(settingRow(spec));
});

test("the reference lists no setting that does not exist, each once", () => {
  const keys = docRows.map((row) => /^\| `([a-zA-Z]+)`/.exec(row)![1]);
  expect(keys.sort()).toEqual(settingSpecs.map((s) => s.key).sort());
});

test("the doc names the settings of every operator subcommand that reads the environment", () => {
  for (const env of ["GATEWAY_DATA_DIR", "GATEWAY_KEY_PREFIX", "GATEWAY_CONFIG"]) expect(doc).toContain(env);
});
