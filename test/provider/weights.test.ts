// `--model SERVE_ID=PATH` hashes weights per docs/catalog.md before the runtime says hello: a directory by
// snapshot-manifest-v1, a single GGUF file by gguf-file-v1. The expected hashes are computed here with
// node:crypto directly, from the spec's text, not with src/catalog.
import { afterAll, describe, expect, test } from "bun:test";
import { createHash } from "node:crypto";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { runProviderCommand, type CommandIo } from "../../src/provider/cli.ts";
import { startFakeGateway } from "./fake-gateway.ts";

const dir = await mkdtemp(join(tmpdir(), "provider-weights-"));
afterAll(() => rm(dir, { recursive: true, force: true }));

const sha256 = (data: string | Uint8Array) => createHash("sha256").update(data).digest("hex");

function capture(until?: Promise<unknown>) {
  const out: string[] = [];
  const err: string[] = [];
  const io: CommandIo = { stdout: (l) => out.push(l), stderr: (l) => err.push(l), until };
  return { io, out, err };
}

describe("--model SERVE_ID=PATH", () => {
  test("a directory and a GGUF file are hashed; a hex value is taken as given; hello carries the hashes", async () => {
    // A snapshot directory: nested files, a dotfile and a dot-directory (skipped), non-ASCII name.
    const snapshot = join(dir, "snapshot");
    await mkdir(join(snapshot, "weights"), { recursive: true });
    await mkdir(join(snapshot, ".cache", "huggingface"), { recursive: true });
    await writeFile(join(snapshot, "config.json"), "{}");
    await writeFile(join(snapshot, "weights", "model.safetensors"), "AAAA");
    await writeFile(join(snapshot, "B.txt"), "upper");
    await writeFile(join(snapshot, "tokenizér.json"), "é");
    await writeFile(join(snapshot, ".DS_Store"), "junk");
    await writeFile(join(snapshot, ".cache", "huggingface", "lock"), "junk");
    const files: [string, string][] = [
      ["B.txt", "upper"],
      ["config.json", "{}"],
      ["tokenizér.json", "é"],
      ["weights/model.safetensors", "AAAA"],
    ]; // bytewise order of the UTF-8 relpaths: "B" < "c" < "t" < "w"
    const manifest = files.map(([path, content]) => `${path}\n${Buffer.byteLength(content)}\n${sha256(content)}\n`).join("");
    const expectedDir = sha256(manifest);

    const gguf = join(dir, "tiny.gguf");
    const ggufBytes = new Uint8Array([0x47, 0x47, 0x55, 0x46, 3, 0, 0, 0, 1, 2, 3, 4, 5]);
    await writeFile(gguf, ggufBytes);
    const expectedGguf = sha256(ggufBytes);
    const given = "0F".repeat(32);

    const gateway = startFakeGateway({ heartbeatIntervalMs: 60_000 });
    let finish!: () => void;
    const run = capture(new Promise<void>((resolve) => (finish = resolve)));
    const exit = runProviderCommand(
      ["--gateway", gateway.url, "--id", "prov-weights", "--key-file", join(dir, "key", "p.pem"), "--engine", "synthetic",
        "--model", `snap=${snapshot}`, "--model", `llama3.2:1b=${gguf}`, "--model", `given=${given}`],
      run.io,
    );
    try {
      const session = await gateway.session(0, 5000);
      await session.welcomed;
      expect(session.hello!.models.map((m) => [m.model_id, m.model_hash])).toEqual([
        ["snap", expectedDir],
        ["llama3.2:1b", expectedGguf],
        ["given", given.toLowerCase()],
      ]);
    } finally {
      finish();
      await exit;
      await gateway.stop();
    }
    const hashed = run.out.map((l) => JSON.parse(l)).filter((e) => e.event === "model_hashed");
    expect(hashed).toMatchObject([
      { model_id: "snap", hash_scope: "snapshot-manifest-v1", model_hash: expectedDir, files: 4 },
      { model_id: "llama3.2:1b", hash_scope: "gguf-file-v1", model_hash: expectedGguf, files: 1, bytes: ggufBytes.byteLength },
    ]);
  });

  test.each([
    ["a missing path", "nope/model.gguf", /does not exist \(not_found\)/],
    ["a single file that is not GGUF", "plain.bin", /\(not_gguf\)/],
    ["an empty directory", "empty", /\(empty_directory\)/],
  ])("%s → exit 1 with the reason, before connecting", async (_, relative, message) => {
    await writeFile(join(dir, "plain.bin"), "not a gguf");
    await mkdir(join(dir, "empty"), { recursive: true });
    const { io, err, out } = capture();
    const argv = ["--gateway", "ws://127.0.0.1:1/v1/provider/connect", "--id", "p1", "--key-file", join(dir, "key", "p.pem"),
      "--engine", "synthetic", "--model", `m=${join(dir, relative)}`];
    expect(await runProviderCommand(argv, io)).toBe(1);
    expect(err.join("\n")).toMatch(message);
    expect(out.some((l) => JSON.parse(l).event === "connecting")).toBe(false);
  });
});
