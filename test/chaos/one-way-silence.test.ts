// The test TCP proxy's one-way cuts (test/support/tcpProxy.ts): `dialer-silent` holds what the dialing
// side sends while the listener's bytes still reach it, `listener-silent` the reverse; neither closes
// anything, a new connection forms only once restored, and the restore delivers what waited, in order.
// The cluster chaos's `oneway` mode holds a node link silent in one direction with them.
import { afterEach, expect, test } from "bun:test";
import { connect, createServer, type Server, type Socket } from "node:net";
import { waitFor } from "../support/harness.ts";
import { startTcpProxy, type TcpProxy } from "../support/tcpProxy.ts";

/** A listener that keeps what each connection sent and whether it closed. */
interface Listener {
  server: Server;
  port: number;
  accepted: { socket: Socket; text: string; closed: boolean }[];
}

async function listen(): Promise<Listener> {
  const accepted: Listener["accepted"] = [];
  const server = createServer((socket) => {
    const conn = { socket, text: "", closed: false };
    accepted.push(conn);
    socket.on("data", (bytes) => (conn.text += bytes.toString()));
    socket.on("close", () => (conn.closed = true));
    socket.on("error", () => {});
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return { server, port: (server.address() as { port: number }).port, accepted };
}

/** A dialer through the proxy that keeps what it read and whether it closed. */
async function dial(port: number) {
  const socket = connect(port, "127.0.0.1");
  socket.on("error", () => {});
  const conn = { socket, text: "", closed: false };
  socket.on("data", (bytes) => (conn.text += bytes.toString()));
  socket.on("close", () => (conn.closed = true));
  await new Promise<void>((resolve) => socket.once("connect", () => resolve()));
  return conn;
}

/** A window in which bytes that are not held would have crossed loopback many times over. */
const settle = () => Bun.sleep(300);

const cleanup: (() => unknown)[] = [];
afterEach(async () => {
  for (const f of cleanup.splice(0).reverse()) await f();
});

async function setup() {
  const listener = await listen();
  cleanup.push(() => listener.server.close());
  const proxy: TcpProxy = await startTcpProxy(listener.port, { holdCloses: true });
  cleanup.push(() => proxy.stop());
  const dialer = await dial(proxy.port);
  cleanup.push(() => dialer.socket.destroy());
  dialer.socket.write("hello");
  await waitFor(() => listener.accepted[0]?.text === "hello", 5000, "the first bytes through");
  return { listener, proxy, dialer, accepted: listener.accepted[0]! };
}

test("dialer-silent: the listener's bytes reach the dialer, the dialer's wait for the restore, nothing closes", async () => {
  const { listener, proxy, dialer, accepted } = await setup();
  await proxy.cut("dialer-silent");
  dialer.socket.write(" held");
  accepted.socket.write("flows");
  await waitFor(() => dialer.text === "flows", 5000, "the listener's bytes at the dialer");
  // The dialer hangs up: that close travels the silent way too.
  dialer.socket.end();
  await settle();
  expect(accepted.text).toBe("hello");
  expect(accepted.closed).toBe(false);
  // A new connection does not form while the cut lasts.
  const late = await dial(proxy.port);
  cleanup.push(() => late.socket.destroy());
  late.socket.write("late");
  await settle();
  expect(listener.accepted.length).toBe(1);

  await proxy.restore();
  await waitFor(() => accepted.closed, 5000, "the held close delivered");
  expect(accepted.text).toBe("hello held");
  await waitFor(() => listener.accepted[1]?.text === "late", 5000, "the late connection formed");
});

test("listener-silent: the dialer's bytes reach the listener, the listener's wait for the restore", async () => {
  const { listener, proxy, dialer, accepted } = await setup();
  await proxy.cut("listener-silent");
  accepted.socket.write("held");
  dialer.socket.write(" flows");
  await waitFor(() => accepted.text === "hello flows", 5000, "the dialer's bytes at the listener");
  await settle();
  expect(dialer.text).toBe("");
  expect(dialer.closed).toBe(false);
  const late = await dial(proxy.port);
  cleanup.push(() => late.socket.destroy());
  await settle();
  expect(listener.accepted.length).toBe(1);

  await proxy.restore();
  await waitFor(() => dialer.text === "held", 5000, "the held bytes delivered");
  await waitFor(() => listener.accepted.length === 2, 5000, "the late connection formed");
  // Both ways flow again, once each (no byte copied twice by a second pipe).
  dialer.socket.write("!");
  accepted.socket.write("!");
  await waitFor(() => accepted.text === "hello flows!" && dialer.text === "held!", 5000, "both ways after the restore");
  await settle();
  expect(accepted.text).toBe("hello flows!");
  expect(dialer.text).toBe("held!");
});

test("a cut of the open connections only (a NAT that lost one mapping): the old one stays silent, a new one forms and flows", async () => {
  const { listener, proxy, dialer, accepted } = await setup();
  await proxy.cut("dialer-silent", undefined, { open: true });
  dialer.socket.write(" held");
  accepted.socket.write("flows");
  await waitFor(() => dialer.text === "flows", 5000, "the listener's bytes at the dialer");
  const fresh = await dial(proxy.port);
  cleanup.push(() => fresh.socket.destroy());
  fresh.socket.write("fresh");
  await waitFor(() => listener.accepted[1]?.text === "fresh", 5000, "the new connection formed, its bytes through");
  listener.accepted[1]!.socket.write("back");
  await waitFor(() => fresh.text === "back", 5000, "the new connection's other way");
  expect(accepted.text).toBe("hello");

  await proxy.restore();
  await waitFor(() => accepted.text === "hello held", 5000, "the held bytes delivered");
});
