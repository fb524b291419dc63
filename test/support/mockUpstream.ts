// A fault-injecting mock of an OpenAI-compatible server (POST /v1/chat/completions) on a random
// loopback port: what a provider's `openai` engine talks to in tests and benchmarks.
//
// The behaviour is chosen per request, first match wins:
//   1. a one-shot queue (`mock.next(...)`),
//   2. the request's `model` when it names a scenario (`"stall-mid"`, `"slow-first:300"`,
//      `"fixture:vllm-2025-04-stream-toolcall.sse"`),
//   3. the mock's current default (`mock.scenario = ...`, initially "happy").
//
// Faults are real socket behaviour: a reset is the response stream erroring (Bun drops the connection,
// before or after the headers), a stall is a stream that never yields again, "never" sends no headers.
import { readFileSync } from "node:fs";
import { join } from "node:path";

export const FIXTURE_DIR = join(import.meta.dir, "../fixtures/upstreams");

export type ScenarioKind =
  | "happy" // role chunk, one chunk per token, finish chunk, usage chunk, [DONE]
  | "nonstream" // one application/json chat.completion (an upstream that ignores stream: true)
  | "reasoning" // reasoning_content deltas, then content (llama.cpp style)
  | "usage-per-chunk" // cumulative usage on every chunk (vLLM continuous_usage_stats)
  | "tools" // one tool call streamed as fragments, finish tool_calls
  | "rate-limit" // 429, no Retry-After
  | "rate-limit-retry-after" // 429 with Retry-After: 1
  | "server-500"
  | "server-503" // llama.cpp "Loading model"
  | "context-400" // llama.cpp exceed_context_size_error
  | "bad-request-400"
  | "not-found-404" // Ollama: model not found
  | "auth-401"
  | "reset-before" // connection dropped before any response byte
  | "reset-mid" // connection dropped after `at` tokens
  | "never" // accepts the connection, never answers
  | "slow-first" // first token after `delayMs`, then normal
  | "cut-mid" // body ends cleanly after `at` tokens: no finish, no [DONE]
  | "stall-mid" // after `at` tokens, silence forever (connection stays open)
  | "malformed-first" // a non-JSON data event before any token
  | "malformed-mid" // a non-JSON data event after `at` tokens
  | "no-done" // every token, finish and usage, then a clean end without [DONE]
  | "error-event-mid" // vLLM-style `data: {"error": …}` after `at` tokens, then [DONE]
  | "legacy-error-field" // llama.cpp b5966: `error: {…}` field line (context overflow), then [DONE]
  | "fixture"; // replays a file from test/fixtures/upstreams

export interface Scenario {
  kind: ScenarioKind;
  /** Content tokens of generated answers (default: MOCK_TOKENS). */
  tokens?: readonly string[];
  /** Pause between chunks (default 0). */
  intervalMs?: number;
  /** slow-first: delay before the first token (default 500). */
  delayMs?: number;
  /** Mid-stream faults: how many tokens go out first (default: half the answer). */
  at?: number;
  /** prompt_tokens the usage chunk reports (default MOCK_PROMPT_TOKENS). */
  promptTokens?: number;
  /** fixture: file name under test/fixtures/upstreams. */
  file?: string;
  /** fixture: HTTP status for .json files (default 200). */
  status?: number;
  /** fixture: deliver the body in reads of this many bytes (default: the whole body at once). */
  chunkBytes?: number;
  /** fixture: append `data: [DONE]` (for captures whose publisher did not show the end). */
  appendDone?: boolean;
  /** fixture: rewrites the SSE body before it is sent (a test deriving a variant of a capture says so). */
  transform?: (body: string) => string;
}

export const MOCK_TOKENS: readonly string[] = ["Hello", " from", " the", " mock", " upstream", " server", "."];
export const MOCK_PROMPT_TOKENS = 11;

export interface RecordedRequest {
  path: string;
  authorization: string | null;
  body: Record<string, unknown>;
  scenario: ScenarioKind;
}

