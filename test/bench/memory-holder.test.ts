// The RSS budget's holder (test/bench/memory.ts `hold`): it must measure N live streams, not a burst of
// N connects — a connect reset before any response is tried again and counted, and while the streams
// run it reports how old each one's latest delta is (docs/benchmarks.md, "Held RSS pass").
import { expect, test } from "bun:test";
import { join } from "node:path";
import { stampNow } from "./mock.ts";

test("the holder retries reset connects, counts them, and reports live streams and their deltas' age", async () => {
  const streams = 12;
  let resets = 3;
  const timers: ReturnType<typeof setInterval>[] = [];
  // A raw HTTP server: the first three connections are closed at once (a reset connect), every other
  // one answers an SSE stream with a stamped delta every 50 ms.
  const server = Bun.listen({
    hostname: "127.0.0.1",
    port: 0,
    socket: {
      open(socket) {
        if (resets > 0) {
          resets--;
          socket.terminate();
        }
      },
      data(socket) {
        if (socket.data) return;
        (socket as { data: unknown }).data = true;
        socket.write("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n");
        const send = () => {
          const event = `data: {"choices":[{"delta":{"content":"${stampNow()}"}}]}\n\n`;
          socket.write(`${Buffer.byteLength(event).toString(16)}\r\n${event}\r\n`);
        };
        send();
        timers.push(setInterval(send, 50));
      },
    },
  });
  const messages: unknown[] = [];
  let wake: () => void = () => {};
  const holder = Bun.spawn(["bun", join(import.meta.dir, "memory.ts"), "hold", `http://127.0.0.1:${server.port}`, "key", String(streams)], {
    env: { ...process.env, MEM_HOLD_OPENING: "4", MEM_HOLD_RETRIES: "5" },
    stdout: "inherit",
    stderr: "inherit",
    ipc: (m) => {
      messages.push(m);
      wake();
    },
  });
  const next = async (): Promise<unknown> => {
    while (messages.length === 0) await new Promise<void>((r) => (wake = r));
    return messages.shift();
  };
  try {
    const ready = (await next()) as { ok: number; failed: number; connect_retries: number };
    expect({ ok: ready.ok, failed: ready.failed, connect_retries: ready.connect_retries }).toEqual({ ok: streams, failed: 0, connect_retries: 3 });
    await Bun.sleep(200);
    holder.send("stats");
    const stats = (await next()) as { live: number; chunks: number; lag_p99_ms: number };
    expect(stats.live).toBe(streams);
    expect(stats.chunks).toBeGreaterThan(streams);
    // Every stream's latest delta is at most one interval (50 ms) old, plus scheduling slack.
    expect(stats.lag_p99_ms).toBeGreaterThanOrEqual(0);
    expect(stats.lag_p99_ms).toBeLessThan(1000);
  } finally {
    holder.kill("SIGKILL");
    await holder.exited;
    for (const t of timers) clearInterval(t);
    server.stop(true);
  }
}, 30_000);
