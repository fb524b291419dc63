// The replay cache on its own (src/http/idempotency.ts), with a driven clock: what is replayed, what
// runs, what is refused, and for how long and how many bytes results are kept.
import { describe, expect, test } from "bun:test";
import { createReplayCache, REPLAY_WINDOW_MS, type ReplayIdentity, type RunTracker } from "../../src/http/idempotency.ts";
import { errorResponse, type GatewayError } from "../../src/http/errors.ts";
import { lazyEventStream, type BodyTemplate, type LazyEventStream } from "../../src/http/output.ts";
import type { ReplayBackend } from "../../src/store/replayBackend.ts";

const enc = new TextEncoder();
const identity = (over: Partial<ReplayIdentity> = {}): ReplayIdentity => ({
  account_id: "acct_1",
  route: "/v1/chat/completions",
  body: enc.encode('{"model":"m","messages":[]}'),
  idempotencyKey: null,
  retryMarked: false,
  ...over,
});
const refuse = (e: GatewayError) => errorResponse(e, "req_x");

function harness(options: { maxBytes?: number } = {}) {
  let now = 1_000_000;
  const cache = createReplayCache({ now: () => now, ...options });
  let runs = 0;
  /** A run that succeeds with a JSON body naming the run (recorded as written, like a responder's). */
  const ok = (tracker: RunTracker) => {
    runs++;
    const body = JSON.stringify({ run: runs });
    tracker.record(body);
    tracker.outcome(true);
    return Promise.resolve(new Response(body, { headers: { "content-type": "application/json", "x-request-id": `req_${runs}` } }));
  };
  const failing = (tracker: RunTracker) => {
    runs++;
    tracker.outcome(false);
    return Promise.resolve(new Response("{}", { status: 503, headers: { "content-type": "application/json" } }));
  };
  return {
    cache,
    runs: () => runs,
    advance: (ms: number) => (now += ms),
    ok,
    failing,
  };
}

const json = async (r: Response) => (await r.json()) as Record<string, unknown>;

