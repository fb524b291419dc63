// Nothing a request leaves behind once it ended (retention.child.ts), checked in a fresh `bun test`
// process: its census of live objects must count this gateway's heap, not every earlier file's.
import { expect, test } from "bun:test";
import { runFreshTestFile } from "../support/freshProcess.ts";

test("requests that ended leave nothing behind, whatever their number (fresh process)", async () => {
  const { output, code } = await runFreshTestFile("./test/e2e/retention.child.ts", 300_000);
  if (code === 0) console.log(output.match(/^\[retention\].*$/m)?.[0] ?? "");
  expect(output).toMatch(/^ *1 pass$/m);
  expect(output).toMatch(/^ *0 fail$/m);
  expect(code).toBe(0);
}, 330_000);
