// `gateway provider --engine openai`: flag handling, and one job through the real wiring
// (fake gateway session → runtime → openai engine → mock upstream).
import { afterAll, describe, expect, test } from "bun:test";
import { mkdtemp, rm } from "node:fs/promises";
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
