// The retainer-path diagnostic that test/e2e/stream-memory.test.ts logs with: run in a fresh process
// (a small heap), it must name the object and property holding a marked string.
import { expect, test } from "bun:test";
import { join } from "node:path";

test("retainerPaths names the holder of a marked string", async () => {
  const script = `
    import { retainerPaths } from ${JSON.stringify(join(import.meta.dir, "../support/heapRetainers.ts"))};
    class PromptHolder { constructor(text) { this.heldPrompt = text; } }
    globalThis.keep = new PromptHolder("MARKER42" + "x".repeat(4096));
    console.log(JSON.stringify(retainerPaths("MARKER42")));`;
  const proc = Bun.spawn(["bun", "-e", script], { stdout: "pipe", stderr: "pipe" });
  const [out, code] = await Promise.all([new Response(proc.stdout).text(), proc.exited]);
  expect(code).toBe(0);
  const paths = JSON.parse(out) as string[];
  expect(paths.length).toBeGreaterThan(0);
  expect(paths.join("\n")).toContain("heldPrompt");
}, 30_000);
