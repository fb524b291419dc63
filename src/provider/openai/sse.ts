// Incremental Server-Sent Events decoder for upstream chat-completion streams. Pure: bytes in,
// events out. Follows the SSE framing rules (any line ending, comments, multi-line data, dispatch on
// a blank line) plus the quirks local servers are known to have (fixtures/upstreams/README.md):
// several events in one read, one event split across reads, `[DONE]` without its blank line at EOF,
// empty `data:` frames, and llama.cpp's non-standard `error: {json}` field line.

export type SseEvent =
  /** One event's data (data lines joined by "\n"); `event` is the SSE event name ("" when absent). */
  | { type: "data"; event: string; data: string }
  /** llama.cpp (up to ~b6500) sent `error: {...}` as a field line: a spec parser would drop it. */
  | { type: "error_field"; data: string }
  /** A line or event longer than the decoder's limit: the stream is malformed (or hostile). */
  | { type: "overflow" };

/** Default cap on one line (llama.cpp `--verbose` final events are tens of KB). */
export const DEFAULT_MAX_LINE_BYTES = 4 * 1024 * 1024;

export class SseDecoder {
  private readonly decoder = new TextDecoder();
  private buffered = "";
  /** The event's data lines joined by "\n" so far (built as it goes: most events have one line). */
  private data = "";
  private dataLines = 0;
  private dataChars = 0;
  private eventName = "";
  private overflowed = false;

  constructor(private readonly maxLineBytes = DEFAULT_MAX_LINE_BYTES) {}

  /** Feeds bytes; returns the events completed by them. */
  push(bytes: Uint8Array): SseEvent[] {
    return this.feed(this.decoder.decode(bytes, { stream: true }), false);
  }

  /** End of stream: flushes a last event that lacked its blank line (llama-server's bare `[DONE]`). */
  end(): SseEvent[] {
    return this.feed(this.decoder.decode(), true);
  }

  private feed(text: string, atEof: boolean): SseEvent[] {
    if (this.overflowed) return [];
    this.buffered += text;
    const events: SseEvent[] = [];
    let start = 0;
    let cr = -2; // position of the next CR at or after `start`; -1 none left, -2 not searched yet
    for (;;) {
      const lf = this.buffered.indexOf("\n", start);
      // Searched again only once passed: servers that never send CR cost one scan per read, not per line.
      if (cr === -2 || (cr >= 0 && cr < start)) cr = this.buffered.indexOf("\r", start);
      let end = lf < 0 ? cr : cr < 0 ? lf : Math.min(lf, cr);
      if (end < 0) break;
      // A CR as the last buffered char may be the first half of CRLF: wait for the next read.
      if (end === cr && cr === this.buffered.length - 1 && !atEof) break;
      const line = this.buffered.slice(start, end);
      if (end === cr && this.buffered[end + 1] === "\n") end++;
      start = end + 1;
      this.line(line, events);
    }
    this.buffered = this.buffered.slice(start);
    // Limits count UTF-16 code units, close enough to bytes for a safety cap.
    if (this.buffered.length > this.maxLineBytes || this.dataChars > this.maxLineBytes) {
      this.overflowed = true;
      this.buffered = "";
      return [...events, { type: "overflow" }];
    }
    if (atEof) {
      if (this.buffered !== "") this.line(this.buffered, events);
      this.buffered = "";
      this.dispatch(events);
    }
    return events;
  }

  private line(line: string, events: SseEvent[]): void {
    if (line === "") return this.dispatch(events);
    // `data:` first, without splitting the line: it is nearly every line of a stream.
    if (line.startsWith("data:")) return this.dataLine(line.charCodeAt(5) === 0x20 ? line.slice(6) : line.slice(5));
    if (line.startsWith(":")) return; // comment: keep-alive pings (llama.cpp, mlx_lm `: keepalive N/M`)
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "data") this.dataLine(value);
    else if (field === "event") this.eventName = value;
    else if (field === "error") events.push({ type: "error_field", data: value });
    // id, retry and unknown fields are ignored, as the SSE spec says.
  }

  private dataLine(value: string): void {
    this.data = this.dataLines === 0 ? value : `${this.data}\n${value}`;
    this.dataLines++;
    this.dataChars += value.length;
  }

  private dispatch(events: SseEvent[]): void {
    if (this.dataLines > 0) events.push({ type: "data", event: this.eventName, data: this.data });
    this.data = "";
    this.dataLines = 0;
    this.dataChars = 0;
    this.eventName = "";
  }
}