describe("replay cache", () => {
  test("a retry-marked request with the same body gets the latest success; unmarked ones run", async () => {
    const h = harness();
    await h.cache.run(identity(), h.ok, refuse);
    expect(await json(await h.cache.run(identity(), h.ok, refuse))).toEqual({ run: 2 });
    const replayed = await h.cache.run(identity({ retryMarked: true }), h.ok, refuse);
    expect(await json(replayed)).toEqual({ run: 2 });
    expect(replayed.headers.get("idempotent-replayed")).toBe("true");
    expect(replayed.headers.get("x-request-id")).toBe("req_2");
    expect(h.runs()).toBe(2);
  });

  test("a failed latest result is not replayed, even when an older identical one succeeded", async () => {
    const h = harness();
    await h.cache.run(identity(), h.ok, refuse);
    await h.cache.run(identity(), h.failing, refuse);
    const retry = await h.cache.run(identity({ retryMarked: true }), h.ok, refuse);
    expect(retry.headers.get("idempotent-replayed")).toBeNull();
    expect(h.runs()).toBe(3);
  });

  test("results expire after 10 minutes", async () => {
    const h = harness();
    await h.cache.run(identity({ idempotencyKey: "k" }), h.ok, refuse);
    h.advance(REPLAY_WINDOW_MS - 1);
    expect((await h.cache.run(identity({ idempotencyKey: "k" }), h.ok, refuse)).headers.get("idempotent-replayed")).toBe("true");
    h.advance(2);
    expect((await h.cache.run(identity({ idempotencyKey: "k" }), h.ok, refuse)).headers.get("idempotent-replayed")).toBeNull();
    expect(h.runs()).toBe(2);
    // Expired entries are dropped, not kept forever.
    h.advance(REPLAY_WINDOW_MS + 1);
    await h.cache.run(identity({ route: "/v1/responses" }), h.failing, refuse);
    expect(h.cache.size()).toBe(1);
  });

  test("of identical unkeyed requests only the latest is kept (the only one a retry can find)", async () => {
    const h = harness();
    for (let i = 0; i < 5; i++) {
      await h.cache.run(identity(), h.ok, refuse);
    }
    expect(h.cache.size()).toBe(1);
    expect(await json(await h.cache.run(identity({ retryMarked: true }), h.ok, refuse))).toEqual({ run: 5 });
  });

  test("a run superseded by an identical one leaves the backend to the newer run", async () => {
    const calls: string[] = [];
    const backend: ReplayBackend = {
      claim: async () => null,
      latest: async () => null,
      started: () => {},
      finished: (keyId, _fingerprint, result) => void calls.push(`finished ${keyId} ${result === null ? "failed" : "succeeded"}`),
    };
    const cache = createReplayCache({ now: () => 0, backend });
    const held: ((value: Response) => void)[] = [];
    const pending = (tracker: RunTracker) =>
      new Promise<Response>((resolve) => {
        tracker.record("{}");
        tracker.outcome(true);
        held.push(resolve);
      });
    const first = cache.run(identity(), pending, refuse);
    const second = cache.run(identity(), pending, refuse);
    await Bun.sleep(0);
    const respond = () => new Response("{}", { headers: { "content-type": "application/json" } });
    held[0]!(respond());
    await first;
    expect(calls).toEqual([]);
    held[1]!(respond());
    await second;
    expect(calls).toEqual(["finished null succeeded"]);
  });

  test("at most maxEntries finished results are kept, oldest first out", async () => {
    let now = 0;
    const cache = createReplayCache({ now: () => now, maxEntries: 3 });
    let runs = 0;
    const ok = (tracker: RunTracker) => {
      runs++;
      const body = JSON.stringify({ run: runs });
      tracker.record(body);
      tracker.outcome(true);
      return Promise.resolve(new Response(body, { headers: { "content-type": "application/json" } }));
    };
    for (const key of ["a", "b", "c", "d"]) {
      await cache.run(identity({ idempotencyKey: key }), ok, refuse);
      now += 1;
    }
    expect(cache.size()).toBe(3);
    expect((await cache.run(identity({ idempotencyKey: "a" }), ok, refuse)).headers.get("idempotent-replayed")).toBeNull();
    expect((await cache.run(identity({ idempotencyKey: "d" }), ok, refuse)).headers.get("idempotent-replayed")).toBe("true");
  });

  test("a run that failed before it had a response (a non-streaming buyer hung up) finishes at once and counts toward the bound", async () => {
    let now = 0;
    const cache = createReplayCache({ now: () => now, maxEntries: 2 });
    // The buyer hangs up while the answer is being made: the run fails, and its response never comes.
    const abandoned = (tracker: RunTracker) => {
      tracker.outcome(false);
      return new Promise<Response>(() => {});
    };
    for (let i = 0; i < 5; i++) {
      void cache.run(identity({ body: enc.encode(`{"n":${i}}`) }), abandoned, refuse);
      now += 1;
    }
    // Before the fix each stayed in flight, never pruned: five entries, and more with every hang-up.
    await cache.run(identity(), (tracker) => (tracker.outcome(false), Promise.resolve(new Response("{}", { status: 503 }))), refuse);
    expect(cache.size()).toBe(2);
    expect(cache.recordings()).toBe(0);
  });

  test("over the byte budget the oldest results go first", async () => {
    const h = harness({ maxBytes: 20 });
    await h.cache.run(identity({ idempotencyKey: "a" }), h.ok, refuse); // {"run":1}: 9 bytes
    await h.cache.run(identity({ idempotencyKey: "b" }), h.ok, refuse);
    await h.cache.run(identity({ idempotencyKey: "c" }), h.ok, refuse);
    expect((await h.cache.run(identity({ idempotencyKey: "a" }), h.ok, refuse)).headers.get("idempotent-replayed")).toBeNull();
    expect((await h.cache.run(identity({ idempotencyKey: "c" }), h.ok, refuse)).headers.get("idempotent-replayed")).toBe("true");
  });

  test("Idempotency-Key: 409 while in flight, 422 for another body, 400 for a bad key; scoped to the account", async () => {
    const h = harness();
    let release!: () => void;
    const slow = (tracker: RunTracker) =>
      new Promise<Response>((resolve) => {
        release = () => {
          tracker.record('{"slow":true}');
          tracker.outcome(true);
          resolve(new Response('{"slow":true}', { headers: { "content-type": "application/json" } }));
        };
      });
    const first = h.cache.run(identity({ idempotencyKey: "k" }), slow, refuse);
    const inFlight = await h.cache.run(identity({ idempotencyKey: "k" }), h.ok, refuse);
    expect(inFlight.status).toBe(409);
    expect(((await inFlight.json()) as { error: { code: string } }).error.code).toBe("duplicate_request_id");
    release();
    await first;
    const other = await h.cache.run(identity({ idempotencyKey: "k", body: enc.encode("{}") }), h.ok, refuse);
    expect(other.status).toBe(422);
    expect(((await other.json()) as { error: { code: string } }).error.code).toBe("idempotency_key_reused");
    expect((await h.cache.run(identity({ idempotencyKey: "x".repeat(256) }), h.ok, refuse)).status).toBe(400);
    const otherAccount = await h.cache.run(identity({ idempotencyKey: "k", account_id: "acct_2" }), h.ok, refuse);
    expect(otherAccount.headers.get("idempotent-replayed")).toBeNull();
  });

  /** A streamed run through the responders' own sink; `finish` ends it with the given events. */
  function streamedRun() {
    let out!: LazyEventStream;
    let tracker!: RunTracker;
    const run = (t: RunTracker) => {
      tracker = t;
      out = lazyEventStream({ headers: { "x-request-id": "req_sse" }, onBuyerGone: () => t.outcome(false), record: t.record });
      out.write("data: 1\n\n");
      return out.response;
    };
    const finish = (...events: string[]) => {
      for (const e of events) out.write(e);
      out.end();
      tracker.outcome(true);
    };
    return { run, finish };
  }

  test("an SSE result is recorded as it streams and replayed byte for byte with its headers", async () => {
    const h = harness();
    const s = streamedRun();
    const first = await h.cache.run(identity(), s.run, refuse);
    s.finish("data: ünïcödé 🚀\n\n", "data: [DONE]\n\n");
    const firstBytes = new Uint8Array(await first.arrayBuffer());
    const replay = await h.cache.run(identity({ retryMarked: true }), h.ok, refuse);
    expect(replay.headers.get("idempotent-replayed")).toBe("true");
    for (const name of ["content-type", "cache-control", "x-request-id", "x-accel-buffering"]) expect(replay.headers.get(name)).toBe(first.headers.get(name));
    expect(new Uint8Array(await replay.arrayBuffer())).toEqual(firstBytes);
    expect(new TextDecoder().decode(firstBytes)).toBe("data: 1\n\ndata: ünïcödé 🚀\n\ndata: [DONE]\n\n");
    expect(h.runs()).toBe(0);
  });

  test("templated pieces are kept compact and replayed byte for byte, in order with plain ones", async () => {
    const h = harness();
    const delta: BodyTemplate = { prefix: 'data: {"choices":[{"delta":{"content":', suffix: "}}]}\n\n" };
    const other: BodyTemplate = { prefix: "event: x\ndata: ", suffix: "\n\n" };
    // More templates than a recording tells apart: the rest are kept whole, in order all the same.
    const many = Array.from({ length: 300 }, (_, i): BodyTemplate => ({ prefix: `data: ${i}<`, suffix: ">\n\n" }));
    const holes = ["plain", "ünïcödé 🚀", "", '"quoted\\n"', "\u00ff\u00fe"];
    let out!: LazyEventStream;
    let tracker!: RunTracker;
    const first = await h.cache.run(
      identity(),
      (t) => {
        tracker = t;
        out = lazyEventStream({ headers: { "x-request-id": "req_sse" }, onBuyerGone: () => t.outcome(false), record: t.record, recordFilled: t.recordFilled });
        out.write("data: 1\n\n");
        return out.response;
      },
      refuse,
    );
    let expected = "data: 1\n\n";
    for (const hole of holes) {
      out.writeFilled(delta, JSON.stringify(hole));
      out.write("data: plain\n\n");
      out.writeFilled(other, hole);
      expected += `${delta.prefix}${JSON.stringify(hole)}${delta.suffix}data: plain\n\n${other.prefix}${hole}${other.suffix}`;
    }
    for (const t of many) {
      out.writeFilled(t, "h");
      expected += `${t.prefix}h${t.suffix}`;
    }
    out.end();
    tracker.outcome(true);
    const firstBytes = new Uint8Array(await first.arrayBuffer());
    expect(new TextDecoder().decode(firstBytes)).toBe(expected);
    const replay = await h.cache.run(identity({ retryMarked: true }), h.ok, refuse);
    expect(replay.headers.get("idempotent-replayed")).toBe("true");
    expect(new Uint8Array(await replay.arrayBuffer())).toEqual(firstBytes);
    expect(h.runs()).toBe(0);
  });

  test("a stream the buyer cancelled is not kept, even if its responder finishes later", async () => {
    const h = harness();
    const s = streamedRun();
    const cut = await h.cache.run(identity(), s.run, refuse);
    await cut.body!.cancel();
    s.finish("data: [DONE]\n\n");
    const retry = await h.cache.run(identity({ retryMarked: true }), h.ok, refuse);
    expect(retry.headers.get("idempotent-replayed")).toBeNull();
    expect(h.runs()).toBe(1);
  });

  test("recording stops once no retry can reach the run, but not while a retry waits on it", async () => {
    const h = harness();
    const a = streamedRun();
    const first = h.cache.run(identity(), a.run, refuse);
    expect(h.cache.recordings()).toBe(1);
    // A retry of the first waits for it; then an identical unmarked request replaces it as the latest.
    const waiting = h.cache.run(identity({ retryMarked: true }), h.ok, refuse);
    const b = streamedRun();
    const second = h.cache.run(identity(), b.run, refuse);
    expect(h.cache.recordings()).toBe(2);
    a.finish("data: a\n\n");
    expect(await (await waiting).text()).toBe("data: 1\n\ndata: a\n\n");
    expect((await waiting).headers.get("idempotent-replayed")).toBe("true");
    // A third identical request makes the second unreachable: nothing waits on it, so its copy stops.
    const c = streamedRun();
    const third = h.cache.run(identity(), c.run, refuse);
    expect(h.cache.recordings()).toBe(1);
    b.finish("data: b\n\n");
    c.finish("data: c\n\n");
    for (const r of [first, second, third]) await (await r).text();
    expect(h.cache.recordings()).toBe(0);
    expect(await (await h.cache.run(identity({ retryMarked: true }), h.ok, refuse)).text()).toBe("data: 1\n\ndata: c\n\n");
    expect(h.runs()).toBe(0);
  });
});
