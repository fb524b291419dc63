// The README opens with exactly two commands; the first starts a demo gateway that answers at once.
import { expect, test } from "bun:test";
import { readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import OpenAI from "openai";
import { tempDir } from "../support/harness.ts";

const root = join(import.meta.dir, "../..");
const readme = readFileSync(join(root, "README.md"), "utf8");
const blocks = [...readme.matchAll(/```sh\n([\s\S]*?)```/g)].map((m) => m[1]!.trim());

test("the README opens with the demo command and the test command", () => {
  expect(blocks[0]).toBe("npm install -g bun && bun install && bun src/main.ts serve --demo");
  expect(blocks[1]).toBe("npm install -g bun && bun install && bun test --timeout 30000");
  expect(readFileSync(join(root, ".ci/run"), "utf8")).toContain("\nbun test --timeout 30000 2>&1");
});

test("the demo command serves a chat completion to the openai SDK at once", async () => {
  const serveCommand = blocks[0]!.split("&&").at(-1)!.trim().split(/\s+/);
  const dataDir = tempDir("gw-readme-");
  const proc = Bun.spawn(serveCommand, {
    cwd: root,
    env: { ...process.env, GATEWAY_PORT: "0", GATEWAY_DATA_DIR: dataDir },
    stdout: "ignore",
    stderr: "pipe",
  });
  try {
    let banner = "";
    const decoder = new TextDecoder();
    for await (const bytes of proc.stderr as ReadableStream<Uint8Array>) {
      banner += decoder.decode(bytes, { stream: true });
      if (banner.includes("Dev API key:") && banner.includes("-d '")) break;
    }
    const base = /ready on (http:\/\/\S+)/.exec(banner)![1]!;
    const apiKey = /Dev API key: (\S+)/.exec(banner)![1]!;
    expect(apiKey).toMatch(/^gw_[A-Za-z0-9_-]{43}$/);
    const client = new OpenAI({ apiKey, baseURL: `${base}/v1`, maxRetries: 3 });
    // Demo providers connect within milliseconds of the banner; give them a moment if needed.
    let content = "";
    for (let i = 0; i < 50 && !content; i++) {
      const res = await client.chat.completions.create({ model: "demo-chat", messages: [{ role: "user", content: "Hello!" }], max_tokens: 5 }).catch(() => null);
      content = res?.choices[0]?.message.content ?? "";
      if (!content) await Bun.sleep(50);
    }
    expect(content.length).toBeGreaterThan(0);
  } finally {
    proc.kill("SIGTERM");
    expect(await proc.exited).toBe(0);
    rmSync(dataDir, { recursive: true, force: true });
  }
});
