// The allocator setting the shipped service files start the gateway with (docs/operator.md,
// "Allocator"): set in the systemd unit and the container image, and honoured by the Bun runtime the
// gateway runs on — mimalloc reads it at process start, so nothing inside the process could set it.
import { expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";

const ROOT = join(import.meta.dir, "../..");
const read = (file: string) => readFileSync(join(ROOT, file), "utf8");

test("the systemd unit and the container image set MIMALLOC_PURGE_DELAY=1000", () => {
  expect(read("deploy/gateway.service")).toMatch(/^Environment=MIMALLOC_PURGE_DELAY=1000$/m);
  expect(read("Dockerfile")).toMatch(/^\s+MIMALLOC_PURGE_DELAY=1000$/m);
});

test("the provider runtime's documented systemd unit and launchd agent set MIMALLOC_PURGE_DELAY=1000", () => {
  const doc = read("docs/provider-machines.md");
  // The unit and the plist are the page's two code blocks of those languages.
  const block = (lang: string) => /```(\w+)\n([\s\S]*?)```/g[Symbol.matchAll](doc).find((m) => m[1] === lang)?.[2] ?? "";
  expect(block("ini")).toMatch(/^Environment=MIMALLOC_PURGE_DELAY=1000$/m);
  expect(block("xml")).toMatch(/<key>EnvironmentVariables<\/key>\s*<dict>\s*<key>MIMALLOC_PURGE_DELAY<\/key>\s*<string>1000<\/string>/);
});

test("the Bun runtime's allocator takes its purge delay from the environment", () => {
  const purgeDelay = (env: Record<string, string>) => {
    const { MIMALLOC_PURGE_DELAY: _, ...inherited } = process.env;
    const run = Bun.spawnSync([process.execPath, "-e", "0"], { env: { ...inherited, MIMALLOC_VERBOSE: "1", ...env } });
    return /option 'purge_delay': (\d+)/.exec(run.stderr.toString())?.[1];
  };
  expect(purgeDelay({ MIMALLOC_PURGE_DELAY: "1000" })).toBe("1000");
  // The default it replaces, so a runtime whose default changed is noticed.
  expect(purgeDelay({})).toBe("100");
});
