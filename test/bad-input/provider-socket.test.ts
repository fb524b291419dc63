// Bad provider sockets against a real gateway over real WebSockets: each bad frame or failed
// handshake closes only that socket, with the close code of docs/protocol.md, in the documented order of
// checks; the gateway keeps admitting and serving healthy providers afterwards.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { randomBytes } from "node:crypto";
import { join } from "node:path";
import { Packr } from "msgpackr";
import { loadOrCreateProviderKey, type ProviderKey } from "../../src/provider/keys.ts";
import { syntheticText } from "../../src/provider/synthetic.ts";
import { decodeGatewayFrame, encodeFrame } from "../../src/wire/codec.ts";
import { signHandshake } from "../../src/wire/handshake.ts";
import type { GatewayFrame, HelloFrame, JobFrame, ProviderFrame, WelcomeFrame } from "../../src/wire/frames.ts";
import { modelHash, spawnProvider, startTestGateway, waitFor, waitForReadyProviders, type TestGateway } from "../support/harness.ts";

const PROBE_MODEL = "probe-model";
const EVENT_TIMEOUT_MS = 1500;

// For frames the protocol forbids (unknown type, wrong schema): plain msgpack maps, no records.
const rawPackr = new Packr({ useRecords: false, mapsAsObjects: true, variableMapSize: true });

let keySeq = 0;
/** A fresh Ed25519 provider key in the gateway's temp dir. */
const newKey = (gw: TestGateway): Promise<ProviderKey> =>
  loadOrCreateProviderKey(join(gw.dataDir, "probe-keys", `k${++keySeq}.key`));

function helloFrame(providerId: string, key: ProviderKey, modelId = PROBE_MODEL): HelloFrame {
  return {
    type: "hello",
    protocol: 1,
    provider_id: providerId,
    receipt_public_key: key.publicKeyRaw,
    runtime: { name: "bad-input-probe", version: "0.0.0" },
    hardware: { ram_gb: 8 },
    max_concurrency: 1,
    models: [{ model_id: modelId, model_hash: modelHash(modelId), max_context_tokens: 4096 }],
  };
}

type Next = { frame: GatewayFrame } | { closed: number };

/** A raw provider WebSocket: decoded gateway frames in arrival order, and the close code. */
class ProbeSocket {
  readonly ws: WebSocket;
  readonly opened: Promise<void>;
  readonly closed: Promise<number>;
  private readonly queue: GatewayFrame[] = [];
  private waiter: (() => void) | null = null;
  private closeCode: number | null = null;

  constructor(url: string) {
    this.ws = new WebSocket(url);
    this.ws.binaryType = "arraybuffer";
    this.opened = new Promise((resolve, reject) => {
      this.ws.addEventListener("open", () => resolve(), { once: true });
      this.ws.addEventListener("error", () => reject(new Error("websocket error before open")), { once: true });
    });
    this.closed = new Promise((resolve) => {
      this.ws.addEventListener("close", (event) => {
        this.closeCode = event.code;
        resolve(event.code);
        this.wake();
      });
    });
    this.ws.addEventListener("message", (event) => {
      const decoded = decodeGatewayFrame(event.data as ArrayBuffer | string);
      if (!decoded.ok) throw new Error(`gateway sent an invalid frame (${decoded.reason})`);
      this.queue.push(decoded.frame);
      this.wake();
    });
  }

  private wake(): void {
    const w = this.waiter;
    this.waiter = null;
    w?.();
  }

  /** The next frame from the gateway, or the close code once the socket is closed. */
  async next(timeoutMs = EVENT_TIMEOUT_MS): Promise<Next> {
    const deadline = performance.now() + timeoutMs;
    for (;;) {
      const frame = this.queue.shift();
      if (frame) return { frame };
      if (this.closeCode !== null) return { closed: this.closeCode };
      const remaining = deadline - performance.now();
      if (remaining <= 0) throw new Error("timed out waiting for a gateway frame or close");
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, remaining);
        this.waiter = () => {
          clearTimeout(timer);
          resolve();
        };
      });
    }
  }

  /** The next frame, which must be of `type`. */
  async expectFrame<T extends GatewayFrame["type"]>(type: T): Promise<Extract<GatewayFrame, { type: T }>> {
    const next = await this.next();
    if (!("frame" in next)) throw new Error(`expected ${type}, socket closed with ${next.closed}`);
    if (next.frame.type !== type) throw new Error(`expected ${type}, got ${next.frame.type}`);
    return next.frame as Extract<GatewayFrame, { type: T }>;
  }

  /** Waits for the gateway to close the socket; returns its close code. */
  async closeCode_(timeoutMs = EVENT_TIMEOUT_MS): Promise<number> {
    for (;;) {
      const next = await this.next(timeoutMs);
      if ("closed" in next) return next.closed;
    }
  }

  sendFrame(frame: ProviderFrame): void {
    this.ws.send(encodeFrame(frame));
  }

  sendRaw(data: string | Uint8Array): void {
    this.ws.send(data);
  }

  close(): void {
    if (this.ws.readyState === WebSocket.OPEN || this.ws.readyState === WebSocket.CONNECTING) this.ws.close(1000);
  }
}

