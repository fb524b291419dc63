// The settlement actor in isolation: the first terminal outcome is final; the pending deadline is
// scheduled on the actor system's clock, so SimulatedClock drives it.
import { beforeAll, describe, expect, test } from "bun:test";
import type { QuarantineReason } from "../../src/receipts/verify.ts";
import { createActor, SimulatedClock } from "xstate";
import {
  providedSettlementMachine,
  settlementLogic,
  settlementStep,
  type SettlementContext,
  type SettlementEffects,
  type SettlementEvent,
  type SettlementInput,
} from "../../actors/settlement.ts";

// The statechart (the definition) and the step logic the gateway runs pass the same tests.
const VARIANTS = ["statechart", "step logic"] as const;
let current: (typeof VARIANTS)[number] = "statechart";
const logicOf = (effects: SettlementEffects) => (current === "statechart" ? providedSettlementMachine(effects) : settlementLogic(effects));

const DEADLINE_MS = 300_000;

function startSettlement(input: Partial<SettlementInput> = {}) {
  const clock = new SimulatedClock();
  const settled: string[] = [];
  const actor = createActor(
    logicOf({ settle: (label, context) => void settled.push(label === "verified" ? label : `${label}:${context.reason}`) }),
    { input: { requestId: "req_1", attemptN: 0, resumedPending: false, pendingDeadlineMs: DEADLINE_MS, ...input }, clock },
  ).start();
  const send = (...events: SettlementEvent[]) => events.forEach((e) => actor.send(e));
  return { actor, clock, settled, send, state: () => actor.getSnapshot().value };
}

/** The pending deadline, as the chart's delayed transition (and the step logic's timer) sends it. */
const DEADLINE = { type: "xstate.after.pendingDeadline.settlement.pending" } as const;
const verified = { type: "receipt.judged", verdict: { label: "verified" } } as const;
const quarantined = (reason: QuarantineReason) => ({ type: "receipt.judged", verdict: { label: "quarantined", reason } }) as const;
const ended = (deliveredNothing = false, verdictDue = false) => ({ type: "attempt.ended", deliveredNothing, verdictDue }) as const;

