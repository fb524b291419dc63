// The request statechart is the definition; `requestLogic` (the gateway's hot path) is the same chart
// compiled by hand. This test drives both with the same seeded random event sequences — edge events,
// buyer aborts and timers on a simulated clock — and after every event requires the same state,
// context, effects (in order, with the context and event each saw) and armed timers. It also requires
// every transition of the chart to have been taken.
import { describe, expect, test } from "bun:test";
import { createActor, type AnyActorRef } from "xstate";
import {
  providedRequestMachine,
  requestLogic,
  requestMachine,
  type RequestActions,
  type RequestContext,
  type RequestDelays,
  type RequestEvent,
  type RequestInput,
} from "../../actors/request.ts";
import type { ChunkFrame, DeclineCode, EndFrame, TerminalState } from "../../src/wire/frames.ts";
import { recordTransitions, seeded, TrackingClock, transitionsOf, type Random } from "../support/lockstep.ts";

const ACTIONS = [
  "dispatchAttempt",
  "abandonDispatch",
  "relayChunk",
  "openProgressWindow",
  "discardPartialOutput",
  "keepAnswer",
  "finishSuccess",
  "finishFailure",
  "finishMidStreamError",
  "cancelAttempt",
  "releaseAttempt",
] as const satisfies readonly (keyof RequestActions)[];

/** Effects as text: the action, its params, the context and the event it saw. */
function recorder(log: string[]): RequestActions {
  const actions = {} as Record<string, unknown>;
  for (const name of ACTIONS) {
    actions[name] = ({ context, event }: { context: RequestContext; event: { type: string } }, params?: unknown) =>
      log.push(JSON.stringify([name, params ?? null, event.type, context]));
  }
  return actions as unknown as RequestActions;
}

const PROVIDERS = ["p1", "p2", "p3", "p4"];
const FAILURES = ["model_not_available", "coordinator_unavailable", "context_length_exceeded", "unsupported_parameter", "internal_error"] as const;
const DECLINES: DeclineCode[] = ["queue_full", "model_not_loaded", "internal"] as DeclineCode[];
const TERMINALS: TerminalState[] = ["normal_done", "normal_done", "provider_error", "upstream_transport_disconnect"];

function chunk(r: Random, c: RequestContext): ChunkFrame {
  return { type: "chunk", request_id: c.requestId, attempt_n: c.current?.attemptN ?? 0, seq: r.chance(0.8) ? 0 : r.int(1, 3), tokens: r.int(0, c.maxTokens + 2) };
}
function ended(r: Random, c: RequestContext): EndFrame {
  return {
    type: "end",
    request_id: c.requestId,
    attempt_n: c.current?.attemptN ?? 0,
    terminal_state: r.pick(TERMINALS),
    finish_reason: "stop",
    usage: { input_tokens: r.int(0, 9), output_tokens: r.int(0, 9) },
  };
}

let rareTurn = 0;

/** An event for the request in `state`: mostly one that state handles, sometimes any at all. */
function nextEvent(r: Random, state: string, c: RequestContext): RequestEvent {
  const any: (() => RequestEvent)[] = [
    () => ({ type: "route.dispatched", attempt: { attemptN: c.nextAttemptN, sessionId: `s-${c.nextAttemptN}`, providerId: r.pick(PROVIDERS) } }),
    () => ({ type: "route.unavailable", code: r.pick(FAILURES), message: `m${r.int(0, 9)}` }),
    () => ({ type: "route.failed" }),
    () => ({ type: "provider.rejected" }),
    () => ({ type: "provider.declined", code: r.pick(DECLINES) }),
    () => ({ type: "provider.chunk", frame: chunk(r, c) }),
    () => ({ type: "stream.progress" }),
    () => ({ type: "stream.seqError" }),
    () => ({ type: "stream.lengthLimited" }),
    () => ({ type: "provider.ended", frame: ended(r, c) }),
    () => ({ type: "provider.lost" }),
    () => ({ type: "buyer.aborted" }),
  ];
  const likely: Record<string, number[]> = {
    routing: [0, 0, 0, 0, 0, 0, 0, 0, 1, 2],
    awaitingFirstByte: [3, 4, 5, 5, 5, 5, 9, 9, 10],
    receiving: [6, 6, 6, 7, 8, 9, 9, 10],
  };
  const choices = likely[state];
  // A buyer's abort, or every other time the cluster node's fence: both end the request, so the
  // sequences (and the transitions they reach) are the same with either; no extra draw.
  if (r.chance(0.02)) return rareTurn++ % 2 === 0 ? any[11]!() : { type: "node.fenced" };
  if (!choices || r.chance(0.06)) return r.pick(any)();
  return any[r.pick(choices)]!();
}

