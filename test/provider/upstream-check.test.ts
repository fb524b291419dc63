// The provider runtime checks its inference server at start-up (GET /v1/models): it says what is wrong
// in plain words, retries with backoff instead of exiting, and the gateway hears of it only once the
// check passes.
import { afterAll, describe, expect, test } from "bun:test";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { runProviderCommand, type CommandIo } from "../../src/provider/cli.ts";
import { checkUpstream, modelsUrl } from "../../src/provider/openai/upstreamCheck.ts";
import { startMockUpstream } from "../support/mockUpstream.ts";
import { startFakeGateway } from "./fake-gateway.ts";

const HASH = "0123456789abcdef".repeat(4);
const dir = await mkdtemp(join(tmpdir(), "provider-upstream-check-"));
afterAll(() => rm(dir, { recursive: true, force: true }));

/** A port nothing listens on: one a server just let go of. */
function closedPort(): number {
  const server = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => new Response() });
  const port = server.port!;
  server.stop(true);
  return port;
}

describe("checkUpstream", () => {
  test("the models URL from any form of --upstream", () => {
    expect(modelsUrl("http://127.0.0.1:11434")).toBe("http://127.0.0.1:11434/v1/models");
    expect(modelsUrl("http://127.0.0.1:8080/v1/")).toBe("http://127.0.0.1:8080/v1/models");
    expect(modelsUrl("http://h:8000/v1/chat/completions")).toBe("http://h:8000/v1/models");
  });

  test("nothing listening: unreachable, naming the default ports", async () => {
    const result = await checkUpstream({ upstream: `http://127.0.0.1:${closedPort()}`, modelNames: ["m"] });
    expect(result).toMatchObject({ ok: false, problem: "unreachable" });
    expect(!result.ok && result.message).toContain("llama-server listens on 8080 and Ollama on 11434");
  });

  test("a refused key, and a missing one", async () => {
    const upstream = startMockUpstream({ requireKey: "sk-right" });
    try {
      const wrong = await checkUpstream({ upstream: upstream.url, apiKey: "sk-wrong", modelNames: ["m"] });
      expect(wrong).toMatchObject({ ok: false, problem: "key_refused" });
      expect(!wrong.ok && wrong.message).toContain("is not the server's --api-key");
      const none = await checkUpstream({ upstream: upstream.url, modelNames: ["m"] });
      expect(!none.ok && none.message).toContain("give it with --upstream-key-file or GATEWAY_UPSTREAM_KEY");
      expect(await checkUpstream({ upstream: upstream.url, apiKey: "sk-right", modelNames: ["m"] })).toMatchObject({ ok: true });
    } finally {
      await upstream.close();
    }
  });

  test("a model the server does not list (Ollama-style), with the remedy", async () => {
    const upstream = startMockUpstream({ models: ["llama3.2:1b", "qwen2.5:0.5b"] });
    try {
      const missing = await checkUpstream({ upstream: upstream.url, modelNames: ["llama3.2:3b"] });
      expect(missing).toMatchObject({ ok: false, problem: "model_missing" });
      expect(!missing.ok && missing.message).toContain("does not serve 'llama3.2:3b' (it lists 'llama3.2:1b', 'qwen2.5:0.5b')");
      expect(!missing.ok && missing.message).toContain("--upstream-model SERVE_ID=NAME");
      expect(await checkUpstream({ upstream: upstream.url, modelNames: ["qwen2.5:0.5b", "llama3.2:1b"] })).toEqual({ ok: true, listed: ["llama3.2:1b", "qwen2.5:0.5b"], lenient: [] });
    } finally {
      await upstream.close();
    }
  });

  test("llama-server lists its one model under its path and answers any name: accepted, noted", async () => {
    const upstream = startMockUpstream();
    try {
      expect(await checkUpstream({ upstream: upstream.url, modelNames: ["llama3.2-1b"] })).toEqual({ ok: true, listed: ["/models/mock.gguf"], lenient: ["llama3.2-1b"] });
    } finally {
      await upstream.close();
    }
  });

  test("not an OpenAI-compatible root: 404, or an answer without a list", async () => {
    const server = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: (r) => (new URL(r.url).pathname === "/v1/models" ? Response.json({ hello: 1 }) : new Response("no", { status: 404 })) });
    try {
      expect(await checkUpstream({ upstream: `http://127.0.0.1:${server.port}/api`, modelNames: ["m"] })).toMatchObject({ ok: false, problem: "no_models_endpoint" });
      expect(await checkUpstream({ upstream: `http://127.0.0.1:${server.port}`, modelNames: ["m"] })).toMatchObject({ ok: false, problem: "bad_answer" });
    } finally {
      server.stop(true);
    }
  });
});

