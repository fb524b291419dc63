// What a live stream keeps of its prompt (stream-memory.child.ts), checked in a fresh `bun test`
// process: its heap snapshots must see the gateway's heap, not every earlier file's — in a full
// suite's process one snapshot took 70–85 s and the file timed out. The mode (GATEWAY_TEST_MODE) is
// inherited, so the cluster pass checks a cluster node.
import { expect, test } from "bun:test";
import { runFreshTestFile } from "../support/freshProcess.ts";

test("a live request's prompt: released at a stream's first delta, kept while a request can fail over; a live stream's retained heap is bounded (fresh process)", async () => {
  const { output, code } = await runFreshTestFile("./test/e2e/stream-memory.child.ts", 60_000);
  expect(output).toMatch(/^ *3 pass$/m);
  expect(output).toMatch(/^ *0 fail$/m);
  expect(code).toBe(0);
}, 150_000);
