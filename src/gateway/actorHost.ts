// One XState actor system shared by many actors of one kind (the request actors, the settlement
// actors). A root actor builds a system of its own (two Maps, a WeakMap, a Set, a scheduler and ~15
// closures: ~1.3 KB, and ~11 µs to create), and a live stream holds two actors; an actor started with
// `parent: host` uses the host's system instead (docs/benchmarks.md, "Per-stream memory pass").
// The host is silent: it starts before the inspector is attached, so an inspector sees the actors,
// never the host. It takes its actors' done and error events and drops them — the edges observe
// their actors — except where nobody observes an actor's errors (`unobservedErrors: "throw"`), which it
// reports as XState reports a root actor's: thrown on a later turn.
import { createActor, type ActorLogic, type ActorOptions, type AnyActorLogic, type AnyActorRef, type AnyEventObject, type InspectionEvent, type Snapshot } from "xstate";

export interface ActorHostOptions {
  /** The actors' clock (tests pass a SimulatedClock); default the real one. */
  clock?: ActorOptions<AnyActorLogic>["clock"];
  inspect?: (event: InspectionEvent) => void;
  /** "ignore": every actor's owner subscribes to its errors; "throw": none does. */
  unobservedErrors: "ignore" | "throw";
}

type HostSnapshot = Snapshot<undefined>;

function hostLogic(unobservedErrors: ActorHostOptions["unobservedErrors"]): ActorLogic<HostSnapshot, AnyEventObject, undefined, any> {
  return {
    transition: (snapshot, event) => {
      if (unobservedErrors === "throw" && event.type.startsWith("xstate.error.actor.")) {
        const { error } = event as { error?: unknown };
        setTimeout(() => {
          throw error;
        });
      }
      return snapshot;
    },
    getInitialSnapshot: () => ({ status: "active", output: undefined, error: undefined }),
    getPersistedSnapshot: (snapshot) => snapshot,
  };
}

/** A started host: pass it as `parent` to createActor for every actor that should share its system. */
export function actorHost(options: ActorHostOptions): AnyActorRef {
  const host = createActor(hostLogic(options.unobservedErrors), options.clock ? { clock: options.clock } : {}).start();
  const inspect = options.inspect;
  if (inspect) {
    const views = new WeakMap<AnyActorRef, AnyActorRef>();
    host.system.inspect((event) => {
      // The host stays silent: its actors' done events reach it, but not the inspector.
      if (event.actorRef !== host) inspect(asRootActorEvent(host, views, event));
    });
  }
  return host;
}

/**
 * The inspector is never told of the host, so its actors are shown as the root actors they were
 * before they shared it: an event of a hosted actor names the actor itself as its root, and its
 * actor no parent (a view of the actor whose `_parent` is unset; everything else reads through). One
 * view per actor, so an inspector can still tell actors apart by identity.
 */
function asRootActorEvent(host: AnyActorRef, views: WeakMap<AnyActorRef, AnyActorRef>, event: InspectionEvent): InspectionEvent {
  const actor = event.actorRef as AnyActorRef & { _parent?: AnyActorRef };
  if (actor._parent !== host) return event;
  let view = views.get(actor);
  if (view === undefined) {
    view = Object.create(actor, { _parent: { value: undefined } }) as AnyActorRef;
    views.set(actor, view);
  }
  return { ...event, rootId: actor.sessionId, actorRef: view } as InspectionEvent;
}
