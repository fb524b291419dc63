// The per-token path's decoder: reads a `chunk` frame of the common shape straight from its
// msgpack bytes into a ChunkFrame, without msgpackr's general reader or the compiled schema check.
//
// Invariant: whatever this accepts, `unpackr.unpack` + the ChunkFrame checker accept too and yield an
// equal object (same keys in the same order, same values); anything else — another frame type,
// `tool_calls`, a duplicate or unknown key, a non-fixstr key, a float or signed or 64-bit integer,
// an ext or 0xc1 byte, invalid UTF-8, a leading BOM, truncation, trailing bytes, any schema failure —
// returns undefined and the general path decides (so close codes stay the general path's).
// test/wire/chunk-frame-differential.test.ts holds the two paths to that.
import type { ChunkFrame } from "./frames.ts";

// Key ids, also bits of the `seen` mask.
const TYPE = 1;
const REQUEST_ID = 2;
const ATTEMPT_N = 4;
const SEQ = 8;
const CONTENT = 16;
const TOKENS = 32;
const REQUIRED = TYPE | REQUEST_ID | ATTEMPT_N | SEQ | TOKENS;

const bytesOf = (s: string) => Uint8Array.from(s, (c) => c.charCodeAt(0));
const KEY_TYPE = bytesOf("type");
const KEY_REQUEST_ID = bytesOf("request_id");
const KEY_ATTEMPT_N = bytesOf("attempt_n");
const KEY_SEQ = bytesOf("seq");
const KEY_CONTENT = bytesOf("content");
const KEY_TOKENS = bytesOf("tokens");
const VALUE_CHUNK = bytesOf("chunk");

// Strings that are not Buffers (an ArrayBuffer frame) decode here; a BOM is refused before, so the
// BOM option never matters.
const utf8 = new TextDecoder();

/** Buffer's undeclared native string slices (what msgpackr uses too). */
interface NativeSlices {
  latin1Slice?(start: number, end: number): string;
  utf8Slice?(start: number, end: number): string;
}

/**
 * The next byte to read of the frame being decoded. One for every call, not an object per frame (this
 * runs per token): a decode runs synchronously from start to end, and decodeChunkFrame sets it first.
 */
let at = 0;

const matches = (b: Uint8Array, at: number, key: Uint8Array): boolean => {
  for (let i = 0; i < key.length; i++) if (b[at + i] !== key[i]) return false;
  return true;
};

/** The key id of a fixstr key at `at` (consumed), or 0 for anything else. */
function readKey(b: Uint8Array): number {
  const token = b[at];
  if (token === undefined || token < 0xa0 || token > 0xbf) return 0;
  const length = token - 0xa0;
  const from = at + 1;
  if (from + length > b.length) return 0;
  at = from + length;
  switch (length) {
    case 3:
      return matches(b, from, KEY_SEQ) ? SEQ : 0;
    case 4:
      return matches(b, from, KEY_TYPE) ? TYPE : 0;
    case 6:
      return matches(b, from, KEY_TOKENS) ? TOKENS : 0;
    case 7:
      return matches(b, from, KEY_CONTENT) ? CONTENT : 0;
    case 9:
      return matches(b, from, KEY_ATTEMPT_N) ? ATTEMPT_N : 0;
    case 10:
      return matches(b, from, KEY_REQUEST_ID) ? REQUEST_ID : 0;
    default:
      return 0;
  }
}

/**
 * A non-negative integer in one of msgpack's unsigned forms (positive fixint, uint 8/16/32), or -1.
 * Other forms fall back: msgpackr turns floats into numbers that may pass the schema, uint 64 into a
 * bigint, and signed forms may hold non-negative values; the general path judges those.
 */
function readUint(b: Uint8Array): number {
  const p = at;
  const token = b[p];
  if (token === undefined) return -1;
  if (token < 0x80) {
    at = p + 1;
    return token;
  }
  switch (token) {
    case 0xcc:
      if (p + 2 > b.length) return -1;
      at = p + 2;
      return b[p + 1]!;
    case 0xcd:
      if (p + 3 > b.length) return -1;
      at = p + 3;
      return (b[p + 1]! << 8) | b[p + 2]!;
    case 0xce:
      if (p + 5 > b.length) return -1;
      at = p + 5;
      return b[p + 1]! * 0x1000000 + ((b[p + 2]! << 16) | (b[p + 3]! << 8) | b[p + 4]!);
    default:
      return -1;
  }
}

/**
 * True when b[from, to) is well-formed UTF-8 (Unicode Table 3-7: no overlongs, surrogates or code
 * points past U+10FFFF). Only well-formed text decodes the same in every decoder msgpackr may use
 * (its JS reader, TextDecoder, the native extractor); anything else falls back.
 */
