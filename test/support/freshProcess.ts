// Memory tests that must measure one gateway's heap, not every earlier file's: the parent runs the
// child test file in a fresh `bun test` process and checks its summary.
import { join } from "node:path";

/**
 * Runs `file` (relative to the repository) in a fresh `bun test`; its whole output, indented, on
 * stderr when it failed (the child's file headers and (fail) lines must not read as the parent's).
 */
export async function runFreshTestFile(file: string, timeoutMs: number): Promise<{ output: string; code: number }> {
  const proc = Bun.spawn(["bun", "test", "--timeout", String(timeoutMs), file], {
    cwd: join(import.meta.dir, "../.."),
    stdout: "pipe",
    stderr: "pipe",
  });
  const [out, err, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited]);
  const output = out + err;
  if (code !== 0) console.error(output.replace(/^/gm, "  | "));
  return { output, code };
}

/** Reads an SSE body until its first content delta; the reader stays open. */
export async function readUntilFirstDelta(res: Response) {
  const reader = res.body!.getReader();
  const decoder = new TextDecoder();
  for (let seen = ""; !seen.includes('"content":"'); ) {
    // A stream that ended must end the loop: a read after the end resolves at once, forever.
    const { value, done } = await reader.read();
    if (done) throw new Error(`the stream ended before its first delta: ${seen}`);
    seen += decoder.decode(value);
  }
  return reader;
}
