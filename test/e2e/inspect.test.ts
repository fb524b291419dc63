// `gateway serve --inspect=URL`: actor events reach a WebSocket receiver on loopback, redacted — the
// prompt, the output and the API key never appear in anything the receiver gets.
import { afterEach, expect, test } from "bun:test";
import { rmSync } from "node:fs";
import { MAIN, tempDir, waitFor, waitForRoutable } from "../support/harness.ts";
import { REDACTED } from "../../src/inspect.ts";
import { gatewayMachine } from "../../actors/gateway.ts";
import { providerSessionMachine } from "../../actors/providerSession.ts";
import { requestMachine } from "../../actors/request.ts";
import { settlementMachine } from "../../actors/settlement.ts";

interface Received {
  type: string;
  name?: string;
  /** `@xstate.actor`: the actor logic's `config` as JSON — the statechart the inspector draws. */
  definition?: string;
  sessionId: string;
  rootId?: string;
  parentId?: string;
  event?: { type: string };
  snapshot?: { value?: unknown; status?: string };
}

let cleanups: Array<() => unknown> = [];
afterEach(async () => {
  for (const cleanup of cleanups.reverse()) await cleanup();
  cleanups = [];
});

/** A stand-in for the Stately inspector relay: a Bun WebSocket server that records every message. */
function startReceiver() {
  const raw: string[] = [];
  const server = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    fetch: (req, srv) => (srv.upgrade(req) ? undefined : new Response("upgrade", { status: 426 })),
    websocket: { message: (_ws, data) => void raw.push(String(data)) },
  });
  cleanups.push(() => server.stop(true));
  return { url: `ws://127.0.0.1:${server.port}`, raw, events: () => raw.map((m) => JSON.parse(m) as Received) };
}

/** `bun src/main.ts serve --demo` with extra flags; resolves with the printed base URL and dev key. */
async function startDemoGateway(extra: string[]) {
  const dataDir = tempDir("gw-inspect-");
  const proc = Bun.spawn(["bun", MAIN, "serve", "--demo", "--port", "0", "--data-dir", dataDir, ...extra], { stdout: "ignore", stderr: "pipe" });
  cleanups.push(() => rmSync(dataDir, { recursive: true, force: true }));
  cleanups.push(async () => {
    proc.kill("SIGKILL");
    await proc.exited;
  });
  let banner = "";
  const decoder = new TextDecoder();
  for await (const bytes of proc.stderr as ReadableStream<Uint8Array>) {
    banner += decoder.decode(bytes, { stream: true });
    if (banner.includes("Dev API key:") && banner.includes("-d '")) break;
  }
  return { proc, base: /ready on (http:\/\/\S+)/.exec(banner)![1]!, apiKey: /Dev API key: (\S+)/.exec(banner)![1]! };
}

async function complete(base: string, apiKey: string, prompt: string): Promise<string> {
  await waitForRoutable(base); // the demo providers connect just after the banner
  const res = await fetch(`${base}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${apiKey}`, "content-type": "application/json" },
    body: JSON.stringify({ model: "demo-chat", messages: [{ role: "user", content: prompt }], max_tokens: 12 }),
  });
  expect(res.status).toBe(200);
  return ((await res.json()) as { choices: { message: { content: string } }[] }).choices[0]!.message.content;
}

/** Every value under a `content` key anywhere in `value`. */
function contentValues(value: unknown, out: unknown[] = []): unknown[] {
  if (Array.isArray(value)) value.forEach((v) => contentValues(v, out));
  else if (value && typeof value === "object") {
    for (const [k, v] of Object.entries(value)) {
      if (k === "content") out.push(v);
      contentValues(v, out);
    }
  }
  return out;
}

