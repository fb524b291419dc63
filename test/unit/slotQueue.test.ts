// The admission queue (src/gateway/slotQueue.ts): arrival order per model, turns across accounts,
// bounded depth, the wait limit, requests that left.
import { expect, test } from "bun:test";
import { SlotQueue, type QueueTimers, type TryResult } from "../../src/gateway/slotQueue.ts";

/** Timers on a hand-driven clock. */
function manualTimers() {
  let now = 0;
  const pending = new Set<{ at: number; run: () => void }>();
  const timers: QueueTimers = {
    setTimeout: (run, ms) => {
      const t = { at: now + ms, run };
      pending.add(t);
      return t;
    },
    clearTimeout: (t) => void pending.delete(t as { at: number; run: () => void }),
  };
  const advance = (ms: number) => {
    now += ms;
    for (const t of [...pending].sort((a, b) => a.at - b.at)) {
      if (t.at > now) continue;
      pending.delete(t);
      t.run();
    }
  };
  return { timers, advance, pending };
}

function fixture(maxWaitMs = 5_000, maxDepth = 100) {
  const { timers, advance, pending } = manualTimers();
  const queue = new SlotQueue({ maxWaitMs, maxDepth, timers, defer: (run) => run() });
  let slots = 0;
  const served: string[] = [];
  const expired: string[] = [];
  const add = (model: string, account: string, name: string, gone = () => false) =>
    queue.enqueue({
      model,
      accountId: account,
      tryDispatch: (): TryResult => {
        if (gone()) return "gone";
        if (slots <= 0) return "no_slot";
        slots--;
        served.push(name);
        return "dispatched";
      },
      expire: () => expired.push(name),
    });
  const free = (n: number) => {
    slots += n;
    queue.wake();
  };
  return { queue, add, free, served, expired, advance, pending };
}

test("per model, accounts take turns and each account's requests keep their arrival order", () => {
  const f = fixture();
  for (const name of ["a1", "a2", "a3", "a4"]) f.add("m", "A", name);
  f.add("m", "B", "b1");
  f.add("m", "B", "b2");
  f.add("m", "C", "c1");
  expect(f.queue.depth).toBe(7);
  f.free(7);
  expect(f.served).toEqual(["a1", "b1", "c1", "a2", "b2", "a3", "a4"]);
  expect(f.queue.depth).toBe(0);
  expect(f.pending.size).toBe(0);
});

test("one slot at a time: a heavy account cannot starve a light one", () => {
  const f = fixture();
  for (let i = 1; i <= 10; i++) f.add("m", "heavy", `h${i}`);
  f.add("m", "light", "l1");
  f.free(1);
  f.free(1);
  expect(f.served).toEqual(["h1", "l1"]);
});

test("models queue apart: a slot for one model does not serve another's waiter", () => {
  const f = fixture();
  let m2Slots = 0;
  f.queue.enqueue({ model: "m2", accountId: "A", tryDispatch: () => (m2Slots > 0 ? "dispatched" : "no_slot"), expire: () => {} });
  f.add("m1", "A", "x");
  f.free(1);
  expect(f.served).toEqual(["x"]);
  expect(f.queue.depthOf("m2")).toBe(1);
  m2Slots = 1;
  f.queue.wake();
  expect(f.queue.depth).toBe(0);
});

test("the wait runs out after maxWaitMs, not before; a request served in time never expires", () => {
  const f = fixture(5_000);
  f.add("m", "A", "early");
  f.advance(1_000);
  f.add("m", "A", "late");
  f.advance(3_999);
  expect(f.expired).toEqual([]);
  f.advance(1);
  expect(f.expired).toEqual(["early"]);
  f.free(1);
  expect(f.served).toEqual(["late"]);
  f.advance(10_000);
  expect(f.expired).toEqual(["early"]);
  expect(f.queue.expired).toBe(1);
  expect(f.queue.served).toBe(1);
});

test("a request that left is dropped without taking a slot", () => {
  const f = fixture();
  let left = false;
  f.add("m", "A", "leaver", () => left);
  f.add("m", "B", "stayer");
  left = true;
  f.free(1);
  expect(f.served).toEqual(["stayer"]);
  expect(f.queue.depth).toBe(0);
});

test("bounded: beyond maxDepth, and with waiting off, enqueue refuses at once", () => {
  const f = fixture(5_000, 2);
  expect(f.add("m", "A", "1")).toBe(true);
  expect(f.add("m", "A", "2")).toBe(true);
  expect(f.add("m", "A", "3")).toBe(false);
  const off = fixture(0);
  expect(off.add("m", "A", "x")).toBe(false);
});

test("a head that cannot use the free slot lets the next account's request take it", () => {
  const { timers } = manualTimers();
  const queue = new SlotQueue({ maxWaitMs: 5_000, maxDepth: 10, timers, defer: (run) => run() });
  const order: string[] = [];
  queue.enqueue({ model: "m", accountId: "A", tryDispatch: () => "no_slot", expire: () => {} });
  queue.enqueue({ model: "m", accountId: "B", tryDispatch: () => (order.push("b"), "dispatched"), expire: () => {} });
  queue.wake();
  expect(order).toEqual(["b"]);
  expect(queue.depth).toBe(1);
});
