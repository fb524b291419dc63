// The replay cache on its own (src/http/idempotency.ts), with a driven clock: what is replayed, what
// runs, what is refused, and for how long and how many bytes results are kept.
import { describe, expect, test } from "bun:test";
import { createReplayCache, REPLAY_WINDOW_MS, type ReplayIdentity, type RunTracker } from "../../src/http/idempotency.ts";
import { errorResponse, type GatewayError } from "../../src/http/errors.ts";

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
  /** A run that succeeds with a JSON body naming the run. */
  const ok = (tracker: RunTracker) => {
    runs++;
    tracker.outcome(true);
    return Promise.resolve(new Response(JSON.stringify({ run: runs }), { headers: { "content-type": "application/json", "x-request-id": `req_${runs}` } }));
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
    /** Lets the cache copy a JSON body it is keeping (it reads a clone asynchronously). */
    settle: () => Bun.sleep(1),
  };
}

const json = async (r: Response) => (await r.json()) as Record<string, unknown>;

describe("replay cache", () => {
  test("a retry-marked request with the same body gets the latest success; unmarked ones run", async () => {
    const h = harness();
    await h.cache.run(identity(), h.ok, refuse);
    await h.settle();
    expect(await json(await h.cache.run(identity(), h.ok, refuse))).toEqual({ run: 2 });
    await h.settle();
    const replayed = await h.cache.run(identity({ retryMarked: true }), h.ok, refuse);
    expect(await json(replayed)).toEqual({ run: 2 });
    expect(replayed.headers.get("idempotent-replayed")).toBe("true");
    expect(replayed.headers.get("x-request-id")).toBe("req_2");
    expect(h.runs()).toBe(2);
  });

  test("a failed latest result is not replayed, even when an older identical one succeeded", async () => {
    const h = harness();
    await h.cache.run(identity(), h.ok, refuse);
    await h.settle();
    await h.cache.run(identity(), h.failing, refuse);
    const retry = await h.cache.run(identity({ retryMarked: true }), h.ok, refuse);
    expect(retry.headers.get("idempotent-replayed")).toBeNull();
    expect(h.runs()).toBe(3);
  });

  test("results expire after 10 minutes", async () => {
    const h = harness();
    await h.cache.run(identity({ idempotencyKey: "k" }), h.ok, refuse);
    await h.settle();
    h.advance(REPLAY_WINDOW_MS - 1);
    expect((await h.cache.run(identity({ idempotencyKey: "k" }), h.ok, refuse)).headers.get("idempotent-replayed")).toBe("true");
    h.advance(2);
    expect((await h.cache.run(identity({ idempotencyKey: "k" }), h.ok, refuse)).headers.get("idempotent-replayed")).toBeNull();
    await h.settle();
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
      await h.settle();
    }
    expect(h.cache.size()).toBe(1);
    expect(await json(await h.cache.run(identity({ retryMarked: true }), h.ok, refuse))).toEqual({ run: 5 });
  });

  test("at most maxEntries finished results are kept, oldest first out", async () => {
    let now = 0;
    const cache = createReplayCache({ now: () => now, maxEntries: 3 });
    let runs = 0;
    const ok = (tracker: RunTracker) => {
      runs++;
      tracker.outcome(true);
      return Promise.resolve(new Response(JSON.stringify({ run: runs }), { headers: { "content-type": "application/json" } }));
    };
    for (const key of ["a", "b", "c", "d"]) {
      await cache.run(identity({ idempotencyKey: key }), ok, refuse);
      await Bun.sleep(1);
      now += 1;
    }
    expect(cache.size()).toBe(3);
    expect((await cache.run(identity({ idempotencyKey: "a" }), ok, refuse)).headers.get("idempotent-replayed")).toBeNull();
    expect((await cache.run(identity({ idempotencyKey: "d" }), ok, refuse)).headers.get("idempotent-replayed")).toBe("true");
  });

  test("over the byte budget the oldest results go first", async () => {
    const h = harness({ maxBytes: 20 });
    await h.cache.run(identity({ idempotencyKey: "a" }), h.ok, refuse); // {"run":1}: 9 bytes
    await h.settle();
    await h.cache.run(identity({ idempotencyKey: "b" }), h.ok, refuse);
    await h.settle();
    await h.cache.run(identity({ idempotencyKey: "c" }), h.ok, refuse);
    await h.settle();
    expect((await h.cache.run(identity({ idempotencyKey: "a" }), h.ok, refuse)).headers.get("idempotent-replayed")).toBeNull();
    await h.settle();
    expect((await h.cache.run(identity({ idempotencyKey: "c" }), h.ok, refuse)).headers.get("idempotent-replayed")).toBe("true");
  });

  test("Idempotency-Key: 409 while in flight, 422 for another body, 400 for a bad key; scoped to the account", async () => {
    const h = harness();
    let release!: () => void;
    const slow = (tracker: RunTracker) =>
      new Promise<Response>((resolve) => {
        release = () => {
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
    await h.settle();
    const other = await h.cache.run(identity({ idempotencyKey: "k", body: enc.encode("{}") }), h.ok, refuse);
    expect(other.status).toBe(422);
    expect(((await other.json()) as { error: { code: string } }).error.code).toBe("idempotency_key_reused");
    expect((await h.cache.run(identity({ idempotencyKey: "x".repeat(256) }), h.ok, refuse)).status).toBe(400);
    const otherAccount = await h.cache.run(identity({ idempotencyKey: "k", account_id: "acct_2" }), h.ok, refuse);
    expect(otherAccount.headers.get("idempotent-replayed")).toBeNull();
  });

  test("an SSE result is recorded as it streams and replayed whole; a cancelled one is not kept", async () => {
    const h = harness();
    const sse = (tracker: RunTracker) => {
      const stream = new ReadableStream<Uint8Array>({
        start(c) {
          c.enqueue(enc.encode("data: 1\n\n"));
          c.enqueue(enc.encode("data: [DONE]\n\n"));
          tracker.outcome(true);
          c.close();
        },
      });
      return Promise.resolve(new Response(stream, { headers: { "content-type": "text/event-stream" } }));
    };
    expect(await (await h.cache.run(identity(), sse, refuse)).text()).toBe("data: 1\n\ndata: [DONE]\n\n");
    const replay = await h.cache.run(identity({ retryMarked: true }), h.ok, refuse);
    expect(replay.headers.get("content-type")).toBe("text/event-stream");
    expect(await replay.text()).toBe("data: 1\n\ndata: [DONE]\n\n");

    const cut = await h.cache.run(identity({ body: enc.encode("cut") }), sse, refuse);
    await cut.body!.cancel();
    expect((await h.cache.run(identity({ body: enc.encode("cut"), retryMarked: true }), h.ok, refuse)).headers.get("idempotent-replayed")).toBeNull();
  });
});