export interface MockUpstream {
  /** Server root, e.g. http://127.0.0.1:PORT (what `--upstream` takes). */
  readonly url: string;
  readonly port: number;
  readonly requests: RecordedRequest[];
  /** The default scenario for requests that name none. */
  scenario: Scenario | ScenarioKind;
  /** Queues scenarios for the next requests, one each. */
  next(...scenarios: (Scenario | ScenarioKind)[]): void;
  /** Requests now being answered (a connection the engine did not release shows up here). */
  readonly open: number;
  close(): Promise<void>;
}

export interface MockUpstreamOptions {
  scenario?: Scenario | ScenarioKind;
  /** When set, requests without `Authorization: Bearer <requireKey>` get 401. */
  requireKey?: string;
  /** Keep every request in `requests` (default true; a long benchmark turns it off). */
  record?: boolean;
  /**
   * What GET /v1/models lists (Ollama-style, `owned_by: "library"`). Default: one llama-server-style
   * entry (`owned_by: "llamacpp"`), which, like llama-server, answers whatever model a request names.
   */
  models?: readonly string[];
}

type Step = { write: string | Uint8Array } | { sleepMs: number } | { reset: true } | { hang: true };

const encoder = new TextEncoder();
const KINDS: ReadonlySet<string> = new Set<ScenarioKind>([
  "happy", "nonstream", "reasoning", "usage-per-chunk", "tools", "rate-limit", "rate-limit-retry-after",
  "server-500", "server-503", "context-400", "bad-request-400", "not-found-404", "auth-401", "reset-before",
  "reset-mid", "never", "slow-first", "cut-mid", "stall-mid", "malformed-first", "malformed-mid", "no-done",
  "error-event-mid", "legacy-error-field", "fixture",
]);

/**
 * `"kind"`, `"kind:N"` (at, or delayMs for slow-first), `"fixture:FILE"`, optionally followed by
 * `?tokens=N&intervalMs=N&delayMs=N&at=N` (tokens = a generated answer of N tokens); null when the
 * name is not a scenario.
 */
export function parseScenario(name: string): Scenario | null {
  const q = name.indexOf("?");
  const head = q < 0 ? name : name.slice(0, q);
  const colon = head.indexOf(":");
  const kind = colon < 0 ? head : head.slice(0, colon);
  const arg = colon < 0 ? undefined : head.slice(colon + 1);
  if (!KINDS.has(kind)) return null;
  let scenario: Scenario;
  if (kind === "fixture") {
    if (!arg) return null;
    scenario = { kind, file: arg };
  } else if (arg === undefined) scenario = { kind: kind as ScenarioKind };
  else {
    const n = Number(arg);
    if (!Number.isInteger(n) || n < 0) return null;
    scenario = kind === "slow-first" ? { kind, delayMs: n } : { kind: kind as ScenarioKind, at: n };
  }
  for (const [key, value] of new URLSearchParams(q < 0 ? "" : name.slice(q + 1))) {
    const n = Number(value);
    if (!Number.isInteger(n) || n < 0) return null;
    if (key === "tokens") scenario.tokens = Array.from({ length: n }, (_, i) => (i === 0 ? "Token" : ` t${i}`));
    else if (key === "intervalMs" || key === "delayMs" || key === "at") scenario[key] = n;
    else return null;
  }
  return scenario;
}

const asScenario = (s: Scenario | ScenarioKind): Scenario => (typeof s === "string" ? { kind: s } : s);

// ---- bodies ----

let ids = 0;

function chunkJson(id: string, model: string, choice: Record<string, unknown> | null, extra: Record<string, unknown> = {}): string {
  return JSON.stringify({
    id,
    object: "chat.completion.chunk",
    created: 1_790_000_000,
    model,
    choices: choice === null ? [] : [{ index: 0, ...choice }],
    ...extra,
  });
}

const sse = (json: string) => ({ write: `data: ${json}\n\n` });

