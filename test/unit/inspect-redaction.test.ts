// What may reach an inspector: structure and counts, never prompts, outputs or credentials.
import { describe, expect, test } from "bun:test";
import { createActor, createMachine } from "xstate";
import { inspectorUrlProblem, redactForInspector, REDACTED } from "../../src/inspect.ts";

const API_KEY = "gw_" + "Ab3_-x".repeat(7) + "Q"; // the gateway's key shape: prefix + 43 base64url chars

describe("redactForInspector", () => {
  test("a provider chunk keeps its counters and loses its text and tool-call arguments", () => {
    const event = {
      type: "provider.chunk",
      frame: { type: "chunk", request_id: "req_1", attempt_n: 0, seq: 4, content: "the output", tool_calls: [{ index: 0, arguments: "{}" }], tokens: 2 },
    };
    expect(redactForInspector(event) as unknown).toEqual({
      type: "provider.chunk",
      frame: { type: "chunk", request_id: "req_1", attempt_n: 0, seq: 4, content: REDACTED, tool_calls: REDACTED, tokens: 2 },
    });
  });

  test.each([
    ["messages", { messages: [{ role: "user", content: "my prompt" }] }],
    ["a prompt", { prompt: "my prompt" }],
    ["an OpenAI-style delta", { choices: [{ delta: { content: "out" } }] }],
    ["tools and params.stop", { params: { tools: [{ description: "my prompt" }], stop: ["my prompt"] } }],
    ["camelCase and snake_case credentials", { apiKey: "k1", api_key: "k2", upstream_key: "k3", Authorization: "k4", gatewaySecret: "k5" }],
  ])("%s are redacted at any depth", (_, value) => {
    const out = JSON.stringify(redactForInspector({ deep: { deeper: value } }));
    for (const secret of ["my prompt", "out", "k1", "k2", "k3", "k4", "k5"]) expect(out).not.toContain(`"${secret}"`);
    expect(out).toContain(REDACTED);
  });

  test("key-shaped strings, bearer tokens and PEM private keys are scrubbed inside any string", () => {
    const out = redactForInspector({
      note: `rejected ${API_KEY} for account`,
      header: "Bearer sk-live-abc123",
      definition: `{"pem":"-----BEGIN PRIVATE KEY-----\\nMC4CAQAwBQYDK2VwBCIEI\\n-----END PRIVATE KEY-----"}`,
    });
    expect(JSON.stringify(out)).not.toContain(API_KEY);
    expect(JSON.stringify(out)).not.toContain("sk-live-abc123");
    expect(JSON.stringify(out)).not.toContain("MC4CAQAwBQYDK2VwBCIEI");
    expect(out.note).toBe(`rejected ${REDACTED} for account`);
  });

  test("ids, counts and states pass unchanged", () => {
    const value = { requestId: "req_0123456789abcdef01234567", sessionId: "sess_0123456789abcdef", tokens: 7, deliveredBytes: 12, value: { admitted: "ready" }, committed: true, failure: null };
    expect(redactForInspector(value)).toEqual(value);
  });

  test("bytes become their length, errors their name; functions vanish; cycles and depth are bounded", () => {
    const cyclic: Record<string, unknown> = { n: 1 };
    cyclic.self = cyclic;
    let deep: Record<string, unknown> = {};
    const root = deep;
    for (let i = 0; i < 50; i++) deep = (deep.next = {}) as Record<string, unknown>;
    const out = redactForInspector({ nonce: new Uint8Array(32), error: new Error(`upstream said ${API_KEY}`), fn: () => 1, cyclic, root, when: new Date(0) }) as Record<string, unknown>;
    expect(out.nonce).toBe("[32 bytes]");
    expect(out.error).toEqual({ name: "Error" });
    expect("fn" in out).toBe(false);
    expect(out.cyclic).toEqual({ n: 1, self: "[circular]" });
    expect(JSON.stringify(out.root)).toContain("[too deep]");
    expect(out.when).toBe("1970-01-01T00:00:00.000Z");
  });

  test("never mutates its input", () => {
    const input = { context: { messages: [{ role: "user", content: "keep me" }] } };
    const copy = structuredClone(input);
    redactForInspector(input);
    expect(input).toEqual(copy);
  });

  test("a live XState snapshot (toJSON, actor refs) is reduced to plain redacted JSON", () => {
    const machine = createMachine({ id: "m", context: { prompt: "my prompt", tokens: 3 }, initial: "a", states: { a: {} } });
    const actor = createActor(machine).start();
    const out = JSON.parse(JSON.stringify(redactForInspector(actor.getSnapshot()))) as { value: string; context: unknown };
    expect(out.value).toBe("a");
    expect(out.context).toEqual({ prompt: REDACTED, tokens: 3 });
    actor.stop();
  });
});

describe("inspectorUrlProblem", () => {
  const gateway = { host: "127.0.0.1", port: 8080 };
  test.each([
    ["ws://127.0.0.1:8090", null],
    ["wss://inspector.example:443", null],
    ["ws://localhost:8080", "own port"],
    ["ws://127.0.0.1:8080/x", "own port"],
    ["http://127.0.0.1:8090", "ws://"],
    ["not a url", "not a URL"],
  ])("%s", (url, problem) => {
    const got = inspectorUrlProblem(url, gateway);
    if (problem === null) expect(got).toBeNull();
    else expect(got).toContain(problem);
  });
});