describe.each(VARIANTS)("%s", (variant) => {
  beforeAll(() => {
    current = variant;
  });

  describe("settlement", () => {
    test("a receipt riding on `end` is judged as the attempt ends → verified, settled once", () => {
      const s = startSettlement();
      expect(s.state()).toBe("running");
      s.send(verified, ended());
      expect(s.state()).toBe("verified");
      expect(s.settled).toEqual(["verified"]);
    });

    test("an attempt that delivered nothing is zero_settled, whatever its receipt says", () => {
      const s = startSettlement();
      s.send(verified, ended(true));
      expect(s.state()).toBe("zero_settled");
      expect(s.settled).toEqual(["zero_settled:nothing_delivered"]);
    });

    test("a late receipt before the deadline settles; one after it finds the attempt quarantined", () => {
      const s = startSettlement();
      s.send(ended());
      expect(s.state()).toBe("pending");
      s.clock.increment(DEADLINE_MS - 1);
      expect(s.state()).toBe("pending");
      s.send(verified);
      expect(s.state()).toBe("verified");

      const late = startSettlement();
      late.send(ended());
      late.clock.increment(DEADLINE_MS);
      expect(late.state()).toBe("quarantined");
      late.send(verified);
      expect(late.state()).toBe("quarantined");
      expect(late.settled).toEqual(["quarantined:no_receipt"]);
    });

    test("the first terminal outcome is final: a second receipt changes nothing", () => {
      const s = startSettlement();
      s.send(ended(), quarantined("bad_signature"), verified);
      expect(s.state()).toBe("quarantined");
      expect(s.settled).toEqual(["quarantined:bad_signature"]);
      expect(s.actor.getSnapshot().status).toBe("done");
      expect(s.actor.getSnapshot().output).toEqual({ reason: "bad_signature" });
    });

    test("an attempt the gateway refused (measurement ≠ catalog) is quarantined at once", () => {
      const s = startSettlement();
      s.send({ type: "attempt.rejected", reason: "measurement_mismatch" }, ended(true));
      expect(s.settled).toEqual(["quarantined:measurement_mismatch"]);
    });

    test("the deadline does not run while the attempt is still on the wire", () => {
      const s = startSettlement();
      s.clock.increment(DEADLINE_MS * 2);
      expect(s.state()).toBe("running");
      s.send(ended());
      s.clock.increment(DEADLINE_MS);
      expect(s.state()).toBe("quarantined");
    });

    test("resumed after a restart: waits only the remaining deadline", () => {
      const s = startSettlement({ resumedPending: true, pendingDeadlineMs: 1_000 });
      expect(s.state()).toBe("pending");
      s.clock.increment(999);
      expect(s.state()).toBe("pending");
      s.clock.increment(1);
      expect(s.settled).toEqual(["quarantined:no_receipt"]);

      const overdue = startSettlement({ resumedPending: true, pendingDeadlineMs: -5 });
      overdue.clock.increment(0);
      expect(overdue.settled).toEqual(["quarantined:no_receipt"]);
    });
  });

  describe("the settlement actor holds the deadline for a verdict that is due", () => {
    test("receipt with `end`: the deadline passes, then the verdict decides", () => {
      const m = startSettlement({ requestId: "req_m", pendingDeadlineMs: 1000 });
      m.actor.send({ type: "attempt.ended", deliveredNothing: false, verdictDue: true });
      m.clock.increment(5000);
      expect(m.actor.getSnapshot().value).toBe("pending");
      m.actor.send({ type: "receipt.judged", verdict: { label: "verified" } });
      expect(m.settled).toEqual(["verified"]);
    });

    test("late receipt frame: arrived in pending before the deadline; a quarantine verdict decides", () => {
      const m = startSettlement({ requestId: "req_m", pendingDeadlineMs: 1000 });
      m.actor.send({ type: "attempt.ended", deliveredNothing: false, verdictDue: false });
      m.clock.increment(999);
      m.actor.send({ type: "receipt.arrived" });
      m.clock.increment(1);
      expect(m.settled).toEqual([]);
      m.actor.send({ type: "receipt.judged", verdict: { label: "quarantined", reason: "bad_signature" } });
      expect(m.settled).toEqual(["quarantined:bad_signature"]);
    });

    test("without a receipt the deadline still quarantines (no_receipt)", () => {
      const m = startSettlement({ requestId: "req_m", pendingDeadlineMs: 1000 });
      m.actor.send({ type: "attempt.ended", deliveredNothing: false, verdictDue: false });
      m.clock.increment(1000);
      expect(m.settled).toEqual(["quarantined:no_receipt"]);
    });

    test("nothing delivered: zero_settled at once, a verdict due or not", () => {
      const m = startSettlement({ requestId: "req_m", pendingDeadlineMs: 1000 });
      m.actor.send({ type: "attempt.ended", deliveredNothing: true, verdictDue: true });
      expect(m.settled).toEqual(["zero_settled:nothing_delivered"]);
    });
  });
});

describe("settlementStep (the pure transition function)", () => {
  const context: SettlementContext = {
    requestId: "req_t",
    attemptN: 0,
    resumedPending: false,
    pendingDeadlineMs: 1000,
    verdict: null,
    verdictDue: false,
    reason: null,
  };
  const judgedVerified = { ...context, verdict: { label: "verified" } } as const;
  const judgedBad = { ...context, verdict: { label: "quarantined", reason: "bad_signature" } } as const;
  test.each([
    ["running", context, ended(), "pending", null],
    ["running", context, ended(true, true), "zero_settled", "nothing_delivered"],
    ["running", judgedVerified, ended(), "verified", null],
    ["running", judgedBad, ended(), "quarantined", "bad_signature"],
    ["running", context, { type: "attempt.rejected", reason: "measurement_mismatch" }, "quarantined", "measurement_mismatch"],
    ["running", context, DEADLINE, "running", null],
    ["pending", context, verified, "verified", null],
    ["pending", context, quarantined("output_mismatch"), "quarantined", "output_mismatch"],
    ["pending", context, DEADLINE, "quarantined", "no_receipt"],
    ["pending", { ...context, verdictDue: true }, DEADLINE, "pending", null],
    ["verified", context, quarantined("late"), "verified", null],
    ["quarantined", context, verified, "quarantined", null],
  ] as const)("from %s (case %#)", (value, ctx, event, next, reason) => {
    const step = settlementStep(value, ctx, event as SettlementEvent);
    expect(step.value).toBe(next);
    expect(step.context.reason).toBe(reason);
  });

  test("an event that changes nothing returns the same context (no new snapshot)", () => {
    expect(settlementStep("running", context, { type: "receipt.arrived" }).context).toBe(context);
    expect(settlementStep("verified", context, verified).context).toBe(context);
  });
});
