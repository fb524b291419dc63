// Bad buyer input against a real gateway with one real provider process: every refusal is the
// documented envelope (docs/buyer-api.md) with its status, code and type, never a stack trace, and the gateway
// keeps serving normal completions during and after the bad requests.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { errorTable, type ErrorCode } from "../../src/http/errors.ts";
import { syntheticText } from "../../src/provider/synthetic.ts";
import { spawnProvider, startTestGateway, waitForReadyProviders, type ProviderProcess, type TestGateway } from "../support/harness.ts";

let gw: TestGateway;
let provider: ProviderProcess;
let revokedKey: string;

beforeAll(async () => {
  gw = await startTestGateway();
  // Slow enough that a stream outlives a burst of bad requests; spare slots so nothing competes.
  provider = spawnProvider(gw, { id: "bad-input-http", maxConcurrency: 4, tokensPerSecond: 50 });
  const { key_id, api_key } = await gw.gateway.store.createApiKey({ account_id: gw.accountId, label: "to-revoke" });
  expect(await gw.gateway.store.revokeApiKey(key_id)).toBe(true);
  revokedKey = api_key;
  await waitForReadyProviders(gw, 1);
});

afterAll(async () => {
  await provider.kill();
  await gw.close();
});

const messages = [{ role: "user" as const, content: "Describe a lighthouse." }];
const LIMIT = 512 * 1024;

type Bearer = "valid" | "none" | "wrong" | "revoked" | "demo";

interface BadCase {
  name: string;
  method?: string;
  path?: string;
  bearer?: Bearer;
  /** A string or byte body is sent with Content-Length; a stream body is sent chunked. */
  body?: () => string | Uint8Array | ReadableStream<Uint8Array>;
  status: number;
  code: string;
  type: string;
  /** Expected `param`; undefined means "not asserted". */
  param?: string | null;
}

const json = (value: unknown) => () => JSON.stringify(value);
const chat = (extra: Record<string, unknown>) => json({ model: "test-model", messages, max_tokens: 2, ...extra });

/** A chunked body of `bytes` spaces (valid JSON whitespace, so only its size is wrong). */
const chunkedBody = (bytes: number) => () =>
  new ReadableStream<Uint8Array>({
    start(controller) {
      const piece = new Uint8Array(64 * 1024).fill(0x20);
      for (let sent = 0; sent < bytes; sent += piece.byteLength) controller.enqueue(piece.subarray(0, Math.min(piece.byteLength, bytes - sent)));
      controller.close();
    },
  });

const cases: BadCase[] = [
  { name: "malformed JSON", body: () => '{"model": "test-model", "messages": [', status: 400, code: "invalid_request", type: "invalid_request_error", param: null },
  { name: "JSON that is not an object", body: json([1, 2, 3]), status: 400, code: "invalid_request", type: "invalid_request_error", param: null },
  { name: "body that is not UTF-8", body: () => new Uint8Array([0x7b, 0xff, 0xfe, 0x7d]), status: 400, code: "invalid_request", type: "invalid_request_error", param: null },
  { name: "JSON null", body: () => "null", status: 400, code: "invalid_request", type: "invalid_request_error", param: null },
  { name: "missing messages", body: json({ model: "test-model" }), status: 400, code: "invalid_request", type: "invalid_request_error", param: "messages" },
  { name: "empty messages array", body: chat({ messages: [] }), status: 400, code: "invalid_request", type: "invalid_request_error", param: "messages" },
  { name: "max_tokens as a string", body: chat({ max_tokens: "10" }), status: 400, code: "invalid_request", type: "invalid_request_error", param: "max_tokens" },
  {
    name: "image_url content part on a user message",
    body: chat({ messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: "https://example.com/a.png" } }] }] }),
    status: 400,
    code: "unsupported_content_shape",
    type: "invalid_request_error",
    param: "messages[0].content",
  },
  {
    name: "array content on an assistant message",
    body: chat({
      messages: [
        { role: "user", content: "hi" },
        { role: "assistant", content: [{ type: "text", text: "hello" }] },
        { role: "user", content: "again" },
      ],
    }),
    status: 400,
    code: "unsupported_content_shape",
    type: "invalid_request_error",
    param: "messages[1].content",
  },
  { name: "unknown model", body: chat({ model: "no-such-model" }), status: 404, code: "model_not_available", type: "not_found_error", param: "model" },
  { name: "missing bearer", bearer: "none", body: chat({}), status: 401, code: "missing_bearer_token", type: "authentication_error", param: null },
  { name: "wrong bearer", bearer: "wrong", body: chat({}), status: 401, code: "invalid_api_key", type: "authentication_error", param: null },
  { name: "revoked key", bearer: "revoked", body: chat({}), status: 401, code: "invalid_api_key", type: "authentication_error", param: null },
  { name: "demo_ bearer", bearer: "demo", body: chat({}), status: 401, code: "invalid_demo_token", type: "authentication_error", param: null },
  { name: "body over 512 KiB with Content-Length", body: () => " ".repeat(LIMIT + 1024), status: 413, code: "request_too_large", type: "invalid_request_error", param: null },
  { name: "body over 512 KiB, chunked", body: chunkedBody(LIMIT + 1024), status: 413, code: "request_too_large", type: "invalid_request_error", param: null },
  { name: "max_tokens above the per-request cap", body: chat({ max_tokens: 5000 }), status: 400, code: "quota_exhausted", type: "invalid_request_error", param: "max_tokens" },
  {
    name: "max_completion_tokens above the per-request cap",
    body: chat({ max_tokens: undefined, max_completion_tokens: 5000 }),
    status: 400,
    code: "quota_exhausted",
    type: "invalid_request_error",
    param: "max_completion_tokens",
  },
  { name: "n: 2", body: chat({ n: 2 }), status: 400, code: "unsupported_parameter", type: "invalid_request_error", param: "n" },
  { name: "logprobs: true", body: chat({ logprobs: true }), status: 400, code: "unsupported_parameter", type: "invalid_request_error", param: "logprobs" },
  { name: "top_logprobs", body: chat({ top_logprobs: 2 }), status: 400, code: "unsupported_parameter", type: "invalid_request_error", param: "top_logprobs" },
  { name: "unknown route", path: "/v1/no-such-route", body: chat({}), status: 404, code: "not_found", type: "not_found_error", param: null },
  // The app has no GET handler there; it answers 404 not_found (a 405 would also be acceptable).
  { name: "GET on /v1/chat/completions", method: "GET", status: 404, code: "not_found", type: "not_found_error", param: null },
];

