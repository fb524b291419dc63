// Pins the Bun behaviour src/gateway/outputSent.ts relies on: a direct stream's write leaves the process
// only after the turn's immediates have run, so a delivered record committed at the end of the turn
// (an immediate) could cover bytes still inside the process. Each case writes from one kind of turn,
// then asks the kernel (the client socket's receive queue, /proc/net/tcp) what the client has.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import net from "node:net";
import { afterOutputSentQueue } from "../../src/gateway/outputSent.ts";
import { receiveQueue } from "../support/receiveQueue.ts";

const linux = process.platform === "linux";

let server: ReturnType<typeof Bun.serve>;
let sink: ReadableStreamDirectController | null = null;
let client: net.Socket;
let read = 0;
let trigger: (() => void) | null = null;
let ws: WebSocket;

/** What the kernel has handed the client so far: read, plus waiting to be read. */
const delivered = () => read + receiveQueue(client.localPort!);
/** Waits until the client has read everything the kernel holds for it. */
async function drained(): Promise<void> {
  while (receiveQueue(client.localPort!) > 0) await Bun.sleep(1);
}

beforeAll(async () => {
  if (!linux) return;
  server = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    fetch(req, srv) {
      if (srv.upgrade(req, { data: {} })) return;
      const body = new ReadableStream({ type: "direct", pull: (controller: ReadableStreamDirectController) => void (sink = controller) } as never);
      return new Response(body, { headers: { "content-type": "text/event-stream" } });
    },
    websocket: { message: () => trigger?.() },
  });
  client = net.connect(server.port!, "127.0.0.1");
  client.on("data", (d: Buffer) => (read += d.length));
  client.write(`GET / HTTP/1.1\r\nhost: x\r\n\r\n`);
  while (sink === null) await Bun.sleep(1);
  ws = new WebSocket(`ws://127.0.0.1:${server.port}/`);
  await new Promise((resolve) => (ws.onopen = resolve));
});

afterAll(() => {
  if (!linux) return;
  ws.close();
  client.destroy();
  server.stop(true);
});

const LAST_DELTA = "data: the last delta\n\n";

/** Writes in the kind of turn `from` gives; reports how many bytes the client had gained at each check. */
async function probe(from: (act: () => void) => void): Promise<{ sameTurnImmediate: number; afterOutputSent: number }> {
  await drained();
  const before = delivered();
  const afterOutputSent = afterOutputSentQueue();
  return new Promise((resolve) => {
    from(() => {
      sink!.write(LAST_DELTA);
      let sameTurnImmediate = -1;
      setImmediate(() => (sameTurnImmediate = delivered() - before));
      afterOutputSent(() => resolve({ sameTurnImmediate, afterOutputSent: delivered() - before }));
    });
  });
}

describe.skipIf(!linux)("a direct stream's write leaves the process after the turn's immediates", () => {
  // [turn, how to write in it, whether an immediate queued there runs in the same turn]
  const cases: [string, (act: () => void) => void, boolean][] = [
    ["a WebSocket message", (act) => {
      trigger = () => {
        trigger = null;
        act();
      };
      ws.send("go");
    }, true],
    ["a timer", (act) => void setTimeout(act, 1), true],
    // One queued from an immediate runs a turn later, once the write has left.
    ["an immediate", (act) => void setImmediate(act), false],
    ["a promise's continuation", (act) => void Bun.sleep(1).then(act), true],
  ];
  for (const [name, from, sameTurn] of cases) {
    test(`written from ${name}`, async () => {
      const seen = await probe(from);
      // The turn's own immediate runs while the write is still inside the process...
      if (sameTurn) expect(seen.sameTurnImmediate).toBe(0);
      // ...and the queue's run comes once the kernel has all of it (with its chunk framing).
      expect(seen.afterOutputSent).toBeGreaterThanOrEqual(LAST_DELTA.length);
    });
  }

  test("written in a turn after an earlier turn's batch was sealed: the run waits for its own turn's writes", async () => {
    await drained();
    const before = delivered();
    const afterOutputSent = afterOutputSentQueue();
    const seen = await new Promise<number>((resolve) => {
      trigger = () => {
        trigger = null;
        sink!.write(LAST_DELTA);
        afterOutputSent(() => resolve(delivered() - before));
      };
      // An earlier turn's batch, still waiting for its second immediate when the message arrives.
      afterOutputSent(() => {});
      setImmediate(() => ws.send("go"));
    });
    expect(seen).toBeGreaterThanOrEqual(LAST_DELTA.length);
  });
});
