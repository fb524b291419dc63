// A templated stream's retry result is kept compact (src/http/idempotency.ts): the embedded replay file
// stores that form and a restart's retry gets the stream byte for byte; a backend other processes
// read (Redis) is given the whole body.
import { afterEach, expect, test } from "bun:test";
import { Database } from "bun:sqlite";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createReplayCache, type ReplayIdentity, type RunTracker } from "../../src/http/idempotency.ts";
import { errorResponse, type GatewayError } from "../../src/http/errors.ts";
import { lazyEventStream, type BodyTemplate } from "../../src/http/output.ts";
import { openReplayFile } from "../../src/store/replays.ts";
import type { ReplayBackend, StoredResult } from "../../src/store/replayBackend.ts";

const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

const identity = (over: Partial<ReplayIdentity> = {}): ReplayIdentity => ({
  account_id: "acct_1",
  route: "/v1/chat/completions",
  body: new TextEncoder().encode('{"model":"m","stream":true,"messages":[]}'),
  idempotencyKey: null,
  retryMarked: false,
  ...over,
});
const refuse = (e: GatewayError) => errorResponse(e, "req_x");
const delta: BodyTemplate = { prefix: 'data: {"id":"chatcmpl-req_1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":', suffix: '},"finish_reason":null}]}\n\n' };

/** Runs one 64-delta stream through `cache` and returns its bytes as the buyer got them. */
async function stream(cache: ReturnType<typeof createReplayCache>): Promise<string> {
  let tracker!: RunTracker;
  const out = lazyEventStream({ headers: { "x-request-id": "req_1" }, onBuyerGone: () => tracker.outcome(false), record: (t) => tracker.record(t), recordFilled: (t, h) => tracker.recordFilled(t, h) });
  const response = await cache.run(
    identity(),
    (t) => {
      tracker = t;
      out.write('data: {"role":"assistant"}\n\n');
      return out.response;
    },
    refuse,
  );
  for (let i = 0; i < 64; i++) out.writeFilled(delta, JSON.stringify(`token ${i} ü🚀`));
  out.write("data: [DONE]\n\n");
  out.end();
  tracker.outcome(true);
  return response.text();
}

test("the replay file keeps a stream compact, and a retry after a restart gets it byte for byte", async () => {
  const dir = mkdtempSync(join(tmpdir(), "replay-compact-"));
  dirs.push(dir);
  const path = join(dir, "replays.db");
  const now = () => 1_000_000;
  const first = openReplayFile(path, { now, windowMs: 60_000 });
  const whole = await stream(createReplayCache({ now, backend: first }));
  first.close();

  const db = new Database(path, { readonly: true });
  const row = db.query("SELECT length(body) AS n FROM replay_results").get() as { n: number };
  db.close();
  // The whole stream is ~9 KB; kept compact, each delta is its hole and 3 bytes.
  expect(row.n).toBeLessThan(Buffer.byteLength(whole) / 4);

  // A new process: nothing in memory, the file answers.
  const second = openReplayFile(path, { now, windowMs: 60_000 });
  const replay = await createReplayCache({ now, backend: second }).run(identity({ retryMarked: true }), () => Promise.reject(new Error("ran again")), refuse);
  expect(replay.headers.get("idempotent-replayed")).toBe("true");
  expect(await replay.text()).toBe(whole);
  second.close();
});

test("a backend that does not keep compact bodies is given the whole stream", async () => {
  const given: StoredResult[] = [];
  const backend: ReplayBackend = {
    claim: async () => null,
    latest: async () => null,
    started: () => {},
    finished: (_key, _fingerprint, result) => void (result && given.push(result)),
  };
  const whole = await stream(createReplayCache({ now: () => 1_000_000, backend }));
  expect(given.length).toBe(1);
  expect(new TextDecoder().decode(given[0]!.body)).toBe(whole);
});
