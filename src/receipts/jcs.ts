// JSON Canonicalization Scheme, RFC 8785: the one byte form that receipts, prompt hashes, output
// hashes and route-snapshot digests are computed over. Pure; no I/O.
//
// RFC 8785 rules and how each is met here:
// - §3.2.1 no whitespace between tokens.
// - §3.2.2.1 literals null / true / false as themselves.
// - §3.2.2.2 strings: `"` and `\` escaped, U+0008/09/0A/0C/0D as \b \t \n \f \r, every other code
//   point below U+0020 as \u00xx (lowercase hex), everything else (including U+007F and non-ASCII)
//   written as is. That is exactly ECMAScript's JSON.stringify for a well-formed string (ES2019
//   "well-formed JSON.stringify"), which we use for speed on long outputs; lone surrogates are not
//   I-JSON (RFC 7493 §2.1) and are refused before stringify could escape them.
// - §3.2.2.3 numbers: ECMAScript Number.prototype.toString (what String(n) is); -0 → "0"; NaN and
//   ±Infinity are errors.
// - §3.2.3 object members sorted by the UTF-16 code units of their names, which is the default
//   comparison of Array.prototype.sort on strings.
//
// Fast path: when every object's own keys already come in that order — the receipts,
// snapshots and hash inputs we build ourselves list their members sorted, and a canonical text parses
// back that way — the canonical text is exactly JSON.stringify's, after one pass that refuses what
// JSON.stringify would write differently or drop (lone surrogates, NaN/±Infinity, undefined members,
// holes, non-plain objects). Any other value takes the member-sorting writer below.

/** Deepest array/object nesting accepted; a guard so hostile input cannot exhaust the stack. */
export const MAX_JCS_DEPTH = 256;

/** Thrown for a value JSON cannot express (a caller bug, not an expected failure). */
export class JcsError extends Error {
  override name = "JcsError";
}

/** The RFC 8785 canonical text of `value`. Throws JcsError for anything outside I-JSON. */
export function canonicalize(value: unknown): string {
  return inCanonicalOrder(value) ? JSON.stringify(value) : write(value, 0);
}

/**
 * True when `value` is I-JSON and each of its objects enumerates its members in canonical order (then
 * JSON.stringify writes its canonical text); false when some object's members need sorting. Throws
 * JcsError for anything outside I-JSON.
 */
export function inCanonicalOrder(value: unknown, depth = 0): boolean {
  if (value === null) return true;
  switch (typeof value) {
    case "boolean":
      return true;
    case "number":
      canonicalNumber(value);
      return true;
    case "string":
      if (!value.isWellFormed()) throw new JcsError("string holds a lone surrogate (not I-JSON)");
      return true;
    case "object":
      break;
    default:
      throw new JcsError(`a ${typeof value} is not JSON`);
  }
  if (depth >= MAX_JCS_DEPTH) throw new JcsError(`nesting deeper than ${MAX_JCS_DEPTH}`);
  let ordered = true;
  if (Array.isArray(value)) {
    for (let i = 0; i < value.length; i++) {
      const item: unknown = value[i];
      if (item === undefined) throw new JcsError(`array element ${i} is undefined`);
      if (!inCanonicalOrder(item, depth + 1)) ordered = false;
    }
    return ordered;
  }
  const record = plainRecord(value);
  // Own enumerable string keys in JSON.stringify's order (integer-like keys first, ascending).
  const keys = Object.keys(record);
  for (let i = 0; i < keys.length; i++) {
    const key = keys[i]!;
    if (i > 0 && !(keys[i - 1]! < key)) ordered = false;
    if (!key.isWellFormed()) throw new JcsError("member name holds a lone surrogate (not I-JSON)");
    const member = record[key];
    if (member === undefined) throw new JcsError(`member ${JSON.stringify(key)} is undefined`);
    if (!inCanonicalOrder(member, depth + 1)) ordered = false;
  }
  return ordered;
}

/** `value` (an object, not an array) as a record, or JcsError when it is not a plain object. */
function plainRecord(value: object): Record<string, unknown> {
  const proto = Object.getPrototypeOf(value);
  if (proto !== Object.prototype && proto !== null) {
    // Date, Map, class instances, typed arrays: their JSON form is not what a reader would expect.
    throw new JcsError(`a ${proto?.constructor?.name ?? "non-plain"} object is not JSON`);
  }
  return value as Record<string, unknown>;
}

/** UTF-8 bytes of the canonical text (what is hashed and signed). */
export function canonicalBytes(value: unknown): Uint8Array {
  return new TextEncoder().encode(canonicalize(value));
}

/** RFC 8785 §3.2.2.2 string form. Throws JcsError for a lone surrogate. */
export function canonicalString(s: string): string {
  if (!s.isWellFormed()) throw new JcsError("string holds a lone surrogate (not I-JSON)");
  return JSON.stringify(s);
}

/** RFC 8785 §3.2.2.3 number form. Throws JcsError for NaN or ±Infinity. */
export function canonicalNumber(n: number): string {
  if (!Number.isFinite(n)) throw new JcsError(`${n} is not an I-JSON number`);
  // String(-0) is already "0"; String() of a finite number is ES Number::toString.
  return String(n);
}

// Member names repeat (every snapshot, receipt and prompt has the same few), so their canonical
// text is kept: escaping them was most of the work for these small objects. Bounded in
// count and length, since receipts come from providers.
const memberNames = new Map<string, string>();
const MEMBER_NAMES_LIMIT = 1024;
const MEMBER_NAME_MAX_LENGTH = 64;

/** `"name":` in canonical form. */
function memberPrefix(name: string): string {
  let text = memberNames.get(name);
  if (text === undefined) {
    text = `${canonicalString(name)}:`;
    if (name.length <= MEMBER_NAME_MAX_LENGTH && memberNames.size < MEMBER_NAMES_LIMIT) memberNames.set(name, text);
  }
  return text;
}

function write(value: unknown, depth: number): string {
  if (value === null) return "null";
  switch (typeof value) {
    case "boolean":
      return value ? "true" : "false";
    case "number":
      return canonicalNumber(value);
    case "string":
      return canonicalString(value);
    case "object":
      break;
    default:
      throw new JcsError(`a ${typeof value} is not JSON`);
  }
  if (depth >= MAX_JCS_DEPTH) throw new JcsError(`nesting deeper than ${MAX_JCS_DEPTH}`);
  if (Array.isArray(value)) {
    let out = "[";
    for (let i = 0; i < value.length; i++) {
      if (i > 0) out += ",";
      // A hole in a sparse array reads as undefined and is refused above.
      out += write(value[i], depth + 1);
    }
    return `${out}]`;
  }
  const record = plainRecord(value);
  const keys = Object.keys(record).sort();
  let out = "{";
  for (let i = 0; i < keys.length; i++) {
    const key = keys[i]!;
    const member = record[key];
    // JSON.stringify would silently drop it; a hash over a silently dropped field is a trap.
    if (member === undefined) throw new JcsError(`member ${JSON.stringify(key)} is undefined`);
    if (i > 0) out += ",";
    out += memberPrefix(key) + write(member, depth + 1);
  }
  return `${out}}`;
}
