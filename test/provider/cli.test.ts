// `gateway provider …`: flag handling in-process, and the real process lifecycle (signals, exit faults).
import { afterAll, describe, expect, test } from "bun:test";
import { mkdtemp, rm, stat } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { runProviderCommand, type CommandIo } from "../../src/provider/cli.ts";
import { loadOrCreateProviderKey } from "../../src/provider/keys.ts";
import type { ChunkFrame } from "../../src/wire/frames.ts";
import { makeJob, startFakeGateway, withTimeout } from "./fake-gateway.ts";

const HASH = "0123456789abcdef".repeat(4);
const dir = await mkdtemp(join(tmpdir(), "provider-cli-"));
afterAll(() => rm(dir, { recursive: true, force: true }));

function capture(until?: Promise<unknown>) {
  const out: string[] = [];
  const err: string[] = [];
  const io: CommandIo = { stdout: (l) => out.push(l), stderr: (l) => err.push(l), until };
  return { io, out, err };
}

const base = (keyFile: string) => ["--gateway", "ws://127.0.0.1:1/v1/provider/connect", "--id", "p1", "--key-file", keyFile];

describe("gateway provider flags", () => {
  test.each([
    ["unknown flag", ["--bogus"], /Unknown option '--bogus'/],
    ["openai without --upstream", ["--engine", "openai", "--model", `m=${HASH}`], /--upstream is required/],
    ["no model", ["--engine", "synthetic"], /at least one --model/],
    ["unknown fault", ["--engine", "synthetic", "--model", `m=${HASH}`, "--synthetic-fault", "explode"], /not a known fault/],
    ["zero concurrency", ["--engine", "synthetic", "--model", `m=${HASH}`, "--max-concurrency", "0"], /--max-concurrency must be an integer/],
    ["upstream with synthetic", ["--engine", "synthetic", "--model", `m=${HASH}`, "--upstream", "http://x"], /--engine openai only/],
    ["unknown engine", ["--engine", "llama", "--model", `m=${HASH}`], /--engine must be synthetic or openai/],
  ] as const)("%s → exit 64 with a usage message", async (_, extra, message) => {
    const { io, err } = capture();
    expect(await runProviderCommand([...base(join(dir, "k.pem")), ...extra], io)).toBe(64);
    expect(err.join("\n")).toMatch(message);
    expect(err.join("\n")).toContain("usage:");
  });

  test("missing --gateway is a usage error", async () => {
    const { io, err } = capture();
    expect(await runProviderCommand(["--id", "p1", "--engine", "synthetic"], io)).toBe(64);
    expect(err[0]).toContain("--gateway is required");
  });

  test("keygen creates the key once (0600) and prints its raw public key in base64", async () => {
    const keyFile = join(dir, "keys", "provider.pem");
    const first = capture();
    expect(await runProviderCommand(["keygen", "--key-file", keyFile], first.io)).toBe(0);
    const printed = JSON.parse(first.out[0]!) as { public_key: string };
    expect(Buffer.from(printed.public_key, "base64").byteLength).toBe(32);
    expect((await stat(keyFile)).mode & 0o777).toBe(0o600);
    const second = capture();
    await runProviderCommand(["keygen", "--key-file", keyFile], second.io);
    expect(JSON.parse(second.out[0]!)).toEqual(printed);
    expect((await loadOrCreateProviderKey(keyFile)).publicKeyBase64).toBe(printed.public_key);
  });

  test("runs a session: model ids may hold ':' ('=' splits first), logs are JSON lines, stop returns 0", async () => {
    const gateway = startFakeGateway({ heartbeatIntervalMs: 1000 });
    let finish!: () => void;
    const { io, out } = capture(new Promise<void>((resolve) => (finish = resolve)));
    const argv = ["--gateway", gateway.url, "--id", "p1", "--key-file", join(dir, "run.pem"), "--engine", "synthetic",
      "--model", `llama3.2:1b=${HASH.toUpperCase()}`, "--max-context-tokens", "4096", "--ram-gb", "8", "--synthetic-fault", "stall"];
    const exit = runProviderCommand(argv, io);
    try {
      const session = await gateway.session(0);
      await session.welcomed;
      expect(session.hello?.models).toEqual([{ model_id: "llama3.2:1b", model_hash: HASH, max_context_tokens: 4096 }]);
      expect(session.hello?.hardware).toEqual({ ram_gb: 8 });
      session.send(makeJob({ request_id: "r-cli", model_id: "llama3.2:1b" }));
      await session.take((f) => f.type === "accepted");
      session.send({ type: "cancel", request_id: "r-cli", attempt_n: 0, reason: "buyer_cancel", delivered_output_bytes: 0 });
      await session.take((f) => f.type === "end");
      finish();
      expect(await exit).toBe(0);
      expect((await session.closed).code).toBe(1000);
      const events = out.map((line) => JSON.parse(line) as { event: string });
      expect(events.map((e) => e.event)).toContain("welcome");
      expect(events.find((e) => e.event === "job_received")).toMatchObject({ request_id: "r-cli", attempt_n: 0 });
      expect(events.find((e) => e.event === "cancel_received")).toMatchObject({ request_id: "r-cli", attempt_n: 0 });
    } finally {
      finish();
      await gateway.stop();
    }
  });
});

