// The provider runtime's ping/pong watchdog: a socket that dies without a close (half-open link, a
// sleeping machine, a connect that never completes) is dropped and replaced within bounded time.
import { afterEach, expect, test } from "bun:test";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { loadOrCreateProviderKey } from "../../src/provider/keys.ts";
import { startProviderRuntime, type ProviderRuntimeOptions } from "../../src/provider/runtime.ts";
import { createSyntheticEngine } from "../../src/provider/synthetic.ts";
import { manualClock } from "../support/manualClock.ts";
import { startBlackholeProxy, startFakeGateway, withTimeout, type FakeGateway } from "./fake-gateway.ts";

const models = [{ model_id: "demo-model", model_hash: "ab".repeat(32), max_context_tokens: 8192 }];
const dir = await mkdtemp(join(tmpdir(), "provider-watchdog-"));
const key = await loadOrCreateProviderKey(join(dir, "provider.pem"));
await rm(dir, { recursive: true, force: true });

const WATCHDOG = { pingIntervalMs: 20, timeoutMs: 120 };

let cleanups: Array<() => unknown> = [];
afterEach(async () => {
  for (const cleanup of cleanups.reverse()) await cleanup();
  cleanups = [];
});

function start(gatewayUrl: string, overrides: Partial<ProviderRuntimeOptions> = {}) {
  const logs: Array<{ event: string } & Record<string, unknown>> = [];
  const welcomes: string[] = [];
  const runtime = startProviderRuntime({
    gatewayUrl,
    providerId: "prov-watchdog",
    key,
    engine: createSyntheticEngine(),
    models,
    backoff: { minMs: 5, maxMs: 20 },
    watchdog: WATCHDOG,
    log: (event, fields) => logs.push({ event, ...fields }),
    ...overrides,
  });
  runtime.on("welcome", (frame) => welcomes.push(frame.session_id));
  cleanups.push(() => runtime.stop());
  return { runtime, logs, welcomes };
}

function gatewayWithProxy(): { gateway: FakeGateway; proxy: ReturnType<typeof startBlackholeProxy> } {
  const gateway = startFakeGateway({ heartbeatIntervalMs: 10_000 });
  const proxy = startBlackholeProxy(gateway.url);
  cleanups.push(() => gateway.stop(), () => proxy.stop());
  return { gateway, proxy };
}

async function until(predicate: () => boolean, timeoutMs: number, what: string): Promise<void> {
  const wait = (async () => {
    while (!predicate()) await Bun.sleep(5);
  })();
  await withTimeout(wait, timeoutMs, what);
}

/** Resolves at the runtime's next event `name`. */
function next(runtime: ReturnType<typeof startProviderRuntime>, name: "pong" | "welcome"): Promise<void> {
  return new Promise((resolve) => {
    const off = runtime.on(name, () => {
      off();
      resolve();
    });
  });
}

test("pongs keep an idle, healthy session up: no reconnect over many timeout periods", async () => {
  const { gateway, proxy } = gatewayWithProxy();
  const clock = manualClock();
  const h = start(proxy.url, { now: clock.now, timers: clock.timers });
  await until(() => h.welcomes.length === 1, 1500, "the first welcome");
  // Five timeout periods, one ping period at a time: the gateway sends nothing but the pong to each ping.
  for (let elapsed = 0; elapsed < WATCHDOG.timeoutMs * 5; elapsed += WATCHDOG.pingIntervalMs) {
    const ponged = next(h.runtime, "pong");
    clock.advance(WATCHDOG.pingIntervalMs);
    await withTimeout(ponged, 2000, `the pong after ${elapsed + WATCHDOG.pingIntervalMs} ms`);
  }
  expect(h.runtime.connected).toBe(true);
  expect(gateway.sessions).toHaveLength(1);
  expect(h.logs.some((l) => l.event === "watchdog_timeout")).toBe(false);
});