/** Every public error code a test in this file observed (checked against the table at the end). */
const observedCodes = new Set<string>();

function bearerHeader(bearer: Bearer): string | undefined {
  switch (bearer) {
    case "valid":
      return `Bearer ${gw.apiKey}`;
    case "none":
      return undefined;
    case "wrong":
      return "Bearer gw_thisisnotarealkey0000000000000000";
    case "revoked":
      return `Bearer ${revokedKey}`;
    case "demo":
      return "Bearer demo_notarealdemotoken";
  }
}

function send(c: BadCase): Promise<Response> {
  const headers: Record<string, string> = { "content-type": "application/json" };
  const authorization = bearerHeader(c.bearer ?? "valid");
  if (authorization) headers.authorization = authorization;
  return fetch(`${gw.url}${c.path ?? "/v1/chat/completions"}`, { method: c.method ?? "POST", headers, body: c.body?.() });
}

// A stack frame line ("    at fn (file.ts:1:2)"), a source location, or an error class prefix.
// Plain "at " alone is not a stack trace ("may be at most 4096" is a legitimate message).
const STACK_FRAME = /(^|\n)\s*at\s+\S/;

/** Asserts the docs/buyer-api.md envelope, headers and status for one refusal; returns the code. */
async function expectRefusal(res: Response, c: BadCase): Promise<void> {
  const text = await res.text();
  expect({ name: c.name, status: res.status }).toEqual({ name: c.name, status: c.status });
  expect(res.headers.get("x-request-id")).toBeTruthy();
  expect(res.headers.get("content-type")).toContain("application/json");
  expect(text).not.toContain(".ts:");
  expect(text).not.toContain("Error:");
  const body = JSON.parse(text) as { error: Record<string, unknown> };
  expect(Object.keys(body)).toEqual(["error"]);
  expect(Object.keys(body.error).sort()).toEqual(["code", "message", "param", "retryable", "type"]);
  const { message, type, param, code, retryable } = body.error;
  expect(typeof message).toBe("string");
  expect(message as string).not.toMatch(STACK_FRAME);
  expect(code).toBe(c.code);
  expect(type).toBe(c.type);
  if (c.param !== undefined) expect(param).toBe(c.param);
  else expect(param === null || typeof param === "string").toBe(true);
  expect(typeof retryable).toBe("boolean");
  if (retryable === false) expect(res.headers.get("x-should-retry")).toBe("false");
  observedCodes.add(code as string);
}

async function expectHealthyCompletion(maxTokens = 2): Promise<void> {
  const res = await fetch(`${gw.baseURL}/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${gw.apiKey}`, "content-type": "application/json" },
    body: JSON.stringify({ model: "test-model", messages, max_tokens: maxTokens }),
  });
  expect(res.status).toBe(200);
  const body = (await res.json()) as { choices: { message: { content: string } }[] };
  expect(body.choices[0]!.message.content).toBe(syntheticText(messages, maxTokens).join(""));
}

