// What the kernel holds for a loopback TCP socket that its process has not read yet (Linux,
// /proc/net/tcp): lets a test tell bytes that left a server from bytes still inside it.
import { readFileSync } from "node:fs";

/** Bytes waiting in the receive queue of the IPv4 loopback socket whose local port is `port`. */
export function receiveQueue(port: number): number {
  const hex = port.toString(16).toUpperCase().padStart(4, "0");
  for (const line of readFileSync("/proc/net/tcp", "utf8").split("\n").slice(1)) {
    const fields = line.trim().split(/\s+/);
    if (fields[1]?.endsWith(`:${hex}`)) return Number.parseInt(fields[4]!.split(":")[1]!, 16);
  }
  throw new Error(`no IPv4 socket on local port ${port}`);
}
