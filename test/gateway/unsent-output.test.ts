// A stream's `unsent()` (src/http/output.ts): what a full socket has not taken yet, on a real
// loopback socket whose reader stops. It settles when the reader drains it, or at the stream's stall
// bound for a reader that never does — so an attempt's record waits for a slow buyer's bytes to leave
// the process, and never for good (docs/receipts.md, "Crashes").
import { afterEach, expect, test } from "bun:test";
import net from "node:net";
import { lazyEventStream, type LazyEventStream } from "../../src/http/output.ts";
import { waitFor } from "../support/harness.ts";

const cleanup: (() => void)[] = [];
afterEach(() => {
  for (const c of cleanup.splice(0)) c();
});

/** A server whose one response is `stream`, and a paused reader of it. */
async function pausedReader(stallMs: number): Promise<{ out: LazyEventStream; reader: net.Socket; read: () => number }> {
  const out = lazyEventStream({
    headers: {},
    onBuyerGone: () => {},
    record: () => {},
    flow: { maxBufferedBytes: 1 << 30, stallMs, now: () => performance.now(), onStalled: () => {} },
  });
  out.write("data: first\n\n");
  const server = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => out.response });
  let read = 0;
  const reader = net.connect(server.port!, "127.0.0.1");
  reader.on("data", (d: Buffer) => (read += d.length));
  reader.write("GET / HTTP/1.1\r\nhost: x\r\n\r\n");
  cleanup.push(() => {
    reader.destroy();
    server.stop(true);
  });
  await waitFor(() => read > 0);
  reader.pause();
  return { out, reader, read: () => read };
}

/** Writes ~8 MB (more than the kernel holds for a socket nobody reads) until a write is held back. */
function fill(out: LazyEventStream): void {
  const event = `data: ${"x".repeat(64 * 1024)}\n\n`;
  for (let i = 0; i < 128 && out.unsent() === null; i++) out.write(event);
}

test("nothing held back: null", async () => {
  const { out } = await pausedReader(60_000);
  out.write("data: small\n\n");
  expect(out.unsent()).toBeNull();
});

test("held back: settles once the reader drains it", async () => {
  const { out, reader } = await pausedReader(60_000);
  fill(out);
  const unsent = out.unsent();
  expect(unsent).not.toBeNull();
  let settled = false;
  void unsent!.then(() => (settled = true));
  await Bun.sleep(50);
  expect(settled).toBe(false);
  reader.resume();
  await waitFor(() => settled, 10_000, "unsent() settled after the drain");
});

test("a reader that never drains: settles at the stall bound, not before", async () => {
  const { out, read } = await pausedReader(300);
  const start = performance.now();
  fill(out);
  const unsent = out.unsent();
  expect(unsent).not.toBeNull();
  await unsent;
  // The bound counts from when the socket first held a write back, after `start`.
  expect(performance.now() - start).toBeGreaterThanOrEqual(299);
  expect(performance.now() - start).toBeLessThan(5_000);
  expect(read()).toBeLessThan(1_000_000);
});
