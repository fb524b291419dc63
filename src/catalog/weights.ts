// Canonical model hashes from weight files (docs/catalog.md), shared by `gateway catalog add --weights` and
// the provider runtime, so both sides compute the same bytes by the same rules.
//
// gguf-file-v1: a single GGUF file (first four bytes "GGUF") → sha256 hex of its bytes.
// snapshot-manifest-v1: a directory → sha256 hex of the manifest, the concatenation of
//   "<relpath>\n<size>\n<sha256hex>\n" over every included regular file, where
//   - relpath is relative to the directory, "/"-separated, UTF-8, with no leading "./";
//   - size is the file's byte count in decimal; sha256hex is lowercase;
//   - files are sorted bytewise by the UTF-8 bytes of the whole relpath (so "a.txt" < "a/b");
//   - an entry whose name starts with "." is skipped at every depth, files and directories alike:
//     download tools leave machine-specific state there (.cache/huggingface, .git, .DS_Store), which
//     would make the same weights hash differently on two machines;
//   - a symlink to a regular file counts as that file at the link's path (Hugging Face cache
//     snapshots are directories of such links into blobs/); a symlink to a directory, or a dangling
//     one, is an error rather than silently followed or skipped;
//   - sockets, FIFOs and devices are not regular files and are skipped;
//   - a name containing "\n" (it would make the manifest ambiguous) or bytes that are not UTF-8 is an
//     error, as is a directory with no included file.
// Files are streamed in 4 MiB chunks: weights are many GB and are never read whole into memory.
import { createHash } from "node:crypto";
import { createReadStream } from "node:fs";
import { lstat, open, readdir, stat } from "node:fs/promises";
import { join } from "node:path";
import { compareUtf8 } from "./feed.ts";
import type { HashScope } from "./schema.ts";

export type WeightsErrorCode =
  | "not_found"
  | "not_gguf"
  | "unsupported_file_type"
  | "empty_directory"
  | "symlinked_directory"
  | "dangling_symlink"
  | "invalid_name"
  | "changed_while_hashing"
  | "read_error";

export type WeightsHashResult =
  | { ok: true; model_hash: string; hash_scope: HashScope; files: number; bytes: number }
  | { ok: false; code: WeightsErrorCode; message: string };

const CHUNK_BYTES = 4 * 1024 * 1024;
const GGUF_MAGIC = "GGUF";

type Fail = Extract<WeightsHashResult, { ok: false }>;
const fail = (code: WeightsErrorCode, message: string): Fail => ({ ok: false, code, message });

/** One manifest line of snapshot-manifest-v1. */
export function manifestLine(relpath: string, size: number, sha256hex: string): string {
  return `${relpath}\n${size}\n${sha256hex}\n`;
}

/**
 * Streams a file through SHA-256. `expectedSize` is the size seen when the file was listed: a
 * different byte count means the file changed while it was being hashed.
 */
async function sha256File(path: string, expectedSize: number): Promise<{ ok: true; hex: string } | Fail> {
  const hash = createHash("sha256");
  let read = 0;
  try {
    for await (const chunk of createReadStream(path, { highWaterMark: CHUNK_BYTES })) {
      hash.update(chunk as Buffer);
      read += (chunk as Buffer).length;
    }
  } catch (error) {
    return fail("read_error", `cannot read ${path}: ${(error as NodeJS.ErrnoException).code ?? "error"}`);
  }
  if (read !== expectedSize) return fail("changed_while_hashing", `${path} changed size while it was being hashed`);
  return { ok: true, hex: hash.digest("hex") };
}

async function startsWithGgufMagic(path: string): Promise<boolean> {
  const handle = await open(path, "r");
  try {
    const buffer = Buffer.alloc(4);
    const { bytesRead } = await handle.read(buffer, 0, 4, 0);
    return bytesRead === 4 && buffer.toString("latin1") === GGUF_MAGIC;
  } finally {
    await handle.close();
  }
}

