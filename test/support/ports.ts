// Loopback ports for servers that take no port 0 (redis-server, postgres, nginx) or that must come back
// on the same port after a kill (the chaos runs' gateways and nodes).
import { readFileSync } from "node:fs";
import { createServer } from "node:net";

/**
 * The lowest port the kernel hands out for outgoing connections. A port picked below it cannot be taken
 * by one of the machine's own outgoing connections between the pick and the bind (or while a killed
 * server is down before its restart): with port 0, the kernel picks from that very range.
 */
function ephemeralLow(): number {
  try {
    const low = Number(readFileSync("/proc/sys/net/ipv4/ip_local_port_range", "utf8").trim().split(/\s+/)[0]);
    return Number.isInteger(low) && low > 2048 ? low : 32768;
  } catch {
    return 32768;
  }
}

const LOW = ephemeralLow();
const FROM = Math.max(1024, LOW - 12_000);

function bindable(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const server = createServer();
    server.once("error", () => resolve(false));
    server.listen(port, "127.0.0.1", () => server.close(() => resolve(true)));
  });
}

/** A port free on 127.0.0.1 right now, below the kernel's outgoing-connection range; the caller binds it at once. */
export async function freePort(): Promise<number> {
  for (let tries = 0; tries < 200; tries++) {
    const port = FROM + Math.floor(Math.random() * (LOW - FROM));
    if (await bindable(port)) return port;
  }
  throw new Error(`no free port in ${FROM}–${LOW - 1}`);
}
