// The holes an outside probe found (issue 26, defects 1–7), each against a real gateway on loopback:
// a scripted provider over a real WebSocket, buyers over real HTTP (raw TCP where the probe was a
// misbehaving client). Each test failed before its fix.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Database } from "bun:sqlite";
import { connect } from "node:net";
import { loadConfig, type GatewayConfig } from "../../src/config/index.ts";
import { createLog } from "../../src/log.ts";
import { PROVIDER_CONNECT_PATH, startGateway, type RunningGateway } from "../../src/compositionRoot.ts";
import { ScriptedProvider, type ScriptedAttempt } from "../support/scriptedProvider.ts";
import { waitFor } from "../support/harness.ts";

const MODEL = "faults-model";

let gateway: RunningGateway;
let dataDir: string;
let apiKey: string;
let wsUrl: string;
let url: string;
const lines: Record<string, unknown>[] = [];
let provider: ScriptedProvider;

const settings: Partial<GatewayConfig> = {
  requestBodyTimeoutMs: 500,
  streamBufferBytes: 64 * 1024,
  streamStallMs: 60_000,
  maxChunkBytesPerToken: 8192,
  receiptFramesPerSecond: 20,
  receiptFrameBurst: 40,
  heartbeatIntervalMs: 60_000,
};

beforeAll(async () => {
  dataDir = mkdtempSync(join(tmpdir(), "gw-faults-"));
  const loaded = loadConfig([], {});
  if (!loaded.ok) throw new Error(loaded.message);
  const config: GatewayConfig = { ...loaded.config, port: 0, dataDir, settlementMode: "observe", ...settings };
  gateway = await startGateway(config, { log: createLog("debug", (line) => lines.push(JSON.parse(line))) });
  const { account_id } = await gateway.store.createAccount({ name: "faults", tier: "free" });
  apiKey = (await gateway.store.createApiKey({ account_id })).api_key;
  url = gateway.url;
  wsUrl = `ws://127.0.0.1:${gateway.port}${PROVIDER_CONNECT_PATH}`;
  provider = await ScriptedProvider.connect({ url: wsUrl, id: "faults-prov", models: [MODEL], maxConcurrency: 16 });
});

afterAll(async () => {
  await provider.close();
  await gateway.stop();
  rmSync(dataDir, { recursive: true, force: true });
});

const chatBody = (extra: Record<string, unknown> = {}) =>
  JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "hi" }], max_tokens: 4, ...extra });

const post = (body: string, headers: Record<string, string> = {}) =>
  fetch(`${url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${apiKey}`, "content-type": "application/json", ...headers },
    body,
  });

const errorLines = () => lines.filter((l) => l.level === "error");

/** One raw HTTP/1.1 exchange over TCP: writes `head` (and `body` parts), resolves with what came back. */
async function rawHttp(o: { head: string; parts?: string[]; closeAfterMs?: number; readForMs: number }): Promise<string> {
  const { port } = gateway;
  let received = "";
  const socket = await Bun.connect({
    hostname: "127.0.0.1",
    port,
    socket: {
      data(_s, data) {
        received += Buffer.from(data).toString("latin1");
      },
    },
  });
  socket.write(o.head);
  for (const part of o.parts ?? []) socket.write(part);
  if (o.closeAfterMs !== undefined) {
    await Bun.sleep(o.closeAfterMs);
    socket.terminate();
    return received;
  }
  const deadline = performance.now() + o.readForMs;
  while (performance.now() < deadline && !received.includes("\r\n\r\n{")) await Bun.sleep(10);
  await Bun.sleep(20);
  socket.end();
  return received;
}

const statusOf = (raw: string) => Number(/^HTTP\/1\.1 (\d{3})/.exec(raw)?.[1] ?? 0);

describe("defect 1: a lone surrogate in a string field", () => {
  const cases: [string, Record<string, unknown>, string][] = [
    ["content", { messages: [{ role: "user", content: "a\ud800" }] }, "messages[0].content"],
    ["name", { messages: [{ role: "user", content: "a", name: "\udc00x" }] }, "messages[0].name"],
    ["stop", { stop: ["ok", "\ud800"] }, "stop[1]"],
    ["a content part's text", { messages: [{ role: "user", content: [{ type: "text", text: "x\udfff" }] }] }, "messages[0].content[0].text"],
  ];
  test.each(cases)("in %s is 400 invalid_request naming the field", async (_, extra, param) => {
    const before = errorLines().length;
    // JSON.stringify writes a lone surrogate as a \uXXXX escape, as a hostile client would.
    const response = await post(chatBody(extra));
    expect(response.status).toBe(400);
    const body = (await response.json()) as { error: { code: string; param: string | null; retryable: boolean } };
    expect(body.error).toMatchObject({ code: "invalid_request", param, retryable: false });
    expect(errorLines().length).toBe(before);
  });

  test("a well-formed pair (an emoji written as escapes) is still accepted", async () => {
    provider.script = (a) => {
      a.accept();
      a.chunk("ok", 1);
      a.end();
    };
    const response = await post(chatBody({ messages: [{ role: "user", content: "\ud83d\ude00" }] }));
    expect(response.status).toBe(200);
  });
});