interface Side {
  actor: AnyActorRef;
  clock: TrackingClock;
  effects: string[];
}

function start(kind: "statechart" | "logic", input: RequestInput, delays: RequestDelays, taken: Set<string>): Side {
  const clock = new TrackingClock();
  const effects: string[] = [];
  const logic = kind === "statechart" ? providedRequestMachine(recorder(effects), delays) : requestLogic(recorder(effects), delays);
  const options = { input, clock, ...(kind === "statechart" ? { inspect: recordTransitions(taken) } : {}) };
  // Two logics of one actor type: createActor's overloads take them one at a time.
  const actor: AnyActorRef = (kind === "statechart" ? createActor(logic as ReturnType<typeof providedRequestMachine>, options) : createActor(logic as ReturnType<typeof requestLogic>, options)).start();
  return { actor, clock, effects };
}

/** What is compared after every event: state, status, context, the effects so far, the armed timers. */
function observe(side: Side, nameOfDelay: Map<number, string>) {
  const s = side.actor.getSnapshot();
  return { value: s.value, status: s.status, context: s.context, effects: side.effects, timers: side.clock.timers(nameOfDelay) };
}

function compare(a: Side, b: Side, nameOfDelay: Map<number, string>, where: string): void {
  const seen = observe(a, nameOfDelay);
  const other = observe(b, nameOfDelay);
  // Compared as text first (fast); on a difference, expect() shows it field by field.
  if (JSON.stringify(seen) !== JSON.stringify(other)) expect({ where, ...other }).toEqual({ where, ...seen });
}

/** Distinct delays, so an armed timer is known by its delay; short enough for timers to fire often. */
function delaysFor(r: Random): RequestDelays {
  for (;;) {
    const d = { firstByteTimeout: r.int(20, 400), streamIdleCheck: r.int(5, 150), requestDeadline: r.int(200, 2_000) };
    if (new Set(Object.values(d)).size === 3) return d;
  }
}

describe("the request statechart and requestLogic in lockstep", () => {
  const SEQUENCES = 1_000;
  const taken = new Set<string>();
  let events = 0;

  test(`${SEQUENCES} seeded random sequences: same state, context, effects and timers after every event`, () => {
    for (let seed = 1; seed <= SEQUENCES; seed++) {
      const r = seeded(seed);
      const input: RequestInput = { requestId: `req_${seed}`, streaming: r.chance(0.6), maxTokens: r.int(1, 6), maxAttempts: r.int(1, 4) };
      const delays = delaysFor(r);
      const nameOfDelay = new Map(Object.entries(delays).map(([name, ms]) => [ms, name]));
      const chart = start("statechart", input, delays, taken);
      const logic = start("logic", input, delays, taken);
      compare(chart, logic, nameOfDelay, `seed ${seed}: start`);
      for (let step = 0; step < 60 && chart.actor.getSnapshot().status === "active"; step++) {
        const snapshot = chart.actor.getSnapshot();
        let label: string;
        if (r.chance(0.3)) {
          // Time passes: to the next timer (when it is the only one due then), or by a random amount.
          const due = chart.clock.nextDue();
          const to = due !== null && r.chance(0.7) ? due : chart.clock.now() + r.int(1, 60);
          const pastTie = [...chart.clock.armed.values()].some((t) => t.dueAt <= to && t.dueAt !== due);
          const target = pastTie && due !== null ? due : to;
          chart.clock.set(target);
          logic.clock.set(target);
          label = `clock → ${target}`;
        } else {
          const event = nextEvent(r, String(snapshot.value), snapshot.context as RequestContext);
          chart.actor.send(event);
          logic.actor.send(event);
          label = JSON.stringify(event);
        }
        events++;
        compare(chart, logic, nameOfDelay, `seed ${seed}, step ${step}: ${label}`);
      }
    }
    expect(events).toBeGreaterThan(SEQUENCES * 2);
  }, 60_000);

  test("every transition of the chart was taken", () => {
    const all = transitionsOf(requestMachine);
    const missing = [...all].filter((t) => !taken.has(t));
    expect(missing).toEqual([]);
    expect(all.size).toBe(29);
  });
});
