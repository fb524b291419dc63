// The admission gate (src/http/admissionGate.ts), live streams first: at most `perTurn` admissions
// start in one event-loop turn, the rest in arrival order in later turns, so a burst of new requests
// never runs more than `perTurn` admissions between two reads of the live streams' sockets. Turns and
// the clock are stepped by hand: no sleeps.
import { describe, expect, test } from "bun:test";
import { admissionGate } from "../../src/http/admissionGate.ts";

/** A gate whose turns run only when the test says (each `turn()` is one event-loop turn). */
function steppedGate(perTurn: number, maxWaitMs = 0) {
  let now = 0;
  let pending: (() => void)[] = [];
  const gate = admissionGate({ perTurn, maxWaitMs, now: () => now, nextTurn: (run) => void pending.push(run) });
  return {
    gate,
    /** Ends this turn: what was scheduled for the next one runs, then its promise reactions. */
    async turn() {
      const runs = pending;
      pending = [];
      for (const run of runs) run();
      await Promise.resolve();
    },
    advance(ms: number) {
      now += ms;
    },
    scheduled: () => pending.length,
  };
}

/** Enters `n` requests; `started` lists, in order, the ones whose admission work began. */
function burst(gate: ReturnType<typeof admissionGate>, n: number, started: number[], shed: number[] = []) {
  for (let i = 0; i < n; i++) {
    const turn = gate.enter();
    if (turn === true) started.push(i);
    else if (turn === false) shed.push(i);
    else void turn.then((go) => (go ? started : shed).push(i));
  }
}

describe("admission gate", () => {
  test("a burst starts at most perTurn admissions a turn, oldest first", async () => {
    const g = steppedGate(4);
    const started: number[] = [];
    burst(g.gate, 10, started);
    expect(started).toEqual([0, 1, 2, 3]);
    expect(g.gate.waiting).toBe(6);
    await g.turn();
    expect(started).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
    await g.turn();
    expect(started).toEqual([0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
    expect(g.gate.waiting).toBe(0);
  });

  test("a request arriving while others wait queues behind them, even in a turn with budget left", async () => {
    const g = steppedGate(3);
    const started: number[] = [];
    burst(g.gate, 5, started);
    await g.turn(); // starts 3 and 4: one admission of this turn's budget is left
    expect(started).toEqual([0, 1, 2, 3, 4]);
    const late: number[] = [];
    burst(g.gate, 3, late);
    // The budget's last admission goes to the first newcomer; the other two wait a turn.
    expect(late).toEqual([0]);
    await g.turn();
    expect(late).toEqual([0, 1, 2]);
  });

  test("the budget starts over every turn, also when nobody waited", async () => {
    const g = steppedGate(2);
    const started: number[] = [];
    burst(g.gate, 2, started);
    await g.turn();
    burst(g.gate, 2, started);
    expect(started).toEqual([0, 1, 0, 1]);
    // Nothing scheduled while idle: the gate costs no turn of its own when no request comes.
    await g.turn();
    await g.turn();
    expect(g.scheduled()).toBe(0);
  });

  test("between two turns (two reads of the live streams' sockets) at most perTurn admissions run, whatever the burst", async () => {
    const g = steppedGate(8);
    const started: number[] = [];
    burst(g.gate, 1000, started);
    const perTurn: number[] = [started.length];
    while (g.gate.waiting > 0) {
      const before = started.length;
      await g.turn();
      perTurn.push(started.length - before);
    }
    expect(Math.max(...perTurn)).toBe(8);
    expect(started.length).toBe(1000);
    expect(started).toEqual([...Array(1000).keys()]);
  });

  test("with maxWaitMs, a new request is shed at once while the oldest waiting one has waited longer", async () => {
    const g = steppedGate(1, 100);
    const started: number[] = [];
    const shed: number[] = [];
    burst(g.gate, 3, started, shed); // 0 starts, 1 and 2 wait
    g.advance(100);
    const late: number[] = [];
    burst(g.gate, 1, late, shed); // the oldest waited exactly 100 ms: not yet past the bound, so it queues
    expect(shed).toEqual([]);
    g.advance(1);
    expect(g.gate.enter()).toBe(false);
    // At the next turn the two that waited 101 ms are shed too; the one that waited 1 ms starts.
    await g.turn();
    expect(started).toEqual([0]);
    expect(shed).toEqual([1, 2]);
    expect(late).toEqual([0]);
    expect(g.gate.counts).toEqual({ waited: 3, shed: 3 });
    // Once the queue is drained, requests are taken again (from the next turn: this one's budget is spent).
    await g.turn();
    expect(g.gate.enter()).toBe(true);
  });

  test("with maxWaitMs, a waiter still waiting past it at its turn is shed, not admitted", async () => {
    const g = steppedGate(2, 100);
    const started: number[] = [];
    const shed: number[] = [];
    burst(g.gate, 6, started, shed); // 0 and 1 start, 2–5 wait
    await g.turn(); // 2 and 3 start
    g.advance(101);
    await g.turn(); // 4 and 5 have waited 101 ms: shed, oldest first
    expect(started).toEqual([0, 1, 2, 3]);
    expect(shed).toEqual([4, 5]);
    expect(g.gate.counts).toEqual({ waited: 4, shed: 2 });
    expect(g.gate.waiting).toBe(0);
  });

  test("perTurn 0 is no gate: every request starts at once", () => {
    const g = steppedGate(0);
    const started: number[] = [];
    burst(g.gate, 500, started);
    expect(started.length).toBe(500);
    expect(g.scheduled()).toBe(0);
  });
});

// What the gate relies on: between two `setImmediate` turns Bun's loop reads its sockets, so a frame
// already on a socket is handled after at most one slice of a burst. Were Bun to run every queued
// immediate before polling, the gate would only reorder the burst and this test would say so.
test("Bun reads a socket's pending messages between two setImmediate turns", async () => {
  const order: string[] = [];
  const server = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    fetch: (req, srv) => (srv.upgrade(req) ? undefined : new Response("no", { status: 400 })),
    websocket: { message: () => void order.push("frame") },
  });
  const ws = new WebSocket(`ws://127.0.0.1:${server.port}`);
  await new Promise((resolve) => (ws.onopen = resolve));
  try {
    // The frames are on the socket before the first turn of the chain runs.
    for (let i = 0; i < 5; i++) ws.send("x");
    const turns = 200;
    await new Promise<void>((resolve) => {
      let n = 0;
      const turn = () => {
        order.push("turn");
        if (++n < turns) setImmediate(turn);
        else resolve();
      };
      setImmediate(turn);
    });
    const firstFrame = order.indexOf("frame");
    expect(firstFrame).toBeGreaterThanOrEqual(0);
    // Handled within the chain, not after all of it.
    expect(firstFrame).toBeLessThan(turns);
  } finally {
    ws.close();
    server.stop(true);
  }
});