async function connect(gw: TestGateway): Promise<ProbeSocket> {
  const socket = new ProbeSocket(gw.wsUrl);
  await socket.opened;
  return socket;
}

interface HandshakeOptions {
  providerId: string;
  key: ProviderKey;
  modelId?: string;
  /** Sign with 64 random bytes instead of the key. */
  forgeSignature?: boolean;
}

interface HandshakeResult {
  socket: ProbeSocket;
  /** The welcome frame, or null when the gateway closed the socket instead. */
  welcome: WelcomeFrame | null;
  /** The close code, or null when welcomed. */
  closeCode: number | null;
}

/** hello → challenge → auth (signHandshake, or forged) → welcome or close. */
async function handshake(gw: TestGateway, o: HandshakeOptions): Promise<HandshakeResult> {
  const socket = await connect(gw);
  socket.sendFrame(helloFrame(o.providerId, o.key, o.modelId));
  const challenge = await socket.expectFrame("challenge");
  const signature = o.forgeSignature
    ? new Uint8Array(randomBytes(64))
    : signHandshake(o.key.privateKey, challenge.session_id, o.providerId, challenge.nonce);
  socket.sendFrame({ type: "auth", signature });
  const next = await socket.next();
  if ("closed" in next) return { socket, welcome: null, closeCode: next.closed };
  if (next.frame.type !== "welcome") throw new Error(`expected welcome or close, got ${next.frame.type}`);
  return { socket, welcome: next.frame, closeCode: null };
}

/** Handshakes, expects welcome, disconnects and waits until the gateway has let the session go. */
async function admitAndLeave(gw: TestGateway, providerId: string, key: ProviderKey): Promise<void> {
  const { socket, welcome, closeCode } = await handshake(gw, { providerId, key });
  expect({ welcomed: welcome !== null, closeCode }).toEqual({ welcomed: true, closeCode: null });
  socket.close();
  await socket.closed;
  await waitFor(() => !gw.gateway.registry.admittedByProvider.has(providerId), EVENT_TIMEOUT_MS, `${providerId} to leave`);
}

