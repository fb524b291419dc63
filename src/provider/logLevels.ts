// The `level` of each provider runtime log line, so its lines read like the gateway's
// ({ts, level, event, …}; docs/provider-machines.md). Events not listed are `info`.
import type { LogLevel } from "../log.ts";

const LEVELS: Readonly<Record<string, LogLevel>> = {
  // Something the owner should look at; the runtime carries on.
  attempt_error: "warn",
  catalog_expired: "warn",
  catalog_fetch_failed: "warn",
  catalog_pin_unreadable: "warn",
  catalog_pin_write_failed: "warn",
  catalog_refresh_error: "warn",
  catalog_refused: "warn",
  earnings_file_insecure_mode: "warn",
  engine_error: "warn",
  frame_ignored: "warn",
  invalid_frame: "warn",
  key_file_insecure_mode: "warn",
  listener_error: "warn",
  receipt_expired: "warn",
  receipt_outbox_lines_skipped: "warn",
  socket_error: "warn",
  upstream_check_failed: "warn",
  upstream_key_file_insecure_mode: "warn",
  upstream_key_on_command_line: "warn",
  watchdog_timeout: "warn",
  // Lost state: a receipt or earnings record that will not reach its destination.
  earnings_write_failed: "error",
  receipt_dropped: "error",
  receipt_error: "error",
  receipt_outbox_unreadable: "error",
  receipt_outbox_write_failed: "error",
};

export function providerLogLevel(event: string): LogLevel {
  return LEVELS[event] ?? "info";
}