/** gguf-file-v1: sha256 of one GGUF file (refused when the file does not start with the magic). */
export async function hashGgufFile(path: string): Promise<WeightsHashResult> {
  let size: number;
  try {
    const info = await stat(path);
    if (!info.isFile()) return fail("unsupported_file_type", `${path} is not a regular file`);
    size = info.size;
    if (!(await startsWithGgufMagic(path))) {
      return fail("not_gguf", `${path} is not a GGUF file; put other formats in a directory (snapshot-manifest-v1)`);
    }
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    return code === "ENOENT" ? fail("not_found", `${path} does not exist`) : fail("read_error", `cannot read ${path}: ${code ?? "error"}`);
  }
  const digest = await sha256File(path, size);
  if (!digest.ok) return digest;
  return { ok: true, model_hash: digest.hex, hash_scope: "gguf-file-v1", files: 1, bytes: size };
}

interface ListedFile {
  relpath: string;
  absolute: string;
  size: number;
}

/** Every included regular file under `root` (see the rules above), unsorted. */
async function listFiles(root: string): Promise<{ ok: true; files: ListedFile[] } | Fail> {
  const files: ListedFile[] = [];
  const pending: string[] = [""];
  while (pending.length > 0) {
    const relDir = pending.pop()!;
    const absDir = relDir === "" ? root : join(root, relDir);
    let names: string[];
    try {
      names = await readdir(absDir);
    } catch (error) {
      return fail("read_error", `cannot list ${absDir}: ${(error as NodeJS.ErrnoException).code ?? "error"}`);
    }
    for (const name of names) {
      if (name.startsWith(".")) continue;
      const relpath = relDir === "" ? name : `${relDir}/${name}`;
      // readdir decodes non-UTF-8 names with U+FFFD, so its presence means the name was not UTF-8.
      if (name.includes("\n") || name.includes("\uFFFD")) return fail("invalid_name", `file name ${JSON.stringify(relpath)} is not allowed`);
      const absolute = join(absDir, name);
      let info;
      try {
        info = await lstat(absolute);
        if (info.isSymbolicLink()) {
          try {
            info = await stat(absolute);
          } catch {
            return fail("dangling_symlink", `${relpath} is a symlink to nothing`);
          }
          if (info.isDirectory()) return fail("symlinked_directory", `${relpath} is a symlink to a directory`);
        }
      } catch (error) {
        return fail("read_error", `cannot stat ${absolute}: ${(error as NodeJS.ErrnoException).code ?? "error"}`);
      }
      if (info.isDirectory()) pending.push(relpath);
      else if (info.isFile()) files.push({ relpath, absolute, size: info.size });
    }
  }
  return { ok: true, files };
}

/** snapshot-manifest-v1: sha256 of the sorted manifest of every included file under `dir`. */
export async function hashSnapshotDirectory(dir: string): Promise<WeightsHashResult> {
  const listed = await listFiles(dir);
  if (!listed.ok) return listed;
  if (listed.files.length === 0) return fail("empty_directory", `${dir} holds no regular file to hash`);
  const files = listed.files.sort((a, b) => compareUtf8(a.relpath, b.relpath));
  const manifest = createHash("sha256");
  let bytes = 0;
  for (const file of files) {
    const digest = await sha256File(file.absolute, file.size);
    if (!digest.ok) return digest;
    manifest.update(manifestLine(file.relpath, file.size, digest.hex), "utf8");
    bytes += file.size;
  }
  return { ok: true, model_hash: manifest.digest("hex"), hash_scope: "snapshot-manifest-v1", files: files.length, bytes };
}

/** Hashes a weights path: a directory by snapshot-manifest-v1, a single file by gguf-file-v1. */
export async function hashWeights(path: string): Promise<WeightsHashResult> {
  let info;
  try {
    info = await stat(path);
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    return code === "ENOENT" ? fail("not_found", `${path} does not exist`) : fail("read_error", `cannot read ${path}: ${code ?? "error"}`);
  }
  if (info.isDirectory()) return hashSnapshotDirectory(path);
  if (info.isFile()) return hashGgufFile(path);
  return fail("unsupported_file_type", `${path} is neither a directory nor a regular file`);
}
