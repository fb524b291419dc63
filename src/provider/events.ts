// Observability and test hooks of the provider runtime: a tiny typed emitter.
import type { CancelFrame, SettledFrame, WelcomeFrame } from "../wire/frames.ts";

export interface RuntimeEvents {
  welcome: (frame: WelcomeFrame) => void;
  job: (requestId: string, attemptN: number) => void;
  cancel: (requestId: string, attemptN: number, reason: CancelFrame["reason"]) => void;
  closed: (code: number, reason: string) => void;
  drain: () => void;
  settled: (frame: SettledFrame) => void;
  /** The gateway answered the watchdog's ping: the socket is alive. */
  pong: () => void;
}

type Listener = (...args: never[]) => void;

export class Emitter<Events extends { [K in keyof Events]: Listener }> {
  private readonly listeners = new Map<keyof Events, Set<Listener>>();
  /** Called when a listener throws: a faulty hook must never break the session. */
  onListenerError: (event: string) => void = () => {};

  on<E extends keyof Events>(event: E, fn: Events[E]): () => void {
    let set = this.listeners.get(event);
    if (!set) this.listeners.set(event, (set = new Set()));
    set.add(fn);
    return () => set.delete(fn);
  }

  emit<E extends keyof Events>(event: E, ...args: Parameters<Events[E]>): void {
    for (const fn of this.listeners.get(event) ?? []) {
      try {
        (fn as (...a: Parameters<Events[E]>) => void)(...args);
      } catch {
        this.onListenerError(String(event));
      }
    }
  }
}

/** Structured logger (one JSON line per call in the CLI). Fields never hold prompts, outputs or keys. */
export type LogFn = (event: string, fields: Record<string, unknown>) => void;
