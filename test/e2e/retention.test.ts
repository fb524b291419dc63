// Nothing a request leaves behind once it ended (retention.child.ts), checked in a fresh `bun test`
// process: its census of live objects must count this gateway's heap, not every earlier file's.
import { expect, test } from "bun:test";
import { join } from "node:path";

test("requests that ended leave nothing behind, whatever their number (fresh process)", async () => {
  const proc = Bun.spawn(["bun", "test", "--timeout", "300000", "./test/e2e/retention.child.ts"], {
    cwd: join(import.meta.dir, "../.."),
    stdout: "pipe",
    stderr: "pipe",
  });
  const [out, err, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited]);
  const output = out + err;
  // Indented: the child's own file headers and (fail) lines must not read as this run's.
  if (code !== 0) console.error(output.replace(/^/gm, "  | "));
  else console.log(output.match(/^\[retention\].*$/m)?.[0] ?? "");
  expect(output).toMatch(/^ *1 pass$/m);
  expect(output).toMatch(/^ *0 fail$/m);
  expect(code).toBe(0);
}, 330_000);