/** The steps of a streamed answer, cut or faulted as the scenario says. */
function streamSteps(s: Scenario, model: string, maxTokens: number): Step[] {
  const id = `chatcmpl-mock${++ids}`;
  const all = s.tokens ?? MOCK_TOKENS;
  const tokens = all.slice(0, Math.max(0, maxTokens));
  const finish = tokens.length < all.length ? "length" : "stop";
  const at = Math.min(s.at ?? Math.floor(tokens.length / 2), tokens.length);
  const interval = s.intervalMs ?? 0;
  const steps: Step[] = [sse(chunkJson(id, model, { delta: { role: "assistant", content: "" }, finish_reason: null }))];
  if (s.kind === "malformed-first") return [...steps, { write: 'data: {"choices": [{"delta": {"content": "oops"\n\n' }];
  if (s.kind === "slow-first") steps.push({ sleepMs: s.delayMs ?? 500 });
  if (s.kind === "reasoning") {
    for (const r of ["Let me", " think."]) {
      steps.push(sse(chunkJson(id, model, { delta: { reasoning_content: r }, finish_reason: null })));
    }
  }
  for (let i = 0; i < tokens.length; i++) {
    if (i === at) {
      // The pause lets the bytes already written reach the client before the connection drops.
      if (s.kind === "reset-mid") return [...steps, { sleepMs: 20 }, { reset: true }];
      if (s.kind === "cut-mid") return steps;
      if (s.kind === "stall-mid") return [...steps, { hang: true }];
      if (s.kind === "malformed-mid") steps.push({ write: "data: {this is not json}\n\n" });
      if (s.kind === "error-event-mid") {
        // vLLM's error frame: Python json.dumps separators, then [DONE].
        const error = { error: { object: "error", message: "CUDA out of memory", type: "InternalServerError", param: null, code: 500 } };
        return [...steps, { write: `data: ${JSON.stringify(error, null, 0).replaceAll('":', '": ')}\n\n` }, { write: "data: [DONE]\n\n" }];
      }
    }
    if (i > 0 && interval > 0) steps.push({ sleepMs: interval });
    const extra = s.kind === "usage-per-chunk" ? { usage: { prompt_tokens: MOCK_PROMPT_TOKENS, completion_tokens: (i + 1) * 2, total_tokens: 0 } } : {};
    steps.push(sse(chunkJson(id, model, { delta: { content: tokens[i] }, finish_reason: null }, extra)));
  }
  steps.push(sse(chunkJson(id, model, { delta: {}, finish_reason: finish })));
  const prompt = s.promptTokens ?? MOCK_PROMPT_TOKENS;
  const usage = { prompt_tokens: prompt, completion_tokens: tokens.length, total_tokens: prompt + tokens.length };
  steps.push(sse(chunkJson(id, model, null, { usage })));
  if (s.kind !== "no-done") steps.push({ write: "data: [DONE]\n\n" });
  return steps;
}

function toolSteps(model: string): Step[] {
  const id = `chatcmpl-mock${++ids}`;
  const call = (fn: Record<string, unknown>, head = false) =>
    sse(chunkJson(id, model, { delta: { tool_calls: [{ index: 0, ...(head ? { id: "call_mock1", type: "function" } : {}), function: fn }] }, finish_reason: null }));
  return [
    sse(chunkJson(id, model, { delta: { role: "assistant", content: null }, finish_reason: null })),
    call({ name: "get_weather", arguments: "" }, true),
    call({ arguments: '{"city":' }),
    call({ arguments: '"Paris"}' }),
    sse(chunkJson(id, model, { delta: {}, finish_reason: "tool_calls" })),
    sse(chunkJson(id, model, null, { usage: { prompt_tokens: MOCK_PROMPT_TOKENS, completion_tokens: 9, total_tokens: 20 } })),
    { write: "data: [DONE]\n\n" },
  ];
}

/** Fixture bytes as an SSE body: .sse verbatim; .jsonl/.txt get their `data: ` prefixes back. */
function fixtureBody(file: string): string {
  const text = readFileSync(join(FIXTURE_DIR, file), "utf8");
  if (file.endsWith(".sse")) return text;
  return text
    .split("\n")
    .filter((line) => line.trim() !== "")
    .map((line) => `data: ${line}\n\n`)
    .join("");
}