describe("bad frames and failed handshakes close only that socket", () => {
  let gw: TestGateway;
  const open: ProbeSocket[] = [];
  const track = <T extends { socket: ProbeSocket } | ProbeSocket>(x: T): T => {
    open.push(x instanceof ProbeSocket ? x : x.socket);
    return x;
  };

  beforeAll(async () => {
    gw = await startTestGateway();
  });

  afterAll(async () => {
    for (const s of open) s.close();
    await gw.close();
  });

  test("a text frame → 1003", async () => {
    const socket = track(await connect(gw));
    socket.sendRaw(JSON.stringify({ type: "hello" }));
    expect(await socket.closeCode_()).toBe(1003);
  });

  test("bytes that are not msgpack → 1007", async () => {
    const socket = track(await connect(gw));
    socket.sendRaw(new Uint8Array([0xc1]));
    expect(await socket.closeCode_()).toBe(1007);
  });

  test("the reserved byte 0xc1 inside a map (as the type) → 1007, not 1008", async () => {
    const socket = track(await connect(gw));
    // {"type": <0xc1>}: msgpackr decodes 0xc1 to a sentinel instead of failing.
    socket.sendRaw(new Uint8Array([0x81, 0xa4, ...new TextEncoder().encode("type"), 0xc1]));
    expect(await socket.closeCode_()).toBe(1007);
  });

  test("truncated msgpack → 1007", async () => {
    const socket = track(await connect(gw));
    socket.sendRaw(rawPackr.pack({ type: "hello", protocol: 1 }).subarray(0, 8));
    expect(await socket.closeCode_()).toBe(1007);
  });

  test("a msgpack map with an unknown type → 1008", async () => {
    const socket = track(await connect(gw));
    socket.sendRaw(rawPackr.pack({ type: "gimme_jobs", provider_id: "x" }));
    expect(await socket.closeCode_()).toBe(1008);
  });

  test("a msgpack value that is not a map → 1008", async () => {
    const socket = track(await connect(gw));
    socket.sendRaw(rawPackr.pack(["hello", 1]));
    expect(await socket.closeCode_()).toBe(1008);
  });

  test("a frame that fails its schema (auth with a 10-byte signature) → 1008", async () => {
    const key = await newKey(gw);
    const socket = track(await connect(gw));
    socket.sendFrame(helloFrame("schema-auth", key));
    await socket.expectFrame("challenge");
    socket.sendRaw(rawPackr.pack({ type: "auth", signature: new Uint8Array(10) }));
    expect(await socket.closeCode_()).toBe(1008);
  });

  // docs/protocol.md says "a frame that fails its schema → 1008" in general, but lists 4001 invalid_hello
  // for the handshake and starts the order of checks with "hello schema (4001)": the specific rule
  // wins for hello. Other frames failing their schema stay 1008 (test above).
  test.each([
    ["provider_id with a space", { provider_id: "has space" }],
    ["protocol 2", { protocol: 2 }],
    ["a 31-byte public key", { receipt_public_key: new Uint8Array(31) }],
    ["an unknown field", { extra: true }],
  ] as const)("a hello that fails its schema (%s) → 4001, never challenged", async (_, patch) => {
    const socket = track(await connect(gw));
    socket.sendRaw(rawPackr.pack({ ...helloFrame("schema-hello", await newKey(gw)), ...patch }));
    expect(await socket.next()).toEqual({ closed: 4001 });
  });

  test("a heartbeat before auth is out of turn → 1008", async () => {
    const key = await newKey(gw);
    const socket = track(await connect(gw));
    socket.sendFrame(helloFrame("early-heartbeat", key));
    await socket.expectFrame("challenge");
    socket.sendFrame({ type: "heartbeat", state: "ready", slots_free: 1, models: [] });
    expect(await socket.closeCode_()).toBe(1008);
  });

  test("an auth before hello is out of turn → 1008", async () => {
    const socket = track(await connect(gw));
    socket.sendFrame({ type: "auth", signature: new Uint8Array(64) });
    expect(await socket.closeCode_()).toBe(1008);
  });

  test("a 2 MiB binary frame → 1009", async () => {
    const socket = track(await connect(gw));
    socket.sendRaw(new Uint8Array(2 * 1024 * 1024));
    expect(await socket.closeCode_()).toBe(1009);
  });

  test("a forged handshake signature → 4003", async () => {
    const result = track(await handshake(gw, { providerId: "forger", key: await newKey(gw), forgeSignature: true }));
    expect(result.closeCode).toBe(4003);
    // Nothing was bound for an unauthenticated caller.
    expect(await gw.gateway.store.getProviderBinding("forger")).toBeNull();
  });

  test("a known id with another key → 4010", async () => {
    const keyA = await newKey(gw);
    await admitAndLeave(gw, "bound-id", keyA);
    const result = track(await handshake(gw, { providerId: "bound-id", key: await newKey(gw) }));
    expect(result.closeCode).toBe(4010);
    // The binding still holds key A, and A is still admitted.
    expect(Buffer.from((await gw.gateway.store.getProviderBinding("bound-id"))!.public_key!)).toEqual(Buffer.from(keyA.publicKeyRaw));
    const again = track(await handshake(gw, { providerId: "bound-id", key: keyA }));
    expect(again.welcome).not.toBeNull();
  });

  test("a banned id with a valid signature → 4009; with a forged one → 4003 (signature first)", async () => {
    await gw.gateway.store.banProvider("banned-id");
    const key = await newKey(gw);
    const forged = track(await handshake(gw, { providerId: "banned-id", key, forgeSignature: true }));
    expect(forged.closeCode).toBe(4003);
    const signed = track(await handshake(gw, { providerId: "banned-id", key }));
    expect(signed.closeCode).toBe(4009);
  });

  test("a bound id banned later, connecting with another key → 4009 (ban before binding)", async () => {
    await admitAndLeave(gw, "banned-later", await newKey(gw));
    await gw.gateway.store.banProvider("banned-later");
    const result = track(await handshake(gw, { providerId: "banned-later", key: await newKey(gw) }));
    expect(result.closeCode).toBe(4009);
  });

  test("a second live connection with the same id and key replaces the first (4011); the second serves", async () => {
    const key = await newKey(gw);
    // A model only this id serves, so the job below can only go to it.
    const modelId = "replaced-model";
    const first = track(await handshake(gw, { providerId: "replaced-id", key, modelId }));
    expect(first.welcome).not.toBeNull();
    const second = track(await handshake(gw, { providerId: "replaced-id", key, modelId }));
    expect(second.welcome).not.toBeNull();
    expect(await first.socket.closeCode_()).toBe(4011);
    expect(gw.gateway.registry.admittedByProvider.get("replaced-id")?.sessionId).toBe(second.welcome!.session_id);

    // The second session takes a real job end to end.
    const completion = fetch(`${gw.baseURL}/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${gw.apiKey}`, "content-type": "application/json" },
      body: JSON.stringify({ model: modelId, messages: [{ role: "user", content: "hi" }], max_tokens: 4 }),
    });
    const job: JobFrame = await second.socket.expectFrame("job");
    const ids = { request_id: job.request_id, attempt_n: job.attempt_n };
    expect(job.model_id).toBe(modelId);
    second.socket.sendFrame({ type: "accepted", ...ids, model_hash: modelHash(modelId) });
    second.socket.sendFrame({ type: "chunk", ...ids, seq: 0, content: "replaced fine", tokens: 2 });
    second.socket.sendFrame({
      type: "end",
      ...ids,
      terminal_state: "normal_done",
      finish_reason: "stop",
      usage: { input_tokens: 3, output_tokens: 2 },
    });
    const res = await completion;
    expect(res.status).toBe(200);
    const body = (await res.json()) as { choices: { message: { content: string } }[] };
    expect(body.choices[0]!.message.content).toBe("replaced fine");
  });

  test("after all of that, no session is left behind and a healthy provider process serves a completion", async () => {
    for (const s of open) s.close();
    await Promise.all(open.map((s) => s.closed));
    const { registry } = gw.gateway;
    await waitFor(() => registry.sessions.size === 0 && registry.admittedByProvider.size === 0, EVENT_TIMEOUT_MS, "every probe session to be gone");
    expect(registry.attempts.size).toBe(0);
    const provider = spawnProvider(gw, { id: "healthy-after" });
    try {
      await waitFor(
        () => [...gw.gateway.registry.providerViews()].some((v) => v.providerId === "healthy-after" && v.state === "ready"),
        5000,
        "healthy-after to be ready",
      );
      const messages = [{ role: "user" as const, content: "Still there?" }];
      const res = await fetch(`${gw.baseURL}/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${gw.apiKey}`, "content-type": "application/json" },
        body: JSON.stringify({ model: "test-model", messages, max_tokens: 5 }),
      });
      expect(res.status).toBe(200);
      const body = (await res.json()) as { choices: { message: { content: string } }[] };
      expect(body.choices[0]!.message.content).toBe(syntheticText(messages, 5).join(""));
    } finally {
      await provider.kill();
    }
  });
});

