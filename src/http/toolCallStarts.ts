// Streamed tool calls for the facades, whose wire shapes name a call once, when it starts (a messages
// `tool_use` block, a responses `function_call` item). The chat stream may split a name over several
// deltas; the OpenAI streaming format defines the name as the concatenation of its fragments. So a call
// starts only once its name is complete: at its first arguments fragment, or when any other output
// (text, another call, the end) follows it. Name fragments after that are ignored (docs/facades.md).
import type { ToolCallDelta } from "../wire/frames.ts";

export interface StartedToolCall {
  /** The provider's index of the call. */
  index: number;
  /** The first id given, if any. */
  id: string | undefined;
  /** Every name fragment given before the call started, concatenated. */
  name: string;
}

export class ToolCallStarts {
  /** Calls seen but not started, in the order first seen. */
  private readonly pending = new Map<number, StartedToolCall>();
  private readonly started = new Set<number>();

  constructor(private readonly onStart: (call: StartedToolCall) => void) {}

  /**
   * Takes one delta; returns its arguments fragment when it should be written now (the call has
   * started), or undefined. A delta of one call starts every other call still pending first.
   */
  take(d: ToolCallDelta): string | undefined {
    if (!this.started.has(d.index)) {
      for (const other of [...this.pending.keys()]) if (other !== d.index) this.startPending(other);
      let call = this.pending.get(d.index);
      if (call === undefined) {
        call = { index: d.index, id: undefined, name: "" };
        this.pending.set(d.index, call);
      }
      if (call.id === undefined && d.id !== undefined) call.id = d.id;
      if (d.name !== undefined) call.name += d.name;
      if (d.arguments === undefined || d.arguments === "") return undefined;
      this.startPending(d.index);
    }
    return d.arguments === "" ? undefined : d.arguments;
  }

  /** Starts every pending call (before text, and at the end of the stream). */
  flush(): void {
    for (const index of [...this.pending.keys()]) this.startPending(index);
  }

  private startPending(index: number): void {
    const call = this.pending.get(index);
    if (call === undefined) return;
    this.pending.delete(index);
    this.started.add(index);
    this.onStart(call);
  }
}