function stepStream(steps: Step[], signal: AbortSignal, done: () => void): ReadableStream<Uint8Array> {
  let i = 0;
  const finished = () => {
    done();
    i = steps.length;
  };
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      while (i < steps.length) {
        const step = steps[i++]!;
        if ("write" in step) return controller.enqueue(typeof step.write === "string" ? encoder.encode(step.write) : step.write);
        if ("sleepMs" in step) await abortableSleep(step.sleepMs, signal);
        else if ("reset" in step) {
          finished();
          return controller.error(undefined); // Bun drops the connection (a quiet error: no log noise)
        } else {
          await abortableSleep(Number.POSITIVE_INFINITY, signal);
          finished();
          return controller.error(undefined);
        }
        if (signal.aborted) {
          finished();
          return controller.error(undefined);
        }
      }
      finished();
      controller.close();
    },
    cancel: finished,
  });
}

function abortableSleep(ms: number, signal: AbortSignal): Promise<void> {
  if (signal.aborted) return Promise.resolve();
  return new Promise((resolve) => {
    const timer = Number.isFinite(ms) ? setTimeout(finish, ms) : null;
    function finish() {
      if (timer !== null) clearTimeout(timer);
      signal.removeEventListener("abort", finish);
      resolve();
    }
    signal.addEventListener("abort", finish, { once: true });
  });
}

function jsonResponse(status: number, body: unknown, headers: Record<string, string> = {}): Response {
  return new Response(JSON.stringify(body), { status, headers: { "content-type": "application/json", ...headers } });
}

const ERROR_BODIES: Partial<Record<ScenarioKind, [number, unknown, Record<string, string>?]>> = {
  "rate-limit": [429, { error: { message: "Too many requests", type: "rate_limit_error", code: 429 } }],
  "rate-limit-retry-after": [429, { error: { message: "Too many requests", type: "rate_limit_error", code: 429 } }, { "retry-after": "1" }],
  "server-500": [500, { error: { code: 500, message: "tools param requires --jinja flag", type: "server_error" } }],
  "server-503": [503, { error: { code: 503, message: "Loading model", type: "unavailable_error" } }],
  "context-400": [400, JSON.parse(readFileSync(join(FIXTURE_DIR, "llamacpp-error-context-exceeded-400.json"), "utf8"))],
  "bad-request-400": [400, { error: { message: "'temperature' must be <= 2", type: "invalid_request_error", param: null, code: null } }],
  "not-found-404": [404, { error: { message: 'model "x" not found, try pulling it first', type: "not_found_error", param: null, code: null } }],
  "auth-401": [401, { error: { message: "Invalid API Key", type: "authentication_error", code: 401 } }],
};

