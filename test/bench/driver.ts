// The benchmark's closed-loop load driver: a process of its own (spawned by run.ts), so its work never
// shares an event loop with the server under test. It reads one spec (JSON, argv[2]) and prints one
// JSON result. Keep-alive connections (Bun's fetch pools them); only 2xx answers count; percentiles
// come from the sorted samples; warm-up samples are discarded.
//   load:    c workers, each sending the next request as soon as the last one's body is read, for
//            warmupMs + durationMs; latency and throughput of the completions inside the window;
//            answers that ended outside it are counted apart (a short window on a loaded machine may
//            hold no completion, yet every request sent must still be seen answered).
//   streams: c workers, each running `perWorker` streams one after another (the first `warmup` of
//            each discarded); per stream: time to the first content frame, gaps between content
//            frames, frames delivered, and each frame's transit time (mock.ts stamps every delta).
// Bun's fetch keeps at most 256 requests in flight unless BUN_CONFIG_MAX_HTTP_REQUESTS is raised
// (run.ts sets it for this process).

export interface LoadSpec {
  mode: "load";
  url: string;
  headers: Record<string, string>;
  body: string;
  concurrency: number;
  warmupMs: number;
  durationMs: number;
}

export interface StreamSpec {
  mode: "streams";
  url: string;
  headers: Record<string, string>;
  body: string;
  concurrency: number;
  perWorker: number;
  warmup: number;
  expectedFrames: number;
  stallMs: number;
}

export interface Percentiles {
  n: number;
  p50: number;
  p90: number;
  p99: number;
  max: number;
}

export interface LoadResult {
  ok: number;
  errors: number;
  error_rate: number;
  rps: number;
  latency_ms: Percentiles;
  statuses: Record<string, number>;
  /** Answers that ended before the window opened or after it closed: in no figure above. */
  outside_window: { ok: number; errors: number };
}

export interface StreamResult {
  streams: number;
  ok_streams: number;
  errors: number;
  /** Deltas delivered: each of the mock's 16-digit stamps, whether or not it shared an SSE event. */
  frames: number;
  expected_frames: number;
  delivered_ratio: number;
  stalled_streams: number;
  max_gap_ms: number;
  ttft_ms: Percentiles;
  gap_ms: Percentiles;
  transit_ms: Percentiles;
  /** The transit of each stream's last delta alone: the end of the request follows it on every hop. */
  transit_last_ms: Percentiles;
  wall_s: number;
  frames_per_s: number;
  /** SSE content events that carried them (fewer than frames when a provider merged deltas). */
  events: number;
  /** The most streams open at once (answered, not yet ended): N only if a level's N streams overlapped. */
  peak_live: number;
  statuses: Record<string, number>;
}

export function percentiles(samples: Float64Array | number[]): Percentiles {
  const sorted = Float64Array.from(samples).sort();
  const n = sorted.length;
  const at = (p: number) => (n === 0 ? NaN : sorted[Math.min(n - 1, Math.floor((p / 100) * n))]!);
  const r = (x: number) => Math.round(x * 1000) / 1000;
  return { n, p50: r(at(50)), p90: r(at(90)), p99: r(at(99)), max: r(n === 0 ? NaN : sorted[n - 1]!) };
}

/** A growable Float64 sample buffer (no per-sample boxing). */
class Samples {
  private buf = new Float64Array(1024);
  length = 0;
  push(x: number) {
    if (this.length === this.buf.length) {
      const next = new Float64Array(this.buf.length * 2);
      next.set(this.buf);
      this.buf = next;
    }
    this.buf[this.length++] = x;
  }
  view() {
    return this.buf.subarray(0, this.length);
  }
}

async function runLoad(spec: LoadSpec): Promise<LoadResult> {
  const t0 = performance.now();
  const windowStart = t0 + spec.warmupMs;
  const end = windowStart + spec.durationMs;
  const latencies = new Samples();
  const statuses: Record<string, number> = {};
  let ok = 0;
  let errors = 0;
  const outside = { ok: 0, errors: 0 };
  const init = { method: "POST", headers: spec.headers, body: spec.body };
  const worker = async () => {
    while (performance.now() < end) {
      const start = performance.now();
      let status = 0;
      try {
        const res = await fetch(spec.url, init);
        status = res.status;
        await res.arrayBuffer();
      } catch {
        status = 0;
      }
      const done = performance.now();
      if (start < windowStart || done > end) {
        if (status >= 200 && status < 300) outside.ok++;
        else outside.errors++;
        continue;
      }
      statuses[status] = (statuses[status] ?? 0) + 1;
      if (status >= 200 && status < 300) {
        ok++;
        latencies.push(done - start);
      } else {
        errors++;
        if (status === 0) await Bun.sleep(1); // refused connections must not spin the loop
      }
    }
  };
  await Promise.all(Array.from({ length: spec.concurrency }, worker));
  const seconds = spec.durationMs / 1000;
  return {
    ok,
    errors,
    error_rate: ok + errors === 0 ? 1 : errors / (ok + errors),
    rps: Math.round(ok / seconds),
    latency_ms: percentiles(latencies.view()),
    statuses,
    outside_window: outside,
  };
}

