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

/** Deepest array/object nesting accepted; a guard so hostile input cannot exhaust the stack. */
export const MAX_JCS_DEPTH = 256;

/** Thrown for a value JSON cannot express (a caller bug, not an expected failure). */
export class JcsError extends Error {
  override name = "JcsError";
}

/** The RFC 8785 canonical text of `value`. Throws JcsError for anything outside I-JSON. */
export function canonicalize(value: unknown): string {
  const out: string[] = [];
  write(value, out, 0);
  return out.join("");
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

function write(value: unknown, out: string[], depth: number): void {
  if (value === null) {
    out.push("null");
    return;
  }
  switch (typeof value) {
    case "boolean":
      out.push(value ? "true" : "false");
      return;
    case "number":
      out.push(canonicalNumber(value));
      return;
    case "string":
      out.push(canonicalString(value));
      return;
    case "object":
      break;
    default:
      throw new JcsError(`a ${typeof value} is not JSON`);
  }
  if (depth >= MAX_JCS_DEPTH) throw new JcsError(`nesting deeper than ${MAX_JCS_DEPTH}`);
  if (Array.isArray(value)) {
    out.push("[");
    for (let i = 0; i < value.length; i++) {
      if (i > 0) out.push(",");
      // A hole in a sparse array reads as undefined and is refused below.
      write(value[i], out, depth + 1);
    }
    out.push("]");
    return;
  }
  const proto = Object.getPrototypeOf(value);
  if (proto !== Object.prototype && proto !== null) {
    // Date, Map, class instances, typed arrays: their JSON form is not what a reader would expect.
    throw new JcsError(`a ${proto?.constructor?.name ?? "non-plain"} object is not JSON`);
  }
  const record = value as Record<string, unknown>;
  const keys = Object.keys(record).sort();
  out.push("{");
  for (let i = 0; i < keys.length; i++) {
    const key = keys[i]!;
    const member = record[key];
    // JSON.stringify would silently drop it; a hash over a silently dropped field is a trap.
    if (member === undefined) throw new JcsError(`member ${JSON.stringify(key)} is undefined`);
    if (i > 0) out.push(",");
    out.push(canonicalString(key), ":");
    write(member, out, depth + 1);
  }
  out.push("}");
}