test("the runtime retries with backoff, advertises nothing meanwhile, and connects once the check passes", async () => {
  // An upstream whose answer the test changes: first it refuses the key, then it lists the model.
  let refuse = true;
  const upstream = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    fetch: () => (refuse ? Response.json({ error: "no" }, { status: 401 }) : Response.json({ object: "list", data: [{ id: "llama3.2:1b", owned_by: "library" }] })),
  });
  const gateway = startFakeGateway({ heartbeatIntervalMs: 1000 });
  const out: string[] = [];
  let finish!: () => void;
  const io: CommandIo = { stdout: (l) => out.push(l), stderr: () => {}, until: new Promise<void>((r) => (finish = r)), env: {} };
  const argv = ["--gateway", gateway.url, "--id", "p-check", "--key-file", join(dir, "k.pem"), "--engine", "openai",
    "--model", `llama3.2:1b=${HASH}`, "--upstream", `http://127.0.0.1:${upstream.port}`, "--backoff-min-ms", "20", "--backoff-max-ms", "80"];
  const exit = runProviderCommand(argv, io);
  try {
    const logs = () => out.map((l) => JSON.parse(l) as Record<string, unknown>);
    const failures = () => logs().filter((l) => l.event === "upstream_check_failed");
    while (failures().length < 4) await Bun.sleep(10);
    expect(failures()[0]).toMatchObject({ level: "warn", problem: "key_refused", attempt: 1, retry_ms: 20, advertising: "nothing until this passes" });
    expect(failures().slice(0, 4).map((l) => l.retry_ms)).toEqual([20, 40, 80, 80]);
    expect(gateway.sessions).toHaveLength(0); // the gateway has not heard of this provider
    refuse = false;
    const session = await gateway.session(0, 5000);
    await session.welcomed;
    expect(session.hello!.models.map((m) => m.model_id)).toEqual(["llama3.2:1b"]);
    expect(logs().find((l) => l.event === "upstream_ready")).toMatchObject({ level: "info", models_listed: 1 });
    finish();
    expect(await exit).toBe(0);
  } finally {
    finish();
    await gateway.stop();
    upstream.stop(true);
  }
});

test("stopped while the upstream is still missing: a clean exit 0", async () => {
  const gateway = startFakeGateway({ heartbeatIntervalMs: 1000 });
  const out: string[] = [];
  let finish!: () => void;
  const io: CommandIo = { stdout: (l) => out.push(l), stderr: () => {}, until: new Promise<void>((r) => (finish = r)), env: {} };
  const exit = runProviderCommand(["--gateway", gateway.url, "--id", "p-none", "--key-file", join(dir, "k2.pem"), "--engine", "openai",
    "--model", `m=${HASH}`, "--upstream", `http://127.0.0.1:${closedPort()}`, "--backoff-min-ms", "10000"], io);
  try {
    while (!out.some((l) => l.includes("upstream_check_failed"))) await Bun.sleep(10);
    finish();
    expect(await exit).toBe(0);
    expect(gateway.sessions).toHaveLength(0);
  } finally {
    finish();
    await gateway.stop();
  }
});
