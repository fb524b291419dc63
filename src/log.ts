// Structured JSON logs, one object per line. Callers pass ids and counts only: never prompts,
// outputs or keys (the field names here are the whole vocabulary a log line can carry).
import { writeSync } from "node:fs";

export type LogLevel = "debug" | "info" | "warn" | "error";
export type LogFields = Record<string, string | number | boolean | null | undefined>;

export interface Log {
  debug(event: string, fields?: LogFields): void;
  info(event: string, fields?: LogFields): void;
  warn(event: string, fields?: LogFields): void;
  error(event: string, fields?: LogFields): void;
}

const rank: Record<LogLevel, number> = { debug: 0, info: 1, warn: 2, error: 3 };

let pendingStdout = "";
const flushStdout = () => {
  const text = pendingStdout;
  pendingStdout = "";
  if (text !== "") process.stdout.write(text);
};
let exitFlush = false;

/**
 * The default sink, and the provider runtime's stdout. Lines made in one event-loop turn are written
 * together when the turn ends (setImmediate), so a line never delays the response or frame that its
 * turn produced. A line still waiting at exit is written synchronously then; the timestamp is taken when
 * the line is made, not written.
 */
export function stdoutAtEndOfTurn(line: string): void {
  if (!exitFlush) {
    exitFlush = true;
    process.on("exit", () => {
      try {
        if (pendingStdout !== "") writeSync(1, pendingStdout);
      } catch {} // stdout already closed: nothing is left to tell
      pendingStdout = "";
    });
  }
  if (pendingStdout === "") setImmediate(flushStdout);
  pendingStdout += line + "\n";
}

export function createLog(level: LogLevel, write: (line: string) => void = stdoutAtEndOfTurn, now: () => number = Date.now): Log {
  const at = (l: LogLevel) => (event: string, fields?: LogFields) => {
    if (rank[l] < rank[level]) return;
    write(JSON.stringify({ ts: new Date(now()).toISOString(), level: l, event, ...fields }));
  };
  return { debug: at("debug"), info: at("info"), warn: at("warn"), error: at("error") };
}

export const silentLog: Log = { debug() {}, info() {}, warn() {}, error() {} };

