// The README's "Running it for real" block, run as written: one bash per terminal, on two stand-in
// machines (folders with their own HOME), in the block's order. The only changes are the ones a
// single test machine forces: free ports instead of 8080 (the gateway's, and llama-server's on the
// provider machine), GATEWAY_HOST → 127.0.0.1, and a mock standing in for llama-server on PATH.
import { afterAll, expect, test } from "bun:test";
import { mkdirSync, readFileSync, rmSync, symlinkSync, writeFileSync, chmodSync } from "node:fs";
import { join } from "node:path";
import { randomBytes } from "node:crypto";
import { tempDir } from "../support/harness.ts";

const root = join(import.meta.dir, "../..");
const readme = readFileSync(join(root, "README.md"), "utf8");
const section = readme.slice(readme.indexOf("## Running it for real"), readme.indexOf("## Single binary"));
const block = /```sh\n([\s\S]*?)```/.exec(section)![1]!;

interface Step {
  terminal: number;
  machine: "gateway" | "provider";
  keepsRunning: boolean;
  lines: string[];
}

/** The block's sections in order: "# Terminal N — X machine (keeps running): …" then its commands. */
function parseBlock(text: string): Step[] {
  const steps: Step[] = [];
  const joined = text.replace(/\\\n\s*/g, ""); // continuation lines are one command
  for (const raw of joined.split("\n")) {
    const line = raw.trim();
    const heading = /^# Terminal (\d+) — (gateway|provider) machine( \(keeps running\))?:/.exec(line);
    if (heading) steps.push({ terminal: Number(heading[1]), machine: heading[2] as Step["machine"], keepsRunning: Boolean(heading[3]), lines: [] });
    else if (line !== "" && !line.startsWith("#")) steps.at(-1)!.lines.push(line);
  }
  return steps;
}

