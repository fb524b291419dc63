// Preloaded by `bun run bench` into each server under test — the gateway, the bare relay's server, the
// floor's server (stack.ts); not part of the product. Samples the event loop's delay: how late a 10 ms
// timer fires. Every 250 ms it appends one line to `$BENCH_LOOP_DIR/loop-PID.jsonl`:
// `{"t": epoch ms of the batch's first sample, "s": [offset ms, delay ms, offset ms, delay ms, …]}`;
// run.ts reads the samples inside a phase's window (loopDelay.ts). A blocked loop shows as one large
// sample, the length of the block.
import { appendFileSync } from "node:fs";

const dir = process.env.BENCH_LOOP_DIR;
const EVERY_MS = 10;
const FLUSH_MS = 250;

if (dir) {
  const file = `${dir}/loop-${process.pid}.jsonl`;
  let batch: number[] = [];
  let batchStart = performance.now();
  let expected = batchStart + EVERY_MS;
  const tick = () => {
    const now = performance.now();
    if (batch.length === 0) batchStart = now;
    batch.push(Math.round(now - batchStart), Math.round(Math.max(0, now - expected) * 1000) / 1000);
    if (now - batchStart >= FLUSH_MS) {
      appendFileSync(file, `${JSON.stringify({ t: performance.timeOrigin + batchStart, s: batch })}\n`);
      batch = [];
    }
    expected = performance.now() + EVERY_MS;
    setTimeout(tick, EVERY_MS).unref();
  };
  setTimeout(tick, EVERY_MS).unref();
}