describe("handshake timeout", () => {
  let gw: TestGateway;
  beforeAll(async () => {
    gw = await startTestGateway({ handshakeTimeoutMs: 200 });
  });
  afterAll(async () => {
    await gw.close();
  });

  test("no frame at all within the handshake timeout → 4002", async () => {
    const socket = await connect(gw);
    expect(await socket.closeCode_()).toBe(4002);
  });

  test("hello but no auth within the handshake timeout → 4002", async () => {
    const socket = await connect(gw);
    socket.sendFrame(helloFrame("slow-auth", await newKey(gw)));
    await socket.expectFrame("challenge");
    expect(await socket.closeCode_()).toBe(4002);
  });
});

describe("provisional limits count only never-bound ids", () => {
  test("provisionalAdmissionsPerHour: 1 → a second new id gets 4008; the first id still reconnects", async () => {
    const gw = await startTestGateway({ provisionalAdmissionsPerHour: 1 });
    try {
      const keyA = await newKey(gw);
      await admitAndLeave(gw, "first-new", keyA);
      const second = await handshake(gw, { providerId: "second-new", key: await newKey(gw) });
      expect(second.closeCode).toBe(4008);
      expect(await gw.gateway.store.getProviderBinding("second-new")).toBeNull();
      const reconnect = await handshake(gw, { providerId: "first-new", key: keyA });
      expect(reconnect.welcome?.tier).toBe("provisional");
      reconnect.socket.close();
    } finally {
      await gw.close();
    }
  });

  test("provisionalMaxSessions: 1 → a second new id while the first is connected gets 4007; a bound id still gets in", async () => {
    const gw = await startTestGateway({ provisionalMaxSessions: 1 });
    const sockets: ProbeSocket[] = [];
    try {
      const keyBound = await newKey(gw);
      await admitAndLeave(gw, "bound-earlier", keyBound);
      const first = await handshake(gw, { providerId: "pool-first", key: await newKey(gw) });
      sockets.push(first.socket);
      expect(first.welcome).not.toBeNull();
      const second = await handshake(gw, { providerId: "pool-second", key: await newKey(gw) });
      sockets.push(second.socket);
      expect(second.closeCode).toBe(4007);
      // A reconnect of a bound id counts toward neither limit.
      const bound = await handshake(gw, { providerId: "bound-earlier", key: keyBound });
      sockets.push(bound.socket);
      expect(bound.welcome).not.toBeNull();
    } finally {
      for (const s of sockets) s.close();
      await gw.close();
    }
  });
});
