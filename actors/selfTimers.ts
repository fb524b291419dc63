// Timers an actor's own logic (request.ts, settlement.ts) sets on itself, on its actor system's clock
// — SimulatedClock in tests drives them like the system's own delays. When one fires, its event is sent
// to the actor.
//
// Why not `system.scheduler`: it files each timer as a new property named `${sessionId}.${id}` of two
// plain objects, and every actor has a session id of its own, so every request's timers made new
// hidden classes (JSC Structures, ~8 a request, with their property tables) — the request and
// settlement actors' lives cost more than twice as much (docs/benchmarks.md, Measurements behind the code).
// Unlike the scheduler's, these are not cancelled by the actor's stop: its logic calls stopAll when it
// reaches a final state or receives `xstate.stop`. An actor that fails (a thrown step or action: a
// bug) keeps its timers until they fire; XState drops events sent to a stopped actor.
import type { ActorSystem, AnyActorRef, EventObject } from "xstate";

// The system type every root actor gets (xstate exports no name for it).
type AnyActorSystem = ActorSystem<any>;

export interface SelfTimers {
  /** Starts timer `id` of `self` (replacing a running one of that id): `event` goes to `self` after `delay` ms. */
  start(self: AnyActorRef, system: AnyActorSystem, id: string, event: EventObject, delay: number): void;
  stop(self: AnyActorRef, system: AnyActorSystem, id: string): void;
  stopAll(self: AnyActorRef, system: AnyActorSystem): void;
}

/** One per logic; each actor's running timers are one Map, dropped with the actor. */
export function selfTimers(): SelfTimers {
  const running = new WeakMap<AnyActorRef, Map<string, unknown>>();
  const timersOf = (self: AnyActorRef): Map<string, unknown> => {
    let timers = running.get(self);
    if (timers === undefined) running.set(self, (timers = new Map()));
    return timers;
  };
  return {
    start(self, system, id, event, delay) {
      const timers = timersOf(self);
      const previous = timers.get(id);
      if (previous !== undefined) system._clock.clearTimeout(previous);
      const fire = () => {
        timers.delete(id);
        self.send(event);
      };
      timers.set(id, system._clock.setTimeout(fire, delay));
    },
    stop(self, system, id) {
      const timers = running.get(self);
      const handle = timers?.get(id);
      if (handle === undefined) return;
      timers!.delete(id);
      system._clock.clearTimeout(handle);
    },
    stopAll(self, system) {
      const timers = running.get(self);
      if (timers === undefined) return;
      running.delete(self);
      for (const handle of timers.values()) system._clock.clearTimeout(handle);
    },
  };
}