function wellFormedUtf8(b: Uint8Array, from: number, to: number): boolean {
  let i = from;
  while (i < to) {
    const b0 = b[i]!;
    if (b0 < 0x80) {
      i++;
      continue;
    }
    if (b0 < 0xc2) return false;
    if (b0 < 0xe0) {
      if (i + 1 >= to || (b[i + 1]! & 0xc0) !== 0x80) return false;
      i += 2;
      continue;
    }
    if (b0 < 0xf0) {
      if (i + 2 >= to) return false;
      const b1 = b[i + 1]!;
      if ((b1 & 0xc0) !== 0x80 || (b0 === 0xe0 && b1 < 0xa0) || (b0 === 0xed && b1 > 0x9f)) return false;
      if ((b[i + 2]! & 0xc0) !== 0x80) return false;
      i += 3;
      continue;
    }
    if (b0 > 0xf4 || i + 3 >= to) return false;
    const b1 = b[i + 1]!;
    if ((b1 & 0xc0) !== 0x80 || (b0 === 0xf0 && b1 < 0x90) || (b0 === 0xf4 && b1 > 0x8f)) return false;
    if ((b[i + 2]! & 0xc0) !== 0x80 || (b[i + 3]! & 0xc0) !== 0x80) return false;
    i += 4;
  }
  return true;
}

/** A msgpack str (fix/8/16/32) at `at`, or undefined when absent, truncated or not plain UTF-8. */
function readString(b: Uint8Array): string | undefined {
  let p = at;
  const token = b[p++];
  let length: number;
  if (token === undefined) return undefined;
  if (token >= 0xa0 && token <= 0xbf) length = token - 0xa0;
  else if (token === 0xd9) {
    if (p + 1 > b.length) return undefined;
    length = b[p++]!;
  } else if (token === 0xda) {
    if (p + 2 > b.length) return undefined;
    length = (b[p]! << 8) | b[p + 1]!;
    p += 2;
  } else if (token === 0xdb) {
    if (p + 4 > b.length) return undefined;
    length = b[p]! * 0x1000000 + ((b[p + 1]! << 16) | (b[p + 2]! << 8) | b[p + 3]!);
    p += 4;
  } else return undefined;
  const end = p + length;
  if (end > b.length) return undefined;
  let ascii = true;
  for (let i = p; i < end; i++) {
    if (b[i]! >= 0x80) {
      ascii = false;
      break;
    }
  }
  if (!ascii && (!wellFormedUtf8(b, p, end) || (b[p] === 0xef && b[p + 1] === 0xbb && b[p + 2] === 0xbf))) return undefined;
  at = end;
  // Bun's WebSocket hands frames over as Buffers, whose native slices are the fastest string makers.
  const buffer = b as Uint8Array & NativeSlices;
  if (buffer.utf8Slice !== undefined) return ascii ? buffer.latin1Slice!(p, end) : buffer.utf8Slice(p, end);
  return utf8.decode(b.subarray(p, end));
}

/**
 * Decodes `bytes` when they are a plain `chunk` frame that passes the ChunkFrame schema; undefined
 * means "not handled here" (not "invalid"): the caller must then use the general decoder.
 */
export function decodeChunkFrame(bytes: Uint8Array): ChunkFrame | undefined {
  // A map of 5 (no content) or 6 (with content) entries, the required keys being 5: a fixmap, or the
  // map 16 that msgpackr's default packer writes.
  let entries: number;
  let start: number;
  const head = bytes[0];
  if (head === 0x85 || head === 0x86) {
    entries = head - 0x80;
    start = 1;
  } else if (head === 0xde && bytes[1] === 0 && (bytes[2] === 5 || bytes[2] === 6)) {
    entries = bytes[2];
    start = 3;
  } else return undefined;
  at = start;
  // Filled in the order the keys come, as msgpackr fills its object.
  const frame: Record<string, unknown> = {};
  let seen = 0;
  for (let n = entries; n > 0; n--) {
    const key = readKey(bytes);
    if (key === 0 || (seen & key) !== 0) return undefined;
    seen |= key;
    switch (key) {
      case TYPE: {
        if (bytes[at] !== 0xa5 || !matches(bytes, at + 1, VALUE_CHUNK)) return undefined;
        at += 6;
        frame.type = "chunk";
        break;
      }
      case REQUEST_ID: {
        const id = readString(bytes);
        // RequestId: 1..128 UTF-16 code units, as TypeBox counts `.length`.
        if (id === undefined || id.length < 1 || id.length > 128) return undefined;
        frame.request_id = id;
        break;
      }
      case CONTENT: {
        const content = readString(bytes);
        if (content === undefined) return undefined;
        frame.content = content;
        break;
      }
      case ATTEMPT_N: {
        const n = readUint(bytes);
        if (n < 0 || n > 255) return undefined;
        frame.attempt_n = n;
        break;
      }
      case SEQ: {
        const n = readUint(bytes);
        if (n < 0) return undefined;
        frame.seq = n;
        break;
      }
      default: {
        const n = readUint(bytes);
        if (n < 0) return undefined;
        frame.tokens = n;
      }
    }
  }
  // Five entries without duplicates hold every required key only when `content` is not among them.
  if ((seen & REQUIRED) !== REQUIRED || at !== bytes.length) return undefined;
  return frame as unknown as ChunkFrame;
}
