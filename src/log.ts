// Structured JSON logs, one object per line. Callers pass ids and counts only: never prompts,
// outputs or keys (the field names here are the whole vocabulary a log line can carry).
export type LogLevel = "debug" | "info" | "warn" | "error";
export type LogFields = Record<string, string | number | boolean | null | undefined>;

export interface Log {
  debug(event: string, fields?: LogFields): void;
  info(event: string, fields?: LogFields): void;
  warn(event: string, fields?: LogFields): void;
  error(event: string, fields?: LogFields): void;
}

const rank: Record<LogLevel, number> = { debug: 0, info: 1, warn: 2, error: 3 };

export function createLog(level: LogLevel, write: (line: string) => void = (line) => process.stdout.write(line + "\n"), now: () => number = Date.now): Log {
  const at = (l: LogLevel) => (event: string, fields?: LogFields) => {
    if (rank[l] < rank[level]) return;
    write(JSON.stringify({ ts: new Date(now()).toISOString(), level: l, event, ...fields }));
  };
  return { debug: at("debug"), info: at("info"), warn: at("warn"), error: at("error") };
}

export const silentLog: Log = { debug() {}, info() {}, warn() {}, error() {} };
