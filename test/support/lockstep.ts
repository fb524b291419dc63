// Lockstep runs of a statechart and the hand-compiled logic that stands in for it on the hot path
// (actors/request.ts, actors/settlement.ts): helpers shared by the two lockstep tests.
import { SimulatedClock, type AnyStateMachine, type InspectionEvent } from "xstate";

/** A small seeded PRNG (mulberry32): the same seed gives the same event sequence. */
export function seeded(seed: number) {
  let a = seed >>> 0;
  const next = (): number => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  return {
    next,
    int: (lo: number, hi: number): number => lo + Math.floor(next() * (hi - lo + 1)),
    pick: <T>(items: readonly T[]): T => items[Math.floor(next() * items.length)]!,
    chance: (p: number): boolean => next() < p,
  };
}
export type Random = ReturnType<typeof seeded>;

/** A SimulatedClock that knows which timeouts are armed and when each is due. */
export class TrackingClock extends SimulatedClock {
  readonly armed = new Map<unknown, { delay: number; dueAt: number }>();

  override setTimeout(fn: (...args: unknown[]) => void, timeout: number): number {
    const id = super.setTimeout(() => {
      this.armed.delete(id);
      fn();
    }, timeout);
    this.armed.set(id, { delay: timeout, dueAt: this.now() + timeout });
    return id as number;
  }

  override clearTimeout(id: number): void {
    this.armed.delete(id);
    super.clearTimeout(id);
  }

  /** The armed timers as `name@dueAt`, sorted, each named by its delay (the delays of one run are distinct). */
  timers(nameOfDelay: ReadonlyMap<number, string>): string[] {
    return [...this.armed.values()].map((t) => `${nameOfDelay.get(t.delay) ?? `?${t.delay}`}@${t.dueAt}`).sort();
  }

  /** The earliest due time, when it is the only timer due then (so the order timers fire in is not a tie). */
  nextDue(): number | null {
    const due = [...this.armed.values()].map((t) => t.dueAt).sort((x, y) => x - y);
    if (due.length === 0) return null;
    return due[0] === due[1] ? null : due[0]!;
  }
}

/** Every transition of a machine, as `source|event|index` (eventless ones under `always`; delayed ones under their `xstate.after.*` event). */
export function transitionsOf(machine: AnyStateMachine): Set<string> {
  const out = new Set<string>();
  const visit = (node: AnyStateMachine["root"]) => {
    for (const [eventType, list] of node.transitions) list.forEach((_, i) => out.add(`${node.id}|${eventType}|${i}`));
    node.always?.forEach((_, i) => out.add(`${node.id}|always|${i}`));
    for (const child of Object.values(node.states)) visit(child);
  };
  visit(machine.root);
  return out;
}

/** An inspect observer that adds each transition a machine takes to `taken` (in the `transitionsOf` naming). */
export function recordTransitions(taken: Set<string>) {
  return (event: InspectionEvent) => {
    if (event.type !== "@xstate.microstep") return;
    for (const t of (event as unknown as { _transitions: { source: AnyStateMachine["root"]; eventType: string }[] })._transitions) {
      const list = t.eventType === "" ? t.source.always : t.source.transitions.get(t.eventType);
      const i = list?.indexOf(t as never) ?? -1;
      taken.add(`${t.source.id}|${t.eventType === "" ? "always" : t.eventType}|${i}`);
    }
  };
}
