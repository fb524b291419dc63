// `gateway serve` as a new operator sees it: its log lines, banner and help.
import { afterEach, expect, test } from "bun:test";
import { rmSync, statSync } from "node:fs";
import { join } from "node:path";
import { settingSpecs } from "../../src/config/index.ts";
import { openStore } from "../../src/store/index.ts";
import { MAIN, collectJsonLines, tempDir, waitFor } from "../support/harness.ts";

let cleanups: Array<() => unknown> = [];
afterEach(async () => {
  for (const cleanup of cleanups.reverse()) await cleanup();
  cleanups = [];
});

function spawnServe(args: string[], env: Record<string, string> = {}) {
  const dataDir = tempDir("gw-serve-");
  const proc = Bun.spawn(["bun", MAIN, "serve", "--port", "0", "--data-dir", dataDir, ...args], {
    env: { ...process.env, ...env },
    stdout: "pipe",
    stderr: "pipe",
  });
  cleanups.push(() => rmSync(dataDir, { recursive: true, force: true }));
  cleanups.push(async () => {
    proc.kill("SIGTERM");
    await proc.exited;
  });
  return { proc, dataDir };
}

test("with --inspect, the inspector line comes after the first log line, in the same JSON format", async () => {
  const { proc } = spawnServe(["--inspect=ws://127.0.0.1:9"]);
  const lines: Record<string, unknown>[] = [];
  collectJsonLines(proc.stdout as ReadableStream<Uint8Array>, lines);
  await waitFor(() => lines.some((l) => l.event === "inspector_attached"), 10_000, "inspector_attached");
  expect(lines[0]).toMatchObject({ level: "info", event: "gateway_listening" });
  expect(lines[1]).toMatchObject({ level: "info", event: "inspector_attached", url: "ws://127.0.0.1:9" });
  expect(Object.keys(lines[1]!).slice(0, 3)).toEqual(["ts", "level", "event"]);
});

test("serve --help lists every option with its default", () => {
  const help = Bun.spawnSync(["bun", MAIN, "serve", "--help"]).stdout.toString();
  for (const spec of settingSpecs) {
    const line = help.split("\n").find((l) => l.trimStart().startsWith(`${spec.flag} `));
    expect({ flag: spec.flag, line: line ?? null }).toEqual({ flag: spec.flag, line: expect.stringContaining(`(default: ${spec.default ?? (spec.key === "inspect" ? "off" : "none")})`) });
  }
});

/** Starts `serve --demo` on `dataDir` and reads its banner (stderr) until the curl line. */
async function demoBanner(dataDir: string) {
  const proc = Bun.spawn(["bun", MAIN, "serve", "--demo", "--port", "0", "--data-dir", dataDir], { stdout: "ignore", stderr: "pipe" });
  let banner = "";
  for await (const bytes of proc.stderr as ReadableStream<Uint8Array>) {
    banner += new TextDecoder().decode(bytes);
    if (banner.includes("Browser demo:")) break;
  }
  proc.kill("SIGTERM");
  expect(await proc.exited).toBe(0);
  return banner;
}

test("serve --demo says where its data lives, prints an export line, and keeps the same key across restarts", async () => {
  const root = tempDir("gw-demo-");
  cleanups.push(() => rmSync(root, { recursive: true, force: true }));
  const dataDir = join(root, "data");
  const first = await demoBanner(dataDir);
  const key = /Dev API key: (\S+)/.exec(first)![1]!;
  expect(first).toContain(`Data: ${dataDir}  (`);
  expect(first).toContain(`\n  export GATEWAY_API_KEY=${key}\n`);
  expect((statSync(join(dataDir, "demo-dev-key")).mode & 0o777).toString(8)).toBe("600");
  const second = await demoBanner(dataDir);
  expect(/Dev API key: (\S+)/.exec(second)![1]).toBe(key);
  // The key printed both times is the one that works.
  const store = openStore(join(dataDir, "gateway.db"));
  try {
    expect(store.authenticateApiKey(key)).not.toBeNull();
  } finally {
    store.close();
  }
}, 60_000);