describe("bad buyer input gets its documented error envelope", () => {
  test.each(cases.map((c) => [c.name, c] as const))("%s", async (_, c) => {
    await expectRefusal(await send(c), c);
    // Whatever the bad request did, the gateway still serves a normal completion.
    await expectHealthyCompletion();
  });

  test("all bad requests at once, during a healthy stream that completes untouched", async () => {
    const res = await fetch(`${gw.baseURL}/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${gw.apiKey}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "test-model", messages, max_tokens: 100, stream: true }),
    });
    expect(res.status).toBe(200);
    // The status line only comes with the first delta (docs/buyer-api.md): the stream is live from here on.
    let streamEnded = false;
    const reading = (async () => {
      const sse = await res.text();
      streamEnded = true;
      return sse;
    })();
    await Promise.all(cases.map(async (c) => expectRefusal(await send(c), c)));
    // At 50 tokens/s the stream needs ~700 ms; the refusals took a fraction of that.
    expect(streamEnded).toBe(false);
    const sse = await reading;
    let text = "";
    for (const event of sse.split("\n\n")) {
      if (!event.startsWith("data: {")) continue;
      const chunk = JSON.parse(event.slice(6)) as { choices: { delta?: { content?: string } }[] };
      text += chunk.choices[0]?.delta?.content ?? "";
    }
    expect(sse.trimEnd().endsWith("data: [DONE]")).toBe(true);
    expect(text).toBe(syntheticText(messages, 100).join(""));
  });

  test("OPTIONS preflight on /v1/chat/completions answers 204 for any origin", async () => {
    const res = await fetch(`${gw.baseURL}/chat/completions`, {
      method: "OPTIONS",
      headers: { origin: "https://some-site.example", "access-control-request-method": "POST", "access-control-request-headers": "authorization, content-type" },
    });
    expect(res.status).toBe(204);
    expect(res.headers.get("access-control-allow-origin")).toBe("*");
    expect(res.headers.get("access-control-allow-methods")).toContain("POST");
    expect(res.headers.get("access-control-allow-headers")).toContain("authorization");
    expect(await res.text()).toBe("");
  });

  // Nesting deep enough to overflow the stack when the job frame is msgpack-encoded (~20k levels), yet
  // far under the body limit. Such a request once left its attempt registered, so the only provider
  // stayed "busy" forever and every later request got 503 (fixed in src/gateway/requests.ts).
  // (At ~50k levels in `tools`, JSON.stringify in promptTokenBound overflows instead, after blocking
  // the event loop ~1.5 s.) The edge now refuses nesting past MAX_JSON_DEPTH before any of that.
  const LEVELS = 20_000;
  const deep = (levels: number) => "[".repeat(levels) + "]".repeat(levels);
  const deepCases = [
    ["assistant tool_calls", () => `{"model":"test-model","max_tokens":2,"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":null,"tool_calls":[${deep(LEVELS)}]},{"role":"user","content":"x"}]}`],
    ["tools", () => `{"model":"test-model","max_tokens":2,"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":${deep(LEVELS)}}]}`],
  ] as const;

  test.each(deepCases)("20 000 levels of nesting in %s: an error envelope, and no lasting harm", async (_, body) => {
    const res = await fetch(`${gw.baseURL}/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${gw.apiKey}`, "content-type": "application/json" },
      body: body(),
    });
    const text = await res.text();
    expect(res.status).toBeGreaterThanOrEqual(400);
    expect(res.headers.get("x-request-id")).toBeTruthy();
    expect(text).not.toContain(".ts:");
    expect(text).not.toContain("Error:");
    const { error } = JSON.parse(text) as { error: { code: string } };
    expect(Object.keys(errorTable)).toContain(error.code);
    expect(gw.gateway.registry.attempts.size).toBe(0);
    await expectHealthyCompletion();
  });

  // The fault is the buyer's: 400 (not a retryable 500 that SDKs would resend).
  test.each(deepCases)("20 000 levels of nesting in %s → 400 invalid_request", async (_, body) => {
    const res = await fetch(`${gw.baseURL}/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${gw.apiKey}`, "content-type": "application/json" },
      body: body(),
    });
    expect(res.status).toBe(400);
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe("invalid_request");
  });

  // Bun's own 413 (past maxRequestBodySize) has no envelope and no X-Request-ID (docs/buyer-api.md): the route
  // must stop reading at the limit itself.
  test("a body over 1 MiB still gets the request_too_large envelope", async () => {
    const c: BadCase = { name: "2 MiB chunked", body: chunkedBody(2 * 1024 * 1024), status: 413, code: "request_too_large", type: "invalid_request_error", param: null };
    await expectRefusal(await send(c), c);
  });

  test("every observed error code is in the one error table", () => {
    expect(observedCodes.size).toBeGreaterThan(5);
    for (const code of observedCodes) {
      expect(Object.keys(errorTable)).toContain(code);
      // The public code must map back to the status/type the table gives (quota_exhausted's 400 row
      // is the request-cap variant).
      const key: ErrorCode = code === "quota_exhausted" ? "quota_exhausted_request_cap" : (code as ErrorCode);
      const observed = cases.filter((c) => c.code === code);
      for (const c of observed) {
        expect({ code, status: c.status, type: c.type }).toEqual({ code, status: errorTable[key].status, type: errorTable[key].type });
      }
    }
  });
});