const dirs: string[] = [];
const shells: Shell[] = [];
afterAll(async () => {
  for (const shell of shells.reverse()) await shell.stop();
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

/** One terminal: a bash reading commands from a pipe; stdout kept for the test to read. */
class Shell {
  output = "";
  errors = "";
  private readonly proc;
  constructor(cwd: string, env: Record<string, string>) {
    this.proc = Bun.spawn(["bash", "--noprofile", "--norc"], { cwd, env, stdin: "pipe", stdout: "pipe", stderr: "pipe" });
    void this.collect(this.proc.stdout as ReadableStream<Uint8Array>, (t) => (this.output += t));
    void this.collect(this.proc.stderr as ReadableStream<Uint8Array>, (t) => (this.errors += t));
  }
  private async collect(stream: ReadableStream<Uint8Array>, add: (text: string) => void) {
    const decoder = new TextDecoder();
    for await (const bytes of stream) add(decoder.decode(bytes, { stream: true }));
  }
  /** Runs one line as typed (in a brace group, so a trailing comment is harmless) and resolves with its exit code. */
  async run(line: string, timeoutMs = 60_000): Promise<{ code: number; out: string }> {
    const mark = `__done_${randomBytes(4).toString("hex")}__`;
    const from = this.output.length;
    this.proc.stdin.write(`{ ${line}\n} < /dev/null; echo "${mark} $?"\n`);
    const deadline = performance.now() + timeoutMs;
    let match: RegExpExecArray | null;
    while (!(match = new RegExp(`${mark} (\\d+)`).exec(this.output.slice(from)))) {
      if (performance.now() > deadline) throw new Error(`timed out running: ${line}\nstderr: ${this.errors.slice(-2000)}`);
      await Bun.sleep(20);
    }
    return { code: Number(match[1]), out: this.output.slice(from, from + match.index) };
  }
  /** Starts a line that keeps running (the terminal stays blocked by it). */
  start(line: string): void {
    this.proc.stdin.write(`{ ${line}\n} < /dev/null\n`);
  }
  async waitFor(pattern: RegExp, what: string, timeoutMs = 60_000): Promise<RegExpExecArray> {
    const deadline = performance.now() + timeoutMs;
    let match: RegExpExecArray | null;
    while (!(match = pattern.exec(this.output))) {
      if (performance.now() > deadline) throw new Error(`timed out waiting for ${what}\nstdout: ${this.output.slice(-2000)}\nstderr: ${this.errors.slice(-2000)}`);
      await Bun.sleep(20);
    }
    return match;
  }
  async stop() {
    // A signal to bash does not reach the command it runs: end its children (by parent id) first.
    Bun.spawnSync(["pkill", "-TERM", "-P", String(this.proc.pid)]);
    this.proc.stdin.end();
    this.proc.kill("SIGTERM");
    await this.proc.exited;
  }
}

/** A folder standing in for one machine: the checkout (src linked), the GGUF file, its own HOME. */
function machine(name: string, gguf: Uint8Array): { cwd: string; home: string } {
  const dir = tempDir(`gw-readme-${name}-`);
  dirs.push(dir);
  symlinkSync(join(root, "src"), join(dir, "src"));
  writeFileSync(join(dir, "Llama-3.2-1B-Q4_K_M.gguf"), gguf);
  mkdirSync(join(dir, "home"));
  return { cwd: dir, home: join(dir, "home") };
}

test("the block names a terminal and a machine for every command, and uses the real default ports", () => {
  const steps = parseBlock(block);
  expect(steps.map((s) => `${s.terminal} ${s.machine}${s.keepsRunning ? " keeps running" : ""}`)).toEqual([
    "1 gateway keeps running",
    "2 gateway",
    "3 provider keeps running",
    "4 provider keeps running",
    "2 gateway",
  ]);
  expect(block).toContain("catalog init");
  expect(block.indexOf("catalog init")).toBeLessThan(block.indexOf("catalog add"));
  // The provider's upstream is llama-server's own default port on the provider machine.
  expect(block).toContain("--upstream http://127.0.0.1:8080");
  expect(block).toContain("ws://GATEWAY_HOST:8080/v1/provider/connect");
});

const missingTools = ["bash", "curl"].filter((tool) => Bun.which(tool) === null);
if (missingTools.length > 0) console.warn(`SKIPPED: running the README's "Running it for real" block — ${missingTools.join(" and ")} not installed`);

test.skipIf(missingTools.length > 0)("the block runs top to bottom: a paid request is served, billed and audited", async () => {
  const gguf = new Uint8Array([...Buffer.from("GGUF"), ...randomBytes(4096)]);
  const gatewayMachine = machine("gw", gguf);
  const providerMachine = machine("prov", gguf);
  // llama-server on the provider machine: the mock upstream, on a free port (it prints which).
  const bin = join(providerMachine.cwd, "bin");
  mkdirSync(bin);
  writeFileSync(join(bin, "llama-server"), `#!/bin/sh\nexec bun ${join(root, "test/support/mockUpstream.ts")}\n`);
  chmodSync(join(bin, "llama-server"), 0o755);

  const baseEnv = { PATH: process.env.PATH ?? "/usr/bin:/bin", LANG: "C.UTF-8" };
  const terminals = new Map<number, Shell>();
  const shellFor = (step: Step) => {
    let shell = terminals.get(step.terminal);
    if (!shell) {
      const m = step.machine === "gateway" ? gatewayMachine : providerMachine;
      const env =
        step.machine === "gateway"
          ? { ...baseEnv, HOME: m.home, GATEWAY_PORT: "0" } // the gateway takes a free port instead of 8080
          : { ...baseEnv, HOME: m.home, PATH: `${bin}:${baseEnv.PATH}` };
      shell = new Shell(m.cwd, env);
      shells.push(shell);
      terminals.set(step.terminal, shell);
    }
    return shell;
  };

  let gatewayPort = 0;
  let upstreamPort = 0;
  const localize = (step: Step, line: string) =>
    step.machine === "gateway"
      ? line.replaceAll("127.0.0.1:8080", `127.0.0.1:${gatewayPort}`)
      : line.replaceAll("GATEWAY_HOST:8080", `127.0.0.1:${gatewayPort}`).replaceAll("127.0.0.1:8080", `127.0.0.1:${upstreamPort}`);

  const results: { line: string; code: number; out: string }[] = [];
  for (const step of parseBlock(block)) {
    const shell = shellFor(step);
    const last = step.keepsRunning ? step.lines.at(-1) : undefined;
    for (const line of step.lines.slice(0, last === undefined ? undefined : -1)) {
      const result = await shell.run(localize(step, line));
      results.push({ line, ...result });
      expect({ line, code: result.code }).toEqual({ line, code: 0 });
    }
    if (last === undefined) continue;
    shell.start(localize(step, last));
    if (last.includes(" serve")) {
      gatewayPort = Number((await shell.waitFor(/"event":"gateway_listening"[^\n]*"port":(\d+)/, "the gateway"))[1]);
    } else if (last.startsWith("llama-server")) {
      upstreamPort = Number((await shell.waitFor(/"event":"mock_listening"[^\n]*"port":(\d+)/, "llama-server"))[1]);
    } else {
      // What the block tells the reader to wait for, then the gateway lists the model.
      await shell.waitFor(/"event":"upstream_ready"/, "the provider's upstream check");
      const deadline = performance.now() + 30_000;
      for (;;) {
        const status = (await (await fetch(`http://127.0.0.1:${gatewayPort}/v1/status`)).json()) as { models: { id: string; available: boolean }[] };
        if (status.models.some((m) => m.id === "llama3.2-1b" && m.available)) break;
        if (performance.now() > deadline) throw new Error("the provider never advertised llama3.2-1b");
        await Bun.sleep(50);
      }
    }
  }

  const curl = results.find((r) => r.line.startsWith("curl"))!;
  const completion = JSON.parse(curl.out) as { choices: { message: { content: string } }[]; usage: { completion_tokens: number } };
  expect(completion.choices[0]!.message.content.length).toBeGreaterThan(0);
  const accounts = results.find((r) => r.line.includes("accounts list"))!.out;
  expect(accounts).toMatch(/^ACCOUNT_ID\s+TIER\s+BALANCE/);
  expect(accounts).toContain("alice");
  const receipts = results.find((r) => r.line.includes("receipts list"))!.out.trim().split("\n").map((l) => JSON.parse(l) as Record<string, unknown>);
  expect(receipts.length).toBeGreaterThan(0);
}, 240_000);
