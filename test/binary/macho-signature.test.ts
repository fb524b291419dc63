// The build's check of a macOS file's ad-hoc code signature (src/build-macho.ts), on a synthetic
// Mach-O laid out like Bun's output: code, then an embedded signature whose CodeDirectory hashes it.
import { expect, test } from "bun:test";
import { createHash } from "node:crypto";
import { checkMachoAdhocSignature } from "../../src/build-macho.ts";

const PAGE = 4096;

/** A thin 64-bit Mach-O with one LC_CODE_SIGNATURE and `codeBytes` of code (a partial last page). */
function machO(codeBytes: number): Uint8Array {
  const nPages = Math.ceil(codeBytes / PAGE);
  const cdHeader = 44;
  const cdLength = cdHeader + nPages * 32;
  const sigLength = 20 + cdLength;
  const file = new Uint8Array(codeBytes + sigLength);
  const le = new DataView(file.buffer);
  le.setUint32(0, 0xfeedfacf, true); // MH_MAGIC_64
  le.setUint32(16, 1, true); // ncmds
  le.setUint32(32, 0x1d, true); // LC_CODE_SIGNATURE
  le.setUint32(36, 16, true);
  le.setUint32(40, codeBytes, true); // dataoff
  le.setUint32(44, sigLength, true);
  for (let i = 48; i < codeBytes; i++) file[i] = (i * 31) & 0xff;
  const be = new DataView(file.buffer, codeBytes);
  be.setUint32(0, 0xfade0cc0); // embedded signature superblob
  be.setUint32(4, sigLength);
  be.setUint32(8, 1);
  be.setUint32(12, 0); // slot type: CodeDirectory
  be.setUint32(16, 20); // its offset
  const cd = new DataView(file.buffer, codeBytes + 20);
  cd.setUint32(0, 0xfade0c02);
  cd.setUint32(4, cdLength);
  cd.setUint32(16, cdHeader); // hashOffset
  cd.setUint32(28, nPages);
  cd.setUint32(32, codeBytes); // codeLimit
  cd.setUint8(36, 32); // hashSize
  cd.setUint8(37, 2); // SHA-256
  cd.setUint8(39, 12); // log2(page size)
  for (let p = 0; p < nPages; p++) {
    const hash = createHash("sha256").update(file.subarray(p * PAGE, Math.min((p + 1) * PAGE, codeBytes))).digest();
    file.set(hash, codeBytes + 20 + cdHeader + p * 32);
  }
  return file;
}

test("a signature whose page hashes match the code passes, last partial page included", () => {
  expect(checkMachoAdhocSignature(machO(3 * PAGE + 123))).toEqual({ ok: true, pages: 4 });
});

test("one changed byte of code fails the check on its page", () => {
  const file = machO(3 * PAGE + 123);
  file[2 * PAGE + 7]! ^= 1;
  expect(checkMachoAdhocSignature(file)).toEqual({ ok: false, reason: "page 2 hash mismatch" });
});

test("a last page hashed zero-padded (the bug of oven-sh/bun#39764) fails", () => {
  const file = machO(2 * PAGE + 10);
  const padded = new Uint8Array(PAGE);
  padded.set(file.subarray(2 * PAGE, 2 * PAGE + 10));
  file.set(createHash("sha256").update(padded).digest(), 2 * PAGE + 10 + 20 + 44 + 2 * 32);
  expect(checkMachoAdhocSignature(file)).toEqual({ ok: false, reason: "page 2 hash mismatch" });
});

test("files that are not signed Mach-O files are reported, not thrown on", () => {
  expect(checkMachoAdhocSignature(new Uint8Array([0x7f, 0x45, 0x4c, 0x46]))).toMatchObject({ ok: false });
  const unsigned = machO(PAGE);
  new DataView(unsigned.buffer).setUint32(16, 0, true); // no load commands
  expect(checkMachoAdhocSignature(unsigned)).toEqual({ ok: false, reason: "no LC_CODE_SIGNATURE" });
});

test("a truncated file is reported as malformed", () => {
  expect(checkMachoAdhocSignature(machO(2 * PAGE).subarray(0, 2 * PAGE + 30))).toEqual({ ok: false, reason: "truncated or malformed Mach-O" });
});
