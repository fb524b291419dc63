// A stream's content deltas differ only in their text: `{"id":"x",…,"delta":{"content":"TEXT"},…}`
// repeats byte for byte around TEXT. Once a payload has been parsed and mapped as a plain content delta,
// its bytes before and after the text are its template; a later payload with the same bytes around a
// text that is one well-formed JSON string body is the same delta with that text — the answer a full
// JSON.parse and mapping would give, at a fraction of the cost (docs/benchmarks.md, Measurements
// behind the code). Anything else takes the full path. No I/O.

const CONTENT_KEY = '"content":"';
/** Two texts that differ from each other (and, for one of them at least, from any learned text). */
const PROBES = ["template probe A", "template probe B"];
/** Templates learned at most this often per stream (each costs two more parses). */
const MAX_LESSONS = 4;
/** Characters that end, escape or cannot appear raw in a JSON string body. */
const NOT_PLAIN = /["\\\u0000-\u001f]/;

/** The JSON string body starting at `start` of `text` (its closing quote's index), or -1. */
function stringBodyEnd(text: string, start: number): number {
  for (let i = start; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === 0x22) return i; // "
    if (c === 0x5c) i++; // \ escapes the next character
  }
  return -1;
}

/** The text of a JSON string body (without its quotes), or undefined when it is not exactly one. */
function decodeBody(body: string): string | undefined {
  if (!NOT_PLAIN.test(body)) return body;
  try {
    const value: unknown = JSON.parse(`"${body}"`);
    return typeof value === "string" ? value : undefined;
  } catch {
    return undefined;
  }
}

export class ContentDeltaTemplate {
  private prefix: string | null = null;
  private suffix = "";
  private lessons = 0;

  /**
   * The text of `data` when it is the learned payload with another non-empty text; undefined when it is
   * not (no template yet, other bytes around the text, or a text that is not one JSON string body).
   */
  match(data: string): string | undefined {
    const { prefix, suffix } = this;
    if (prefix === null || data.length <= prefix.length + suffix.length || !data.startsWith(prefix) || !data.endsWith(suffix)) return undefined;
    return decodeBody(data.slice(prefix.length, data.length - suffix.length));
  }

  /**
   * Learns `data`, a payload the full path mapped to a content delta with text `content` and nothing
   * else that changes the stream (no tool calls, reasoning, finish reason, usage or token count).
   * `contentOf` is the full path's text of a payload (parse and read). Kept only when the text sits in
   * the payload's one `"content":"` and that string is the relayed one: two probes put there read back
   * as themselves (so no other member, duplicate key or choice holds the relayed text).
   */
  learn(data: string, content: string, contentOf: (data: string) => string | undefined): void {
    // A server whose deltas differ elsewhere too (a per-chunk timestamp) would make every delta learn.
    if (this.lessons++ >= MAX_LESSONS) return;
    const key = data.indexOf(CONTENT_KEY);
    if (key < 0 || data.indexOf(CONTENT_KEY, key + 1) >= 0) return;
    const start = key + CONTENT_KEY.length;
    const end = stringBodyEnd(data, start);
    if (end < 0 || decodeBody(data.slice(start, end)) !== content) return;
    const prefix = data.slice(0, start);
    const suffix = data.slice(end);
    for (const probe of PROBES) if (contentOf(prefix + probe + suffix) !== probe) return;
    this.prefix = prefix;
    this.suffix = suffix;
  }
}
