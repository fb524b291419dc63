// Build-time check of a compiled macOS arm64 file: Apple Silicon kills a binary whose code signature
// does not match its bytes, and several Bun releases wrote broken ad-hoc signatures into cross-compiled
// files (oven-sh/bun#29120, #39764). We cannot run the file on Linux, but we can recompute what the
// kernel checks: every page hash of the embedded CodeDirectory over the final bytes.
import { createHash } from "node:crypto";

const LC_CODE_SIGNATURE = 0x1d;
const MH_MAGIC_64 = 0xfeedfacf;
const CSMAGIC_EMBEDDED_SIGNATURE = 0xfade0cc0;
const CSMAGIC_CODEDIRECTORY = 0xfade0c02;
const CS_HASHTYPE_SHA256 = 2;

export type SignatureCheck = { ok: true; pages: number } | { ok: false; reason: string };

/** Checks that a thin 64-bit Mach-O carries an embedded SHA-256 CodeDirectory whose page hashes all match. */
export function checkMachoAdhocSignature(file: Uint8Array): SignatureCheck {
  try {
    return check(file);
  } catch (error) {
    if (error instanceof RangeError) return { ok: false, reason: "truncated or malformed Mach-O" };
    throw error;
  }
}

function check(file: Uint8Array): SignatureCheck {
  const view = new DataView(file.buffer, file.byteOffset, file.byteLength);
  if (file.byteLength < 32 || view.getUint32(0, true) !== MH_MAGIC_64) return { ok: false, reason: "not a thin 64-bit Mach-O" };
  const ncmds = view.getUint32(16, true);
  let offset = 32;
  let signature: { start: number; size: number } | null = null;
  for (let i = 0; i < ncmds; i++) {
    const cmd = view.getUint32(offset, true);
    if (cmd === LC_CODE_SIGNATURE) signature = { start: view.getUint32(offset + 8, true), size: view.getUint32(offset + 12, true) };
    offset += view.getUint32(offset + 4, true);
  }
  if (!signature) return { ok: false, reason: "no LC_CODE_SIGNATURE" };
  // Code-signing blobs are big-endian.
  const { start } = signature;
  if (view.getUint32(start) !== CSMAGIC_EMBEDDED_SIGNATURE) return { ok: false, reason: "no embedded signature superblob" };
  const count = view.getUint32(start + 8);
  for (let i = 0; i < count; i++) {
    const cd = start + view.getUint32(start + 12 + 8 * i + 4);
    if (view.getUint32(cd) !== CSMAGIC_CODEDIRECTORY) continue;
    const hashOffset = view.getUint32(cd + 16);
    const nCodeSlots = view.getUint32(cd + 28);
    const codeLimit = view.getUint32(cd + 32);
    const hashSize = view.getUint8(cd + 36);
    const hashType = view.getUint8(cd + 37);
    const pageSize = 2 ** view.getUint8(cd + 39);
    if (hashType !== CS_HASHTYPE_SHA256) return { ok: false, reason: `hash type ${hashType}, expected SHA-256` };
    if (codeLimit !== start) return { ok: false, reason: "code limit does not end at the signature" };
    if (nCodeSlots !== Math.ceil(codeLimit / pageSize)) return { ok: false, reason: "page count does not cover the code" };
    for (let page = 0; page < nCodeSlots; page++) {
      // The last page is hashed truncated to the code limit, not zero-padded.
      const bytes = file.subarray(page * pageSize, Math.min((page + 1) * pageSize, codeLimit));
      const want = file.subarray(cd + hashOffset + page * hashSize, cd + hashOffset + (page + 1) * hashSize);
      if (!createHash("sha256").update(bytes).digest().subarray(0, hashSize).equals(want)) {
        return { ok: false, reason: `page ${page} hash mismatch` };
      }
    }
    return { ok: true, pages: nCodeSlots };
  }
  return { ok: false, reason: "no CodeDirectory" };
}