describe("defect 7: a short Host header", () => {
  test.each(["a", "abc", "x.y", "ab:1"])("Host %p: /healthz, /v1/status and /v1/models answer", async (host) => {
    for (const path of ["/healthz", "/v1/status"]) {
      const raw = await rawHttp({ head: `GET ${path} HTTP/1.1\r\nHost: ${host}\r\nConnection: close\r\n\r\n`, readForMs: 2000 });
      expect(statusOf(raw)).toBe(200);
    }
    const models = await rawHttp({
      head: `GET /v1/models HTTP/1.1\r\nHost: ${host}\r\nAuthorization: Bearer ${apiKey}\r\nConnection: close\r\n\r\n`,
      readForMs: 2000,
    });
    expect(statusOf(models)).toBe(200);
    const missing = await rawHttp({ head: `GET /nope HTTP/1.1\r\nHost: ${host}\r\nConnection: close\r\n\r\n`, readForMs: 2000 });
    expect(statusOf(missing)).toBe(404);
  });

  test("a chat completion with Host: a", async () => {
    provider.script = (a) => {
      a.accept();
      a.chunk("ok", 1);
      a.end();
    };
    const body = chatBody();
    const raw = await rawHttp({
      head: `POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer ${apiKey}\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\nConnection: close\r\n\r\n${body}`,
      readForMs: 3000,
    });
    expect(statusOf(raw)).toBe(200);
  });
});

describe("defect 5: request bodies have a read deadline, and auth comes first", () => {
  test("headers and a body that never finishes: 408 after the deadline", async () => {
    const started = performance.now();
    const raw = await rawHttp({
      head: `POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${apiKey}\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n`,
      parts: ['{"model":'],
      readForMs: 5000,
    });
    expect(statusOf(raw)).toBe(408);
    expect(raw).toContain('"code":"request_timeout"');
    expect(performance.now() - started).toBeLessThan(4000);
  });

  test("the same with a chunked body", async () => {
    const raw = await rawHttp({
      head: `POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${apiKey}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n`,
      parts: ["5\r\n{\"mod\r\n"],
      readForMs: 5000,
    });
    expect(statusOf(raw)).toBe(408);
  });

  test("an invalid key is refused before the body is read (no wait for the deadline)", async () => {
    const started = performance.now();
    const raw = await rawHttp({
      head: `POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer gw_not-a-key\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n`,
      readForMs: 5000,
    });
    expect(statusOf(raw)).toBe(401);
    expect(performance.now() - started).toBeLessThan(450);
  });
});

describe("defect 6: a client that aborts during the upload", () => {
  test("is counted as 499 and logged below error", async () => {
    const before = errorLines().length;
    await rawHttp({
      head: `POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${apiKey}\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n`,
      parts: ['{"model":"x",'],
      closeAfterMs: 50,
      readForMs: 0,
    });
    await waitFor(() => lines.some((l) => l.event === "client_aborted_upload"), 3000, "client_aborted_upload");
    const line = lines.find((l) => l.event === "client_aborted_upload")!;
    expect(["debug", "info"]).toContain(line.level as string);
    expect(errorLines().length).toBe(before);
    const text = await gateway.metrics.render();
    expect(text).toMatch(/gateway_http_requests_total\{route="\/v1\/chat\/completions",status="499"\} 1/);
    expect(text).not.toMatch(/gateway_http_requests_total\{route="\/v1\/chat\/completions",status="500"\}/);
  });
});

/** Runs one streaming request whose provider side is `script`; resolves with the request id. */
async function startStream(script: (a: ScriptedAttempt) => void | Promise<void>): Promise<string> {
  provider.script = script;
  const jobsBefore = provider.jobs.length;
  const response = await post(chatBody({ stream: true }));
  await response.text();
  await provider.waitForJobs(jobsBefore + 1);
  return provider.jobs[jobsBefore]!.request_id;
}