const CONTENT = '"content":"';

async function runStreams(spec: StreamSpec): Promise<StreamResult> {
  const ttft = new Samples();
  const gaps = new Samples();
  const transit = new Samples();
  const transitLast = new Samples();
  const statuses: Record<string, number> = {};
  let streams = 0;
  let okStreams = 0;
  let errors = 0;
  let frames = 0;
  let events = 0;
  let stalled = 0;
  let maxGap = 0;
  let live = 0;
  let peakLive = 0;
  const origin = performance.timeOrigin;
  const init = { method: "POST", headers: spec.headers, body: spec.body };

  async function one(record: boolean) {
    const start = performance.now();
    let status = 0;
    let count = 0;
    let myEvents = 0;
    let first = -1;
    let last = -1;
    let worstGap = 0;
    let lastTransit = -1;
    let opened = false;
    const myGaps: number[] = [];
    const myTransit: number[] = [];
    try {
      const res = await fetch(spec.url, init);
      status = res.status;
      if (status < 200 || status >= 300) await res.arrayBuffer();
      else {
        opened = true;
        if (++live > peakLive) peakLive = live;
        const reader = res.body!.getReader();
        const decoder = new TextDecoder();
        let tail = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          const now = performance.now();
          const text = tail + decoder.decode(value, { stream: true });
          const cut = text.lastIndexOf("\n\n");
          if (cut < 0) {
            tail = text;
            continue;
          }
          let at = text.indexOf(CONTENT);
          while (at >= 0 && at < cut) {
            // One content frame may carry several deltas (a provider merges what one upstream read
            // held): each 16-digit stamp is one delta, counted and timed on its own.
            const from = at + CONTENT.length;
            const close = text.indexOf('"', from);
            const stamps = close - from;
            if (close > 0 && stamps > 0 && stamps % 16 === 0) {
              myEvents++;
              for (let s = from; s < close; s += 16) {
                count++;
                if (first < 0) first = now;
                else {
                  const gap = now - last;
                  myGaps.push(gap);
                  if (gap > worstGap) worstGap = gap;
                }
                last = now;
                lastTransit = origin + now - Number(text.slice(s, s + 16)) / 1000;
                myTransit.push(lastTransit);
              }
            }
            at = text.indexOf(CONTENT, from);
          }
          tail = text.slice(cut + 2);
        }
      }
    } catch {
      // A reset mid-stream: the frames that arrived still count below.
    }
    if (opened) live--;
    if (!record) return;
    streams++;
    statuses[status] = (statuses[status] ?? 0) + 1;
    frames += count;
    events += myEvents;
    const complete = status >= 200 && status < 300 && count === spec.expectedFrames;
    if (complete) okStreams++;
    else errors++;
    if (worstGap > spec.stallMs) stalled++;
    if (worstGap > maxGap) maxGap = worstGap;
    if (first >= 0) ttft.push(first - start);
    for (const g of myGaps) gaps.push(g);
    for (const t of myTransit) transit.push(t);
    if (complete) transitLast.push(lastTransit);
  }

  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: spec.concurrency }, async () => {
      for (let i = 0; i < spec.warmup + spec.perWorker; i++) await one(i >= spec.warmup);
    }),
  );
  const wall = (performance.now() - t0) / 1000;
  const expected = streams * spec.expectedFrames;
  return {
    streams,
    ok_streams: okStreams,
    errors,
    frames,
    expected_frames: expected,
    delivered_ratio: expected === 0 ? 0 : frames / expected,
    stalled_streams: stalled,
    max_gap_ms: Math.round(maxGap * 1000) / 1000,
    ttft_ms: percentiles(ttft.view()),
    gap_ms: percentiles(gaps.view()),
    transit_ms: percentiles(transit.view()),
    transit_last_ms: percentiles(transitLast.view()),
    wall_s: Math.round(wall * 1000) / 1000,
    frames_per_s: Math.round(frames / wall),
    events,
    peak_live: peakLive,
    statuses,
  };
}

if (import.meta.main) {
  const spec = JSON.parse(process.argv[2]!) as LoadSpec | StreamSpec;
  const result = spec.mode === "load" ? await runLoad(spec) : await runStreams(spec);
  process.stdout.write(`${JSON.stringify(result)}\n`);
  process.exit(0);
}
