// Engines a test process starts (PostgreSQL, Redis) outlive it when it is killed with SIGKILL (a
// timed-out run, a killed CI job): no exit handler runs. A watchdog per engine, in a session of its
// own so a signal to the test's process group spares it, waits for the test process to go and then
// runs the engine's stop command. It checks every second; a stop that already ran makes it a no-op.
import { spawn } from "node:child_process";

/** Runs `stopScript` (sh) once this process has exited, whichever way it exits. */
export function stopWhenTestProcessDies(stopScript: string): void {
  const watch = `while kill -0 ${process.pid} 2>/dev/null; do sleep 1; done; ${stopScript}`;
  const child = spawn("setsid", ["sh", "-c", watch], { detached: true, stdio: "ignore" });
  child.on("error", () => {}); // without setsid there is no watchdog, as before
  child.unref();
}

/** Quotes a value for sh. */
export const shQuote = (value: string) => `'${value.replace(/'/g, "'\\''")}'`;
