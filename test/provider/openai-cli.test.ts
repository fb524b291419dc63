// `gateway provider --engine openai`: flag handling, and one job through the real wiring
// (fake gateway session → runtime → openai engine → mock upstream).
import { afterAll, describe, expect, test } from "bun:test";
import { chmod, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { PROVIDER_USAGE, runProviderCommand, type CommandIo } from "../../src/provider/cli.ts";
import { MOCK_TOKENS, startMockUpstream } from "../support/mockUpstream.ts";
import { makeJob, startFakeGateway } from "./fake-gateway.ts";

const HASH = "0123456789abcdef".repeat(4);
const dir = await mkdtemp(join(tmpdir(), "provider-openai-cli-"));
afterAll(() => rm(dir, { recursive: true, force: true }));

function capture(until?: Promise<unknown>) {
  const out: string[] = [];
  const err: string[] = [];
  const io: CommandIo = { stdout: (l) => out.push(l), stderr: (l) => err.push(l), until };
  return { io, out, err };
}

const base = ["--gateway", "ws://127.0.0.1:1/v1/provider/connect", "--id", "p1", "--key-file", join(dir, "k.pem")];
const openai = ["--engine", "openai", "--model", `m=${HASH}`];

describe("flags", () => {
  test.each([
    ["no --upstream", [...openai], /--upstream is required/],
    ["a non-http upstream", [...openai, "--upstream", "ws://127.0.0.1:8080"], /--upstream must be an http/],
    ["an upstream without scheme", [...openai, "--upstream", "127.0.0.1:8080"], /--upstream must be an http/],
    ["an upstream model for an unknown serve id", [...openai, "--upstream", "http://x", "--upstream-model", "other=llama3"], /no --model with that serve id/],
    ["an upstream model without '='", [...openai, "--upstream", "http://x", "--upstream-model", "llama3"], /expected SERVE_ID=NAME/],
    ["an upstream model given twice", [...openai, "--upstream", "http://x", "--upstream-model", "m=a", "--upstream-model", "m=b"], /given twice/],
    ["a zero first-token timeout", [...openai, "--upstream", "http://x", "--upstream-first-token-timeout-ms", "0"], /--upstream-first-token-timeout-ms must be an integer/],
    ["a non-numeric idle timeout", [...openai, "--upstream", "http://x", "--upstream-idle-timeout-ms", "soon"], /--upstream-idle-timeout-ms must be an integer/],
    ["a synthetic flag with openai", [...openai, "--upstream", "http://x", "--synthetic-fault", "stall"], /--synthetic-fault applies to --engine synthetic only/],
    ["an upstream timeout with synthetic", ["--engine", "synthetic", "--model", `m=${HASH}`, "--upstream-idle-timeout-ms", "5"], /--upstream-idle-timeout-ms applies to --engine openai only/],
  ] as const)("%s → exit 64 with a usage message", async (_, extra, message) => {
    const { io, err } = capture();
    expect(await runProviderCommand([...base, ...extra], io)).toBe(64);
    expect(err.join("\n")).toMatch(message);
    expect(err.join("\n")).toContain("usage:");
  });

  test("the usage text lists the upstream timeout flags", () => {
    expect(PROVIDER_USAGE).toContain("--upstream-first-token-timeout-ms N");
    expect(PROVIDER_USAGE).toContain("--upstream-idle-timeout-ms N");
  });
});

test("a job runs through the runtime and the openai engine to the upstream and back", async () => {
  const upstream = startMockUpstream({ requireKey: "sk-x" });
  const gateway = startFakeGateway({ heartbeatIntervalMs: 1000 });
  let finish!: () => void;
  const { io, out } = capture(new Promise<void>((resolve) => (finish = resolve)));
  const argv = ["--gateway", gateway.url, "--id", "p1", "--key-file", join(dir, "run.pem"), "--engine", "openai",
    "--model", `llama3.2:1b=${HASH}`, "--upstream", upstream.url, "--upstream-key", "sk-x",
    "--upstream-model", "llama3.2:1b=llama3.2:1b-instruct-q4"];
  const exit = runProviderCommand(argv, io);
  try {
    const session = await gateway.session(0);
    await session.welcomed;
    session.send(makeJob({ request_id: "r-oa", model_id: "llama3.2:1b" }));
    await session.take((f) => f.type === "accepted");
    const end = await session.take((f) => f.type === "end");
    expect(end).toMatchObject({ terminal_state: "normal_done", finish_reason: "stop", usage: { input_tokens: 11, output_tokens: MOCK_TOKENS.length } });
    expect(upstream.requests[0]?.body.model).toBe("llama3.2:1b-instruct-q4");
    finish();
    expect(await exit).toBe(0);
    const logged = out.join("\n");
    expect(logged).toContain('"engine":"openai"');
    expect(logged).not.toContain("sk-x");
    expect(logged).not.toContain("rivers"); // the prompt
  } finally {
    finish();
    await gateway.stop();
    await upstream.close();
  }
});

describe("the upstream key: --upstream-key-file, GATEWAY_UPSTREAM_KEY, --upstream-key", () => {
  /** Runs one job with `extra` flags and `env`; what the upstream saw and what was logged. */
  async function oneJob(extra: string[], env: Record<string, string | undefined> = {}) {
    const upstream = startMockUpstream({ requireKey: "sk-secret" });
    const gateway = startFakeGateway({ heartbeatIntervalMs: 1000 });
    let finish!: () => void;
    const { io, out, err } = capture(new Promise<void>((resolve) => (finish = resolve)));
    io.env = env;
    const argv = ["--gateway", gateway.url, "--id", "p1", "--key-file", join(dir, "key-src.pem"), "--engine", "openai", "--model", `m=${HASH}`, "--upstream", upstream.url, ...extra];
    const exit = runProviderCommand(argv, io);
    try {
      const session = await gateway.session(0);
      await session.welcomed;
      session.send(makeJob({ request_id: "r-key", model_id: "m" }));
      const end = await session.take((f) => f.type === "end");
      finish();
      expect(await exit).toBe(0);
      return { end, out, err, logs: out.map((l) => JSON.parse(l) as Record<string, unknown>) };
    } finally {
      finish();
      await gateway.stop();
      await upstream.close();
    }
  }

  test("a key file (trailing newline trimmed) authenticates, and nothing logs the key", async () => {
    const file = join(dir, "upstream.key");
    await Bun.write(file, "sk-secret\n");
    await chmod(file, 0o600);
    const { end, out } = await oneJob(["--upstream-key-file", file]);
    expect(end).toMatchObject({ terminal_state: "normal_done" });
    expect(out.join("\n")).not.toContain("sk-secret");
    expect(out.join("\n")).not.toContain("upstream_key_file_insecure_mode");
  });

  test("GATEWAY_UPSTREAM_KEY authenticates when no flag names a key", async () => {
    const { end } = await oneJob([], { GATEWAY_UPSTREAM_KEY: "sk-secret" });
    expect(end).toMatchObject({ terminal_state: "normal_done" });
  });

  test("--upstream-key still works, with a warning that ps shows it", async () => {
    const { end, logs } = await oneJob(["--upstream-key", "sk-secret"], { GATEWAY_UPSTREAM_KEY: "sk-other" });
    expect(end).toMatchObject({ terminal_state: "normal_done" });
    expect(logs.find((l) => l.event === "upstream_key_on_command_line")).toMatchObject({ level: "warn" });
  });

  test("a key file readable by others is used and warned about", async () => {
    const file = join(dir, "open.key");
    await Bun.write(file, "sk-secret");
    await chmod(file, 0o644);
    const { logs } = await oneJob(["--upstream-key-file", file]);
    expect(logs.find((l) => l.event === "upstream_key_file_insecure_mode")).toMatchObject({ level: "warn", fix: `chmod 600 ${file}` });
  });

  test("both flags → 64; a missing or empty key file → 1, never a run without the key", async () => {
    const empty = join(dir, "empty.key");
    await Bun.write(empty, "\n");
    const run = async (extra: string[]) => {
      const { io, err } = capture();
      return { code: await runProviderCommand([...base, ...openai, "--upstream", "http://127.0.0.1:1", ...extra], io), err: err.join("\n") };
    };
    expect(await run(["--upstream-key", "a", "--upstream-key-file", empty])).toMatchObject({ code: 64, err: expect.stringContaining("not both") });
    expect(await run(["--upstream-key-file", join(dir, "absent.key")])).toMatchObject({ code: 1, err: expect.stringContaining("ENOENT") });
    expect(await run(["--upstream-key-file", empty])).toMatchObject({ code: 1, err: expect.stringContaining("is empty") });
  });

  test("every provider log line carries a level, as the gateway's do", async () => {
    const { logs } = await oneJob([], { GATEWAY_UPSTREAM_KEY: "sk-secret" });
    expect(logs.length).toBeGreaterThan(3);
    for (const line of logs) expect(["debug", "info", "warn", "error"]).toContain(line.level as string);
    expect(Object.keys(logs[0]!).slice(0, 3)).toEqual(["ts", "level", "event"]);
  });
});