test("a half-open socket (the link goes silent, no close) is dropped and the runtime reconnects", async () => {
  const { gateway, proxy } = gatewayWithProxy();
  const clock = manualClock();
  const h = start(proxy.url, { now: clock.now, timers: clock.timers });
  await until(() => h.welcomes.length === 1, 1500, "the first welcome");
  proxy.silenceOpenConnections();
  let silentMs = 0;
  while (!h.logs.some((l) => l.event === "watchdog_timeout") && silentMs <= WATCHDOG.timeoutMs * 2) {
    clock.advance(WATCHDOG.pingIntervalMs);
    silentMs += WATCHDOG.pingIntervalMs;
  }
  // Detected at the first tick once timeoutMs of silence passed: within one ping interval of it.
  expect(silentMs).toBeGreaterThanOrEqual(WATCHDOG.timeoutMs);
  expect(silentMs).toBeLessThanOrEqual(WATCHDOG.timeoutMs + WATCHDOG.pingIntervalMs);
  expect(h.logs.find((l) => l.event === "watchdog_timeout")).toMatchObject({ phase: "admitted" });
  // The dropped socket closes (1006) and schedules a reconnect within the backoff's maxMs.
  await until(() => h.logs.some((l) => l.event === "reconnect_scheduled"), 1500, "the reconnect to be scheduled");
  expect(h.logs.find((l) => l.event === "closed")).toMatchObject({ code: 1006 });
  const welcomed = next(h.runtime, "welcome");
  clock.advance(20);
  await withTimeout(welcomed, 2000, "a second welcome");
  expect(h.runtime.sessionId).toBe(gateway.sessions[1]!.sessionId);
});

test("after a sleep (the wall clock jumps), the first tick drops the stale session at once", async () => {
  const { gateway } = gatewayWithProxy();
  let offsetMs = 0;
  const h = start(gateway.url, { now: () => Date.now() + offsetMs, watchdog: { pingIntervalMs: 20, timeoutMs: 60_000 } });
  await until(() => h.welcomes.length === 1, 1500, "the first welcome");
  offsetMs = 3_600_000; // an hour asleep: timers did not run, the gateway evicted us long ago
  await until(() => h.welcomes.length === 2, 1000, "a welcome after the wake-up");
  const timeout = h.logs.find((l) => l.event === "watchdog_timeout")!;
  expect(timeout.silent_ms as number).toBeGreaterThanOrEqual(3_600_000);
});

test("a connect that is never answered is abandoned and retried", async () => {
  const { gateway, proxy } = gatewayWithProxy();
  proxy.blackholeNewConnections();
  const h = start(proxy.url);
  await until(() => proxy.accepted >= 3, 2000, "three connection attempts");
  expect(h.logs.filter((l) => l.event === "watchdog_timeout").every((l) => l.phase === "hello_sent")).toBe(true);
  expect(gateway.sessions).toHaveLength(0);
  expect(h.runtime.connected).toBe(false);
});

test("stop() ends the watchdog: no timeouts or reconnects afterwards", async () => {
  const { proxy } = gatewayWithProxy();
  const clock = manualClock();
  const h = start(proxy.url, { now: clock.now, timers: clock.timers });
  await until(() => h.welcomes.length === 1, 1500, "the first welcome");
  await h.runtime.stop();
  proxy.silenceOpenConnections();
  clock.advance(WATCHDOG.timeoutMs * 3);
  expect(h.logs.some((l) => l.event === "watchdog_timeout" || l.event === "reconnect_scheduled")).toBe(false);
  expect(clock.armed).toBe(0); // no ping, heartbeat or reconnect timer outlives stop()
});

test("rejects a watchdog whose timeout is not longer than its ping interval", () => {
  expect(() => start("ws://127.0.0.1:1", { watchdog: { pingIntervalMs: 100, timeoutMs: 100 } })).toThrow("watchdog");
});