test("actor events of the gateway, the provider sessions, each request and each attempt's settlement reach the inspector, redacted", async () => {
  const receiver = startReceiver();
  const { proc, base, apiKey } = await startDemoGateway([`--inspect=${receiver.url}`]);
  const prompt = `inspector canary ${crypto.randomUUID()} please`;
  const output = await complete(base, apiKey, prompt);
  expect(output.length).toBeGreaterThan(0);

  const requestDone = () =>
    receiver.events().some((e) => e.type === "@xstate.snapshot" && e.snapshot?.status === "done" && e.snapshot.value === "succeeded");
  await waitFor(requestDone, 5000, "the request actor's final snapshot");

  const events = receiver.events();
  const actorNames = new Set(events.filter((e) => e.type === "@xstate.actor").map((e) => e.name));
  for (const name of ["gateway", "providerSession", "request", "settlement"]) expect(actorNames).toContain(name);
  // Each of the four is sent its statechart as its definition (what the Stately inspector draws), the
  // request and settlement actors too although they run the step logic compiled from it.
  const machines = { gateway: gatewayMachine, providerSession: providerSessionMachine, request: requestMachine, settlement: settlementMachine };
  for (const [name, machine] of Object.entries(machines)) {
    const sent = events.find((e) => e.type === "@xstate.actor" && e.name === name)!;
    const definition = JSON.parse(sent.definition!) as { id: string; initial: string; states: Record<string, unknown> };
    expect(definition.id).toBe(name);
    expect(definition.initial).toBe(machine.config.initial as string);
    expect(Object.keys(definition.states).sort()).toEqual(Object.keys(machine.config.states!).sort());
  }
  // The tree the inspector draws is whole: every root and parent an actor names was announced (or is
  // the actor itself), so each request and settlement actor shows as a root actor of its own.
  const announced = new Set(events.filter((e) => e.type === "@xstate.actor").map((e) => e.sessionId));
  for (const e of events) {
    if (e.rootId !== undefined && e.rootId !== "anonymous") expect(announced).toContain(e.rootId);
    if (e.type === "@xstate.actor" && e.parentId !== undefined) expect(announced).toContain(e.parentId);
  }
  for (const e of events.filter((e) => e.type === "@xstate.actor" && (e.name === "request" || e.name === "settlement"))) {
    expect(e.parentId).toBeUndefined();
    expect(e.rootId).toBe(e.sessionId);
  }
  const eventTypes = new Set(events.filter((e) => e.type === "@xstate.event").map((e) => e.event?.type));
  for (const type of ["provider.hello", "provider.auth", "route.dispatched", "provider.chunk", "provider.ended"]) expect(eventTypes).toContain(type);

  // The chunk events were there, but their text was not.
  const contents = contentValues(events);
  expect(contents.length).toBeGreaterThan(0);
  expect(contents.every((c) => c === REDACTED)).toBe(true);
  const everything = receiver.raw.join("\n");
  expect(everything).not.toContain("canary");
  expect(everything).not.toContain(apiKey);
  expect(everything).not.toContain(output);

  proc.kill("SIGTERM");
  expect(await proc.exited).toBe(0);
});

test("an unreachable inspector neither stops the gateway serving nor keeps it alive after SIGTERM", async () => {
  const gone = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => new Response() });
  const url = `ws://127.0.0.1:${gone.port}`;
  await gone.stop(true);
  const { proc, base, apiKey } = await startDemoGateway([`--inspect=${url}`]);
  expect((await complete(base, apiKey, "hello")).length).toBeGreaterThan(0);
  const started = performance.now();
  proc.kill("SIGTERM");
  expect(await proc.exited).toBe(0);
  expect(performance.now() - started).toBeLessThan(5000);
});

test("--inspect with the gateway's own port is a usage error", async () => {
  const dataDir = tempDir("gw-inspect-own-");
  cleanups.push(() => rmSync(dataDir, { recursive: true, force: true }));
  const proc = Bun.spawn(["bun", MAIN, "serve", "--port", "18080", "--data-dir", dataDir, "--inspect=ws://127.0.0.1:18080"], { stdout: "ignore", stderr: "pipe" });
  expect(await proc.exited).toBe(64);
  expect(await new Response(proc.stderr).text()).toContain("own port");
});
