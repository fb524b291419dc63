// A hand-written msgpack encoder for the `chunk` frame, the one frame sent per streamed token. It writes
// exactly the bytes encodeFrame (msgpackr: useRecords false, variableMapSize) writes for a chunk frame
// built as the provider builds it — keys in the order type, request_id, attempt_n, seq, tokens,
// content — without msgpackr's generic per-value dispatch. Byte identity is a test
// (test/wire/chunk-encode.test.ts). A frame with tool_calls goes through encodeFrame: it is rare and
// its nested maps are not worth a second encoder.
import { encodeFrame } from "./codec.ts";
import type { ChunkFrame } from "./frames.ts";

const SLAB_BYTES = 8192;
// Bytes of a chunk frame other than request_id's and content's text: the map header, keys, the
// "chunk" value, three numbers of at most 9 bytes and two string headers of at most 5.
const FIXED_MAX_BYTES = 80;

// Frames are views into a slab that is never written twice (as msgpackr does): the socket may still
// hold an earlier frame's bytes when the next one is encoded.
let slab = Buffer.allocUnsafeSlow(SLAB_BYTES);
let view = new DataView(slab.buffer, slab.byteOffset, slab.byteLength);
let position = 0;

// fixstr "type", fixstr "chunk"; the map header before it is 0x85 (no content) or 0x86.
const TYPE_CHUNK = Buffer.from([0xa4, 0x74, 0x79, 0x70, 0x65, 0xa5, 0x63, 0x68, 0x75, 0x6e, 0x6b]);
const key = (name: string) => Buffer.from([0xa0 | name.length, ...Buffer.from(name, "latin1")]);
const KEY_REQUEST_ID = key("request_id");
const KEY_ATTEMPT_N = key("attempt_n");
const KEY_SEQ = key("seq");
const KEY_TOKENS = key("tokens");
const KEY_CONTENT = key("content");

function reserve(maxBytes: number): void {
  if (position + maxBytes <= slab.length) return;
  slab = Buffer.allocUnsafeSlow(Math.max(SLAB_BYTES, maxBytes));
  view = new DataView(slab.buffer, slab.byteOffset, slab.byteLength);
  position = 0;
}

function writeBytes(bytes: Buffer): void {
  for (let i = 0; i < bytes.length; i++) slab[position++] = bytes[i]!;
}

/** msgpackr's number encoding with useRecords false and no useFloat32. */
function writeNumber(value: number): void {
  if (value >>> 0 === value) {
    if (value < 0x80) slab[position++] = value;
    else if (value < 0x100) {
      slab[position++] = 0xcc;
      slab[position++] = value;
    } else if (value < 0x10000) {
      slab[position++] = 0xcd;
      slab[position++] = value >> 8;
      slab[position++] = value & 0xff;
    } else {
      slab[position++] = 0xce;
      view.setUint32(position, value);
      position += 4;
    }
  } else if (value >> 0 === value) {
    if (value >= -0x20) slab[position++] = 0x100 + value;
    else if (value >= -0x80) {
      slab[position++] = 0xd0;
      slab[position++] = value + 0x100;
    } else if (value >= -0x8000) {
      slab[position++] = 0xd1;
      view.setInt16(position, value);
      position += 2;
    } else {
      slab[position++] = 0xd2;
      view.setInt32(position, value);
      position += 4;
    }
  } else {
    slab[position++] = 0xcb;
    view.setFloat64(position, value);
    position += 8;
  }
}

/**
 * msgpackr's string encoding: short strings (< 64 UTF-16 units) by its own loop, which writes a lone
 * surrogate as its 3-byte form; longer ones by Buffer's UTF-8 writer, which writes U+FFFD instead. The
 * header is the smallest for the byte length; room for it is estimated from the UTF-16 length.
 */
function writeString(value: string): void {
  const units = value.length;
  const headerSize = units < 0x20 ? 1 : units < 0x100 ? 2 : units < 0x10000 ? 3 : 5;
  const headerAt = position;
  let at = position + headerSize;
  let length: number;
  if (units < 0x40) {
    for (let i = 0; i < units; i++) {
      let c1 = value.charCodeAt(i);
      let c2: number;
      if (c1 < 0x80) slab[at++] = c1;
      else if (c1 < 0x800) {
        slab[at++] = (c1 >> 6) | 0xc0;
        slab[at++] = (c1 & 0x3f) | 0x80;
      } else if ((c1 & 0xfc00) === 0xd800 && ((c2 = value.charCodeAt(i + 1)) & 0xfc00) === 0xdc00) {
        c1 = 0x10000 + ((c1 & 0x03ff) << 10) + (c2 & 0x03ff);
        i++;
        slab[at++] = (c1 >> 18) | 0xf0;
        slab[at++] = ((c1 >> 12) & 0x3f) | 0x80;
        slab[at++] = ((c1 >> 6) & 0x3f) | 0x80;
        slab[at++] = (c1 & 0x3f) | 0x80;
      } else {
        slab[at++] = (c1 >> 12) | 0xe0;
        slab[at++] = ((c1 >> 6) & 0x3f) | 0x80;
        slab[at++] = (c1 & 0x3f) | 0x80;
      }
    }
    length = at - headerAt - headerSize;
  } else {
    length = slab.write(value, at, slab.length - at, "utf8");
  }
  const needed = length < 0x20 ? 1 : length < 0x100 ? 2 : length < 0x10000 ? 3 : 5;
  // The text was written after a header of `headerSize` bytes; move it when the header is longer.
  if (needed > headerSize) slab.copyWithin(headerAt + needed, headerAt + headerSize, headerAt + headerSize + length);
  if (needed === 1) slab[headerAt] = 0xa0 | length;
  else if (needed === 2) {
    slab[headerAt] = 0xd9;
    slab[headerAt + 1] = length;
  } else if (needed === 3) {
    slab[headerAt] = 0xda;
    slab[headerAt + 1] = length >> 8;
    slab[headerAt + 2] = length & 0xff;
  } else {
    slab[headerAt] = 0xdb;
    view.setUint32(headerAt + 1, length);
  }
  position = headerAt + needed + length;
}

/** The msgpack bytes of a chunk frame, equal to `encodeFrame(frame)` for frames built as attempt.ts builds them. */
export function encodeChunkFrame(frame: ChunkFrame): Uint8Array {
  if (frame.tool_calls !== undefined) return encodeFrame(frame);
  const content = frame.content;
  reserve(FIXED_MAX_BYTES + 3 * frame.request_id.length + (content === undefined ? 0 : 3 * content.length));
  const start = position;
  slab[position++] = content === undefined ? 0x85 : 0x86;
  writeBytes(TYPE_CHUNK);
  writeBytes(KEY_REQUEST_ID);
  writeString(frame.request_id);
  writeBytes(KEY_ATTEMPT_N);
  writeNumber(frame.attempt_n);
  writeBytes(KEY_SEQ);
  writeNumber(frame.seq);
  writeBytes(KEY_TOKENS);
  writeNumber(frame.tokens);
  if (content !== undefined) {
    writeBytes(KEY_CONTENT);
    writeString(content);
  }
  return slab.subarray(start, position);
}
