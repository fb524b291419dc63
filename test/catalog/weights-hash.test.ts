// Model hashes from weight files (docs/catalog.md), checked against values computed outside the module:
// literal digests worked out by hand with coreutils (`printf '<manifest>' | sha256sum`), and the same
// computation repeated here with the `sha256sum` program, never with the code under test.
import { expect, test } from "bun:test";
import { mkdirSync, symlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { hashGgufFile, hashSnapshotDirectory, hashWeights } from "../../src/catalog/weights.ts";
import { tempDir } from "./support.ts";

const root = tempDir("gw-weights-");

/** sha256 hex by the system's own tool (coreutils `sha256sum`, or `shasum -a 256` on macOS). */
function externalSha256(input: { file: string } | { text: string }): string {
  const tool = Bun.which("sha256sum") ? ["sha256sum"] : ["shasum", "-a", "256"];
  const r = "file" in input ? Bun.spawnSync([...tool, input.file]) : Bun.spawnSync([...tool], { stdin: Buffer.from(input.text, "utf8") });
  if (r.exitCode !== 0) throw new Error(`${tool.join(" ")} failed`);
  return r.stdout.toString().slice(0, 64);
}

function write(path: string, content: string | Uint8Array): void {
  mkdirSync(join(path, ".."), { recursive: true });
  writeFileSync(path, content);
}

/**
 * A snapshot with the cases the rules decide: nested dirs, "a.txt" vs "a/b" (bytewise: '.' < '/'),
 * upper before lower case, non-ASCII last, an empty file, hidden files and dirs (excluded), and a
 * symlink to a file outside the directory (included under the link's name, as in a HF cache).
 */
function buildSnapshot(name: string): string {
  const dir = join(root, name);
  write(join(dir, "config.json"), '{"arch":"test"}\n');
  write(join(dir, "tokenizer.json"), "tok\n");
  write(join(dir, "weights", "part-00001.safetensors"), "AAAA");
  write(join(dir, "a.txt"), "a\n");
  write(join(dir, "a", "b"), "b\n");
  write(join(dir, "B.txt"), "B\n");
  write(join(dir, "é.bin"), "e\n");
  write(join(dir, "empty.txt"), "");
  write(join(dir, ".gitattributes"), "x");
  write(join(dir, ".cache", "huggingface", "x.lock"), "lock");
  write(join(root, `${name}-blobs`, "blob"), "blob\n");
  symlinkSync(join(root, `${name}-blobs`, "blob"), join(dir, "link.bin"));
  return dir;
}

// Worked out with coreutils on the same files (see the test below for the manifest):
const SNAPSHOT_HASH = "5bceb088853facdb4f3d8964612425b6aaf321c7aab43c4db2acfecf026a3a83";
const EXPECTED_ORDER = ["B.txt", "a.txt", "a/b", "config.json", "empty.txt", "link.bin", "tokenizer.json", "weights/part-00001.safetensors", "é.bin"];

test("a directory hashes to sha256 of the sorted '<relpath>\\n<size>\\n<sha256>\\n' manifest", async () => {
  const dir = buildSnapshot("snapshot");
  const result = await hashSnapshotDirectory(dir);
  expect(result).toEqual({ ok: true, model_hash: SNAPSHOT_HASH, hash_scope: "snapshot-manifest-v1", files: 9, bytes: 37 });

  // The same value once more from the system tool, file by file, with the order written out above.
  const contents: Record<string, string> = {
    "B.txt": "B\n", "a.txt": "a\n", "a/b": "b\n", "config.json": '{"arch":"test"}\n', "empty.txt": "",
    "link.bin": "blob\n", "tokenizer.json": "tok\n", "weights/part-00001.safetensors": "AAAA", "é.bin": "e\n",
  };
  const manifest = EXPECTED_ORDER.map((rel) => `${rel}\n${Buffer.byteLength(contents[rel]!)}\n${externalSha256({ file: join(dir, rel) })}\n`).join("");
  expect(externalSha256({ text: manifest })).toBe(SNAPSHOT_HASH);
  expect(await hashWeights(dir)).toMatchObject({ ok: true, model_hash: SNAPSHOT_HASH });
});

test("hidden entries do not change the hash; any included byte does", async () => {
  const dir = buildSnapshot("snapshot-2");
  expect(await hashSnapshotDirectory(dir)).toMatchObject({ ok: true, model_hash: SNAPSHOT_HASH });
  write(join(dir, ".cache", "huggingface", "other.metadata"), "machine-specific");
  write(join(dir, ".DS_Store"), "finder");
  expect(await hashSnapshotDirectory(dir)).toMatchObject({ ok: true, model_hash: SNAPSHOT_HASH });
  write(join(dir, "a", "b"), "c\n");
  const changed = await hashSnapshotDirectory(dir);
  expect(changed.ok && changed.model_hash).not.toBe(SNAPSHOT_HASH);
});

const GGUF_BYTES = new Uint8Array([...Buffer.from("GGUF"), 3, 0, 0, 0, ...Buffer.from("fixture-weights\n")]);
// `printf 'GGUF\003\000\000\000fixture-weights\n' | sha256sum`
const GGUF_HASH = "6032d559d39bab440585072869d70e84a4d93c4189dcdcc07e179a42ab92462c";

test("a single GGUF file hashes to its plain sha256 (gguf-file-v1)", async () => {
  const file = join(root, "tiny.gguf");
  write(file, GGUF_BYTES);
  expect(externalSha256({ file })).toBe(GGUF_HASH);
  expect(await hashWeights(file)).toEqual({ ok: true, model_hash: GGUF_HASH, hash_scope: "gguf-file-v1", files: 1, bytes: 24 });
  expect(await hashGgufFile(file)).toMatchObject({ ok: true, model_hash: GGUF_HASH });
});

test("a file larger than the read chunk is streamed and hashed exactly", async () => {
  // 9 MiB + 7 bytes: spans three 4 MiB reads with a ragged end.
  const size = 9 * 1024 * 1024 + 7;
  const bytes = new Uint8Array(size);
  for (let i = 0; i < size; i++) bytes[i] = (i * 7919) & 0xff;
  bytes.set(Buffer.from("GGUF"), 0);
  const file = join(root, "big.gguf");
  write(file, bytes);
  expect(await hashWeights(file)).toMatchObject({ ok: true, model_hash: externalSha256({ file }), bytes: size });
});

test.each([
  ["a single file that is not GGUF", () => (write(join(root, "x.safetensors"), "not gguf"), join(root, "x.safetensors")), "not_gguf"],
  ["a missing path", () => join(root, "nope"), "not_found"],
  ["a directory with only hidden files", () => (write(join(root, "hidden-only", ".x"), "x"), join(root, "hidden-only")), "empty_directory"],
  [
    "a symlink to a directory",
    () => {
      write(join(root, "with-dirlink", "f"), "f");
      mkdirSync(join(root, "elsewhere"), { recursive: true });
      symlinkSync(join(root, "elsewhere"), join(root, "with-dirlink", "d"));
      return join(root, "with-dirlink");
    },
    "symlinked_directory",
  ],
  [
    "a dangling symlink",
    () => {
      write(join(root, "with-dangling", "f"), "f");
      symlinkSync(join(root, "missing-target"), join(root, "with-dangling", "gone"));
      return join(root, "with-dangling");
    },
    "dangling_symlink",
  ],
  ["a file name holding a newline", () => (write(join(root, "nl", "bad\nname"), "x"), join(root, "nl")), "invalid_name"],
])("refused with a reason, never hashed silently: %s", async (_name, make, code) => {
  expect(await hashWeights(make())).toMatchObject({ ok: false, code });
});