const receiptRows = () => {
  const db = new Database(join(dataDir, "gateway.db"), { readonly: true });
  try {
    return (db.query("SELECT COUNT(*) AS n FROM receipts_received").get() as { n: number }).n;
  } finally {
    db.close();
  }
};

describe("defects 2 and 3: receipt frames", () => {
  test("receipts for attempts that never existed are counted, not stored", async () => {
    const rows = receiptRows();
    for (let i = 0; i < 20; i++) {
      provider.send({ type: "receipt", request_id: `req_${String(i).padStart(24, "0")}`, attempt_n: 0, receipt: "x".repeat(16_000) });
    }
    await waitFor(() => gateway.registry.ignoredReceipts.unknown_attempt >= 20, 3000, "20 ignored receipts");
    expect(receiptRows()).toBe(rows);
    expect(await gateway.metrics.render()).toMatch(/gateway_receipts_not_stored_total\{reason="unknown_attempt"\} 20/);
  });

  test("a receipt for a settled attempt is answered with its final `settled` frame and not stored again", async () => {
    const requestId = await startStream((a) => {
      a.accept();
      a.chunk("Hello", 1);
      a.end();
    });
    const first = await provider.waitForSettled(requestId);
    const rows = receiptRows();
    const receipt = provider.attempt(requestId).receipt();
    provider.attempt(requestId).sendReceipt(receipt);
    provider.attempt(requestId).sendReceipt(receipt);
    await waitFor(() => provider.settled.filter((s) => s.request_id === requestId).length === 3, 3000, "two more settled frames");
    for (const s of provider.settled.filter((f) => f.request_id === requestId)) expect(s).toEqual(first);
    expect(receiptRows()).toBe(rows);
  });

  test("a session flooding receipt frames is closed", async () => {
    const flooder = await ScriptedProvider.connect({ url: wsUrl, id: "faults-flooder", models: [MODEL] });
    try {
      for (let i = 0; i < 500 && flooder.closeCode === null; i++) {
        flooder.send({ type: "receipt", request_id: `req_${String(i).padStart(24, "f")}`, attempt_n: 0, receipt: "x" });
      }
      await waitFor(() => flooder.closeCode !== null, 3000, "the flooder's close");
      expect(flooder.closeCode).toBe(1008);
      expect(lines.some((l) => l.event === "provider_receipt_flood" && l.provider_id === "faults-flooder")).toBe(true);
    } finally {
      await flooder.close();
    }
  });
});

describe("defect 4: relayed output is bounded", () => {
  test("a buyer that never reads: the attempt is cancelled once its buffer is full", async () => {
    provider.script = async (a) => {
      a.accept();
      // Up to 32 MB: more than the loopback socket buffers of both sides hold.
      const piece = "x".repeat(8000);
      for (let i = 0; i < 4000 && !a.cancel; i++) {
        a.chunk(piece, 1);
        if (i % 20 === 0) await Bun.sleep(1);
      }
    };
    const jobsBefore = provider.jobs.length;
    const body = chatBody({ stream: true, max_tokens: 4000 });
    // Reads nothing: the client's receive buffer fills, then the gateway's send buffer.
    const socket = connect(gateway.port, "127.0.0.1");
    socket.pause();
    socket.write(
      `POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${apiKey}\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`,
    );
    try {
      await provider.waitForJobs(jobsBefore + 1);
      const job = provider.jobs[jobsBefore]!;
      const cancel = await provider.attempt(job.request_id).cancelled(8000);
      expect(cancel.reason).toBe("buyer_cancel");
      expect(lines.some((l) => l.event === "buyer_stream_stalled" && l.request_id === job.request_id)).toBe(true);
    } finally {
      socket.destroy();
    }
  });

  test("a chunk carrying more bytes than its tokens allow closes the session; the buyer gets an error", async () => {
    const hostile = await ScriptedProvider.connect({ url: wsUrl, id: "faults-inflator", models: ["inflated-model"] });
    try {
      hostile.script = (a) => {
        a.accept();
        a.chunk("y".repeat(256 * 1024), 4);
        a.end();
      };
      const response = await fetch(`${url}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${apiKey}`, "content-type": "application/json" },
        body: JSON.stringify({ model: "inflated-model", messages: [{ role: "user", content: "hi" }], max_tokens: 4 }),
      });
      const text = await response.text();
      expect(text).not.toContain("yyyy");
      await waitFor(() => hostile.closeCode !== null, 3000, "the inflator's close");
      expect(hostile.closeCode).toBe(1008);
    } finally {
      await hostile.close();
    }
  });
});
