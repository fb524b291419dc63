// The inspector relay (`bun run inspect:relay`) listens on 127.0.0.1 unless the operator names another
// host, and relays what the gateway sends to the browser page's socket.
import { afterEach, expect, test } from "bun:test";
import { networkInterfaces } from "node:os";
import { join } from "node:path";
import { relayOptionsFrom, startInspectorRelay } from "../../src/inspectRelay.ts";

const root = join(import.meta.dir, "../..");
let cleanups: Array<() => unknown> = [];
afterEach(async () => {
  for (const cleanup of cleanups.reverse()) await cleanup();
  cleanups = [];
});

/** This machine's first non-loopback IPv4 address, if it has one. */
const outsideAddress = Object.values(networkInterfaces())
  .flat()
  .find((a) => a && a.family === "IPv4" && !a.internal)?.address;

async function reachable(host: string, port: number): Promise<boolean> {
  try {
    const socket = await Bun.connect({ hostname: host, port, socket: { data() {} } });
    socket.end();
    return true;
  } catch {
    return false;
  }
}

async function spawnRelay(args: string[]) {
  const proc = Bun.spawn(["bun", "run", "inspect:relay", "--port", "0", ...args], { cwd: root, stdout: "ignore", stderr: "pipe" });
  cleanups.push(async () => {
    proc.kill();
    await proc.exited;
  });
  let text = "";
  for await (const bytes of proc.stderr as ReadableStream<Uint8Array>) {
    text += new TextDecoder().decode(bytes);
    if (/relay on .*\n/.test(text)) break;
  }
  const match = /relay on ws:\/\/(\S+):(\d+)/.exec(text)!;
  return { host: match[1]!, port: Number(match[2]) };
}

test("the relay script binds 127.0.0.1 by default, not every interface", async () => {
  const relay = await spawnRelay([]);
  expect(relay.host).toBe("127.0.0.1");
  expect(await reachable("127.0.0.1", relay.port)).toBe(true);
  if (outsideAddress) expect(await reachable(outsideAddress, relay.port)).toBe(false);
  else console.warn("inspector-relay test: no non-loopback IPv4 interface here; only the bound host was checked");
});

test("another host only when asked for explicitly", async () => {
  expect(relayOptionsFrom([], {})).toEqual({ host: undefined, port: undefined });
  expect(relayOptionsFrom(["--host", "0.0.0.0", "--port=9100"], {})).toEqual({ host: "0.0.0.0", port: 9100 });
  expect(relayOptionsFrom([], { INSPECT_HOST: "::1", INSPECT_PORT: "9000" })).toEqual({ host: "::1", port: 9000 });
  const relay = await spawnRelay(["--host", "0.0.0.0"]);
  expect(relay.host).toBe("0.0.0.0");
  if (outsideAddress) expect(await reachable(outsideAddress, relay.port)).toBe(true);
});

test("what the gateway sends reaches the browser page's socket, and a late page gets the recent events", async () => {
  const relay = startInspectorRelay({ port: 0 });
  cleanups.push(() => relay.stop());
  const page = await fetch(`http://127.0.0.1:${relay.port}/`).then((r) => r.text());
  expect(page).toContain(`ws://127.0.0.1:${relay.port}`);
  const open = (url: string) =>
    new Promise<WebSocket>((resolve, reject) => {
      const ws = new WebSocket(url);
      ws.onopen = () => resolve(ws);
      ws.onerror = () => reject(new Error("relay socket failed"));
    });
  const url = `ws://127.0.0.1:${relay.port}`;
  const gateway = await open(url);
  const browser = await open(url);
  const got: string[] = [];
  browser.onmessage = (m) => got.push(String(m.data));
  gateway.send('{"type":"@xstate.event","n":1}');
  while (got.length < 1) await Bun.sleep(5);
  expect(got).toEqual(['{"type":"@xstate.event","n":1}']);
  const late = await open(url);
  const replayed: string[] = [];
  late.onmessage = (m) => replayed.push(String(m.data));
  while (replayed.length < 1) await Bun.sleep(5);
  expect(replayed).toEqual(['{"type":"@xstate.event","n":1}']);
  for (const ws of [gateway, browser, late]) ws.close();
});