/** Starts the mock on 127.0.0.1 with a free port. */
export function startMockUpstream(options: MockUpstreamOptions = {}): MockUpstream {
  const requests: RecordedRequest[] = [];
  const queue: Scenario[] = [];
  const hanging = new Set<() => void>();
  let open = 0;

  function respond(s: Scenario, body: Record<string, unknown>, signal: AbortSignal): Response | Promise<Response> {
    const model = typeof body.model === "string" ? body.model : "";
    const maxTokens = typeof body.max_tokens === "number" ? body.max_tokens : Number.MAX_SAFE_INTEGER;
    const error = ERROR_BODIES[s.kind];
    if (error) return jsonResponse(error[0], error[1], error[2]);
    const stream = (steps: Step[], status = 200) => {
      open++;
      let closed = false;
      const done = () => {
        if (!closed) open--;
        closed = true;
      };
      return new Response(stepStream(steps, signal, done), { status, headers: { "content-type": "text/event-stream", "cache-control": "no-cache" } });
    };
    switch (s.kind) {
      case "never":
        open++;
        return new Promise<Response>((resolve) => {
          const release = () => {
            hanging.delete(release);
            open--;
            resolve(new Response(null, { status: 504 }));
          };
          hanging.add(release);
          signal.addEventListener("abort", release, { once: true });
        });
      case "reset-before":
        return stream([{ reset: true }]);
      case "nonstream": {
        const tokens = (s.tokens ?? MOCK_TOKENS).slice(0, maxTokens);
        return jsonResponse(200, {
          id: `chatcmpl-mock${++ids}`,
          object: "chat.completion",
          created: 1_790_000_000,
          model,
          choices: [{ index: 0, message: { role: "assistant", content: tokens.join("") }, finish_reason: "stop" }],
          usage: { prompt_tokens: MOCK_PROMPT_TOKENS, completion_tokens: tokens.length, total_tokens: MOCK_PROMPT_TOKENS + tokens.length },
        });
      }
      case "legacy-error-field": {
        const text = readFileSync(join(FIXTURE_DIR, "llamacpp-b5966-stream-midstream-error-legacy-field.sse"), "utf8");
        return stream([{ write: text }]);
      }
      case "tools":
        return stream(toolSteps(model));
      case "fixture": {
        const file = s.file ?? "";
        if (file.endsWith(".json")) {
          return new Response(readFileSync(join(FIXTURE_DIR, file)), { status: s.status ?? 200, headers: { "content-type": "application/json" } });
        }
        const body = fixtureBody(file) + (s.appendDone ? "data: [DONE]\n\n" : "");
        const bytes = encoder.encode(s.transform ? s.transform(body) : body);
        const size = s.chunkBytes ?? bytes.byteLength;
        const steps: Step[] = [];
        // Byte-level splits on purpose: events (and UTF-8 sequences) cut across reads.
        for (let i = 0; i < bytes.byteLength; i += size) steps.push({ write: bytes.slice(i, i + size) }, { sleepMs: 1 });
        return stream(steps);
      }
      default:
        return stream(streamSteps(s, model, maxTokens));
    }
  }

  const server = Bun.serve({
    hostname: "127.0.0.1",
    port: 0,
    idleTimeout: 0, // "never" and "stall-mid" must not be rescued by the server's own idle close
    async fetch(req) {
      const path = new URL(req.url).pathname;
      if (req.method === "GET" && path === "/v1/models") {
        // The provider runtime's start-up check (src/provider/openai/upstreamCheck.ts).
        if (options.requireKey !== undefined && req.headers.get("authorization") !== `Bearer ${options.requireKey}`) {
          return jsonResponse(401, { error: { message: "Invalid API Key", type: "authentication_error" } });
        }
        const data = options.models
          ? options.models.map((id) => ({ id, object: "model", created: 1_790_000_000, owned_by: "library" }))
          : [{ id: "/models/mock.gguf", object: "model", created: 1_790_000_000, owned_by: "llamacpp" }];
        return jsonResponse(200, { object: "list", data });
      }
      if (req.method !== "POST" || !/\/chat\/completions$/.test(path)) return jsonResponse(404, { error: "not found" });
      let body: Record<string, unknown>;
      try {
        body = (await req.json()) as Record<string, unknown>;
      } catch {
        return jsonResponse(400, { error: { message: "bad json", type: "invalid_request_error" } });
      }
      const authorization = req.headers.get("authorization");
      const byModel = typeof body.model === "string" ? parseScenario(body.model) : null;
      let s = queue.shift() ?? byModel ?? asScenario(mock.scenario);
      if (options.requireKey !== undefined && authorization !== `Bearer ${options.requireKey}`) s = { kind: "auth-401" };
      if (options.record !== false) requests.push({ path, authorization, body, scenario: s.kind });
      return respond(s, body, req.signal);
    },
  });

  const mock: MockUpstream = {
    url: `http://127.0.0.1:${server.port}`,
    port: server.port as number,
    requests,
    scenario: options.scenario ?? "happy",
    next: (...scenarios) => void queue.push(...scenarios.map(asScenario)),
    get open() {
      return open;
    },
    async close() {
      for (const release of [...hanging]) release();
      await server.stop(true);
    },
  };
  return mock;
}

// `bun test/support/mockUpstream.ts`: a standalone mock on a free port (benchmarks run it as its own
// process, choosing behaviour by model name); prints {"event":"mock_listening",…} and serves until killed.
if (import.meta.main) {
  const mock = startMockUpstream({ record: false });
  console.log(JSON.stringify({ event: "mock_listening", url: mock.url, port: mock.port }));
}
