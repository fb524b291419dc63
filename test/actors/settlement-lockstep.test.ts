// The settlement statechart is the definition; `settlementLogic` (the gateway's hot path) is the same
// chart compiled by hand. Both are driven with the same seeded random event sequences and the pending
// deadline on a simulated clock; after every event they must agree on state, status, context, output,
// the `settle` effects (in order, with the context each saw) and the armed timers. Every transition of
// the chart must be taken.
import { describe, expect, test } from "bun:test";
import type { QuarantineReason } from "../../src/receipts/verify.ts";
import { createActor, type AnyActorRef } from "xstate";
import {
  providedSettlementMachine,
  settlementLogic,
  settlementMachine,
  type SettlementEffects,
  type SettlementEvent,
  type SettlementInput,
} from "../../actors/settlement.ts";
import { recordTransitions, seeded, TrackingClock, transitionsOf, type Random } from "../support/lockstep.ts";

interface Side {
  actor: AnyActorRef;
  clock: TrackingClock;
  effects: string[];
}

function start(kind: "statechart" | "logic", input: SettlementInput, taken: Set<string>): Side {
  const clock = new TrackingClock();
  const effects: string[] = [];
  const settle: SettlementEffects = { settle: (label, context) => void effects.push(JSON.stringify([label, context])) };
  const logic = kind === "statechart" ? providedSettlementMachine(settle) : settlementLogic(settle);
  const options = { input, clock, ...(kind === "statechart" ? { inspect: recordTransitions(taken) } : {}) };
  // Two logics of one actor type: createActor's overloads take them one at a time.
  const actor: AnyActorRef = (kind === "statechart" ? createActor(logic as ReturnType<typeof providedSettlementMachine>, options) : createActor(logic as ReturnType<typeof settlementLogic>, options)).start();
  return { actor, clock, effects };
}

const REASONS: QuarantineReason[] = ["bad_signature", "output_mismatch", "billable_above_observed"];

function nextEvent(r: Random): SettlementEvent {
  return r.pick<() => SettlementEvent>([
    () => ({ type: "attempt.ended", deliveredNothing: r.chance(0.2), verdictDue: r.chance(0.5) }),
    () => ({ type: "attempt.ended", deliveredNothing: false, verdictDue: r.chance(0.5) }),
    () => ({ type: "receipt.arrived" }),
    () => ({ type: "receipt.judged", verdict: { label: "verified" } }),
    () => ({ type: "receipt.judged", verdict: { label: "quarantined", reason: r.pick(REASONS) } }),
    () => ({ type: "attempt.rejected", reason: "measurement_mismatch" }),
  ])();
}

function observe(side: Side) {
  const s = side.actor.getSnapshot();
  return { value: s.value, status: s.status, context: s.context, output: s.output ?? null, effects: side.effects, timers: side.clock.timers(new Map()) };
}

describe("the settlement statechart and settlementLogic in lockstep", () => {
  const SEQUENCES = 500;
  const taken = new Set<string>();

  test(`${SEQUENCES} seeded random sequences: same state, context, output, effects and timers after every event`, () => {
    let events = 0;
    for (let seed = 1; seed <= SEQUENCES; seed++) {
      const r = seeded(seed);
      const input: SettlementInput = { requestId: `req_${seed}`, attemptN: r.int(0, 2), resumedPending: r.chance(0.2), pendingDeadlineMs: r.int(-5, 500) };
      const chart = start("statechart", input, taken);
      const logic = start("logic", input, taken);
      const check = (where: string) => {
        const seen = observe(chart);
        const other = observe(logic);
        if (JSON.stringify(seen) !== JSON.stringify(other)) expect({ where, ...other }).toEqual({ where, ...seen });
      };
      check(`seed ${seed}: start`);
      for (let step = 0; step < 20 && chart.actor.getSnapshot().status === "active"; step++) {
        let label: string;
        if (r.chance(0.3)) {
          const due = chart.clock.nextDue();
          const to = due !== null && r.chance(0.6) ? due : chart.clock.now() + r.int(0, 300);
          chart.clock.set(to);
          logic.clock.set(to);
          label = `clock → ${to}`;
        } else {
          const event = nextEvent(r);
          chart.actor.send(event);
          logic.actor.send(event);
          label = JSON.stringify(event);
        }
        events++;
        check(`seed ${seed}, step ${step}: ${label}`);
      }
    }
    expect(events).toBeGreaterThan(SEQUENCES * 2);
  }, 60_000);

  test("every transition of the chart was taken", () => {
    const all = transitionsOf(settlementMachine);
    expect([...all].filter((t) => !taken.has(t))).toEqual([]);
    expect(all.size).toBe(11);
  });
});
