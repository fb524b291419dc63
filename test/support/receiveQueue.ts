// What the kernel holds for a loopback TCP socket (Linux, /proc/net/tcp): lets a test tell bytes that
// left a server process from bytes still inside it.
import { readFileSync } from "node:fs";

const hexPort = (port: number) => port.toString(16).toUpperCase().padStart(4, "0");

/** The send and receive queues of the IPv4 socket on local port `port` (connected to `remotePort`, when given). */
export function socketQueues(port: number, remotePort?: number): { send: number; receive: number } {
  for (const line of readFileSync("/proc/net/tcp", "utf8").split("\n").slice(1)) {
    const fields = line.trim().split(/\s+/);
    if (!fields[1]?.endsWith(`:${hexPort(port)}`)) continue;
    if (remotePort !== undefined && !fields[2]?.endsWith(`:${hexPort(remotePort)}`)) continue;
    const [send, receive] = fields[4]!.split(":").map((hex) => Number.parseInt(hex, 16));
    return { send: send!, receive: receive! };
  }
  throw new Error(`no IPv4 socket on local port ${port}`);
}

/** Bytes waiting in the receive queue of the IPv4 loopback socket whose local port is `port`. */
export function receiveQueue(port: number): number {
  return socketQueues(port).receive;
}
