// `gateway serve` as a new operator sees it: its log lines, banner and help.
import { afterEach, expect, test } from "bun:test";
import { rmSync } from "node:fs";
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
