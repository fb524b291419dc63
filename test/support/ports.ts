// Loopback ports for servers that take no port 0 (redis-server, postgres, nginx).
import { createServer } from "node:net";

/** A port free on 127.0.0.1 right now: the OS picks it, and it is released for the caller to bind at once. */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const port = (server.address() as { port: number }).port;
      server.close(() => resolve(port));
    });
  });
}