/** Reads a child's JSON-line stdout as it arrives; `waitFor` resolves at the first line with that event. */
function jsonLines(stream: ReadableStream<Uint8Array>) {
  const events: Array<{ event: string } & Record<string, unknown>> = [];
  const wakeups = new Set<() => void>();
  void (async () => {
    const decoder = new TextDecoder();
    let buffered = "";
    for await (const bytes of stream) {
      buffered += decoder.decode(bytes, { stream: true });
      const lines = buffered.split("\n");
      buffered = lines.pop() ?? "";
      for (const line of lines) if (line.trim()) events.push(JSON.parse(line));
      for (const wake of [...wakeups]) wake();
    }
  })();
  return {
    events,
    waitFor(event: string) {
      const found = new Promise<void>((resolve) => {
        const check = () => events.some((e) => e.event === event) && (wakeups.delete(check), resolve(), true);
        if (!check()) wakeups.add(check);
      });
      return withTimeout(found, 5000, `log event ${event}`);
    },
  };
}

describe("gateway provider process", () => {
  const main = join(import.meta.dir, "fixtures", "provider-main.ts");
  const spawnProvider = (url: string, id: string, ...extra: string[]) =>
    Bun.spawn(["bun", main, "--gateway", url, "--id", id, "--key-file", join(dir, `${id}.pem`), "--engine", "synthetic",
      "--model", `m=${HASH}`, "--synthetic-tokens-per-second", "0", ...extra], { stdout: "pipe", stderr: "pipe" });

  test("SIGTERM stops it cleanly with exit 0", async () => {
    const gateway = startFakeGateway();
    const child = spawnProvider(gateway.url, "p-term");
    try {
      const log = jsonLines(child.stdout);
      const session = await gateway.session(0, 5000);
      await log.waitFor("welcome");
      child.kill("SIGTERM");
      expect(await withTimeout(child.exited, 5000, "exit")).toBe(0);
      expect((await session.closed).code).toBe(1000);
      await log.waitFor("stopped");
      expect(log.events.map((l) => l.event)).toEqual(expect.arrayContaining(["started", "welcome", "stopping", "stopped"]));
      expect(log.events.find((l) => l.event === "stopping")).toMatchObject({ signal: "SIGTERM" });
    } finally {
      child.kill();
      await gateway.stop();
    }
  });

  test("the exit-after fault kills the process mid-stream (exit 1, no end frame)", async () => {
    const gateway = startFakeGateway();
    const child = spawnProvider(gateway.url, "p-exit", "--synthetic-fault", "exit-after:2");
    try {
      const log = jsonLines(child.stdout);
      const session = await gateway.session(0, 5000);
      await log.waitFor("welcome");
      session.send(makeJob({ request_id: "r-exit", model_id: "m" }));
      expect(await withTimeout(child.exited, 5000, "exit")).toBe(1);
      await session.closed;
      // Both tokens went out before the exit (in one frame: they were emitted together).
      const chunks = session.frames.filter((f): f is ChunkFrame => f.type === "chunk");
      expect(chunks.reduce((n, c) => n + c.tokens, 0)).toBe(2);
      expect(session.frames.some((f) => f.type === "end")).toBe(false);
    } finally {
      child.kill();
      await gateway.stop();
    }
  });
});
