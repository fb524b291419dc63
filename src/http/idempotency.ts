// Retries replayed instead of re-run (docs/buyer-api.md). A request is a new request unless it says it is a
// retry:
// - `Idempotency-Key` (scoped to the account): the first successful result for the same route and body
//   bytes is replayed; while the first is in flight → 409 duplicate_request_id; the same key with
//   another route or body → 422 idempotency_key_reused.
// - no key, `x-stainless-retry-count` ≥ 1 (the official SDKs' automatic retries): when the latest
//   request of the same account with the same route and body bytes in the last 10 minutes succeeded,
//   its result is replayed; while it is in flight the retry waits for it.
// Failed or truncated results (any refusal, error, mid-stream failure or buyer cancel) are never
// replayed: the next request with that key or body runs as a new request. Identical bodies without a
// retry mark or key always run (people resample on purpose).
//
// Results live in process memory, bounded in bytes and in time, and in a backend that outlives the
// process (replayBackend.ts): a SQLite file in the embedded mode, so a retry that crosses a restart is
// replayed; Redis in a cluster, so a retry that lands on another node is (docs/quotas.md, "Retries").
// Memory is looked in first; the backend only when memory knows nothing of the key or body.
import { createHash } from "node:crypto";
import { gatewayError, type GatewayError } from "./errors.ts";
import type { BodyTemplate } from "./output.ts";
import type { ReplayBackend, SharedEntry } from "../store/replayBackend.ts";

export const REPLAY_WINDOW_MS = 10 * 60_000;
/** Marks a replayed response (the same header name as Stripe's: clients that know it can log it). */
export const REPLAYED_HEADER = "idempotent-replayed";
/** Longest Idempotency-Key accepted (Stripe's limit). */
const MAX_KEY_LENGTH = 255;

/** Response headers a replay carries over from the first result. */
const KEPT_HEADERS = ["content-type", "cache-control", "x-request-id", "x-accel-buffering"];

/**
 * What one kept result costs beyond its body bytes (entry object, map slots, key strings, headers),
 * measured with bun:jsc heapStats (test/bench/memory.ts); only used to report the cache's footprint.
 */
const ENTRY_OVERHEAD_BYTES = 600;

export interface ReplayIdentity {
  account_id: string;
  /** The buyer route: a body means something else on another route. */
  route: string;
  body: Uint8Array;
  /** The Idempotency-Key header, when sent. */
  idempotencyKey: string | null;
  /** x-stainless-retry-count ≥ 1. */
  retryMarked: boolean;
}

/** What a fresh run tells the cache: its body as written, and its outcome. */
export interface RunTracker {
  /** Every piece of the response body, in order, exactly as the buyer is sent it. */
  readonly record: (text: string) => void;
  /** A piece that is `template.prefix + hole + template.suffix`, in the same order as `record`'s. */
  readonly recordFilled: (template: BodyTemplate, hole: string) => void;
  /** The responder's success, or anything else (refusal, failure, buyer gone); the first call counts. */
  outcome(ok: boolean): void;
  /**
   * The whole successful response, before it is sent (its body already recorded): kept for retries at
   * once, as a success — sending it can no longer change that. A promise when the copy every node sees
   * is answered later (Redis): it settles, never rejecting, once it is.
   */
  result(response: Response): void | Promise<void>;
}

// One flat object per request, the result's fields inline: with many small (JSON) results the
// per-entry objects, not the bodies, dominate the cache's memory.
interface Entry {
  seq: number;
  /** `account \0 route \0 sha256(body)`: the byBody key and the identity a key is bound to. */
  fingerprint: string;
  /** `account \0 Idempotency-Key`, or null. */
  keyId: string | null;
  state: "in_flight" | "succeeded" | "failed";
  at_ms: number;
  /** The kept response: status, header name/value pairs (flat), body. */
  status: number;
  headers: string[] | null;
  body: ArrayBuffer | null;
  /** The copy of an in-flight body while a retry may still get it; null once none can, and when finished. */
  recording: Recording | null;
  /** Retries waiting for this in-flight result; created only when one waits (rare). */
  waiters: (() => void)[] | null;
}

export interface ReplayCacheOptions {
  now: () => number;
  windowMs?: number;
  /** Total bytes of stored results kept; the oldest go first. Default 32 MiB. */
  maxBytes?: number;
  /**
   * Finished results kept at most, whatever their size; the oldest go first. Default 16,384: without
   * it, 32 MiB of ~300-byte JSON bodies is ~110,000 entries whose own objects outweigh the bodies.
   */
  maxEntries?: number;
  /** Where finished results outlive this process (and, in a cluster, where keys are claimed). */
  backend?: ReplayBackend;
}

/** How long a retry waits for a run of its body in flight on another node before it runs fresh. */
const REMOTE_WAIT_MS = 30_000;
const REMOTE_POLL_MS = 50;

/** Reads the retry identity of a buyer request (headers) around its raw body bytes. */
export function replayIdentity(request: Request, account_id: string, route: string, body: Uint8Array): ReplayIdentity {
  const retry = Number.parseInt(request.headers.get("x-stainless-retry-count") ?? "", 10);
  return {
    account_id,
    route,
    body,
    idempotencyKey: request.headers.get("idempotency-key"),
    retryMarked: Number.isSafeInteger(retry) && retry >= 1,
  };
}

export function createReplayCache(options: ReplayCacheOptions) {
  const windowMs = options.windowMs ?? REPLAY_WINDOW_MS;
  const maxBytes = options.maxBytes ?? 32 * 1024 * 1024;
  const maxEntries = options.maxEntries ?? 16_384;
  // Insertion order = creation order: pruning walks from the oldest.
  const entries = new Map<number, Entry>();
  const byKey = new Map<string, Entry>();
  const byBody = new Map<string, Entry>();
  let seq = 0;
  let storedBytes = 0;
  let finished = 0;
  /** Retries waiting for a result in flight (a gauge in /metrics). */
  let waitingRetries = 0;

  /**
   * Whether a later request can still find `e`: a retry looks up only the latest request with its
   * fingerprint (byBody) or the entry of its key (byKey). An entry reachable by neither can never be
   * replayed, so nothing of it needs keeping.
   */
  const reachable = (e: Entry) => byBody.get(e.fingerprint) === e || (e.keyId !== null && byKey.get(e.keyId) === e);

  function forget(e: Entry): void {
    if (!entries.delete(e.seq)) return;
    if (e.state !== "in_flight") finished--;
    if (e.body) storedBytes -= e.body.byteLength;
    if (e.keyId !== null && byKey.get(e.keyId) === e) byKey.delete(e.keyId);
    if (byBody.get(e.fingerprint) === e) byBody.delete(e.fingerprint);
  }

  /** Drops finished entries older than the window, then the oldest finished ones while over a budget. */
  function prune(now: number): void {
    for (const e of entries.values()) {
      if (e.at_ms > now - windowMs) break;
      if (e.state !== "in_flight") forget(e);
    }
    // A failed entry replays nothing, and a retry that finds none runs fresh just as one that finds it
    // failed does: it may go whenever a budget is exceeded, like a success.
    for (const e of entries.values()) {
      if (storedBytes <= maxBytes && finished <= maxEntries) break;
      if (e.state !== "in_flight") forget(e);
    }
  }

  const live = (e: Entry | undefined, now: number): Entry | undefined =>
    e && (e.state === "in_flight" || e.at_ms > now - windowMs) ? e : undefined;

  function register(keyId: string | null, fingerprint: string): Entry {
    const e: Entry = { seq: ++seq, fingerprint, keyId, state: "in_flight", at_ms: options.now(), status: 0, headers: null, body: null, recording: new Recording(), waiters: null };
    entries.set(e.seq, e);
    const previousKeyed = keyId === null ? undefined : byKey.get(keyId);
    if (keyId !== null) byKey.set(keyId, e);
    const previous = byBody.get(fingerprint);
    byBody.set(fingerprint, e);
    // The previous request with this fingerprint is no longer what a retry finds (unless its key still
    // names it): a finished one is dropped now; an in-flight one stops recording unless retries already
    // wait on it. Nothing makes an entry reachable again, and only a reachable one gets new waiters.
    for (const p of [previous, previousKeyed]) {
      if (!p || reachable(p)) continue;
      if (p.state !== "in_flight") forget(p);
      else if (p.waiters === null) p.recording = null;
    }
    return e;
  }

  function finish(e: Entry, result: { status: number; headers: string[]; body: ArrayBuffer } | null): void | Promise<void> {
    if (e.state !== "in_flight") return;
    e.recording = null;
    finished++;
    e.state = result ? "succeeded" : "failed";
    if (result) {
      e.status = result.status;
      e.headers = result.headers;
      e.body = result.body;
      storedBytes += result.body.byteLength;
    }
    e.at_ms = options.now();
    // Re-inserted so creation order stays completion order for pruning.
    entries.delete(e.seq);
    entries.set(e.seq, e);
    // A run superseded by a newer identical one (unreachable) tells the backend nothing: the newer run
    // owns the body's entry there, and its own end writes or removes it (an end here used to delete
    // it — in Redis, the newer run's in-flight mark — for every superseded run).
    const backend = options.backend;
    const kept = result && !backend?.keepsCompact ? { ...result, body: expandBody(result.body) } : result;
    const shared = backend && reachable(e) ? backend.finished(e.keyId, e.fingerprint, kept ? { fingerprint: e.fingerprint, ...kept } : null) : undefined;
    const waiters = e.waiters;
    e.waiters = null;
    if (waiters) {
      waitingRetries -= waiters.length;
      for (const w of waiters) w();
    }
    // Waiters hold the entry itself, so an unreachable one can go at once.
    if (!reachable(e)) forget(e);
    prune(e.at_ms);
    return shared;
  }

  const settled = (e: Entry) =>
    new Promise<void>((resolve) => {
      waitingRetries++;
      (e.waiters ??= []).push(resolve);
    });

  const replay = (e: Pick<Entry, "status" | "headers" | "body">): Response => {
    const headers = new Headers();
    const h = e.headers!;
    for (let i = 0; i < h.length; i += 2) headers.set(h[i]!, h[i + 1]!);
    headers.set(REPLAYED_HEADER, "true");
    return new Response(expandBody(e.body!), { status: e.status, headers });
  };

  const keyReused = () =>
    gatewayError("idempotency_key_reused", "This Idempotency-Key was used with another request body or route in the last 10 minutes. Use a new key for a new request.");
  const keyInFlight = () => gatewayError("duplicate_request_id", "A request with this Idempotency-Key is still running. Its result is replayed once it has finished.");
  const backendDown = () =>
    gatewayError("coordinator_unavailable", "The gateway cannot reach its shared state right now, so it cannot tell whether this request is a retry. Retry shortly.", {
      retryAfterSeconds: 1,
    });

  /** The answer for a key another run holds (here or on another node), or null when it may run. */
  const heldKey = (held: { state: Entry["state"]; fingerprint: string } | SharedEntry | undefined, fingerprint: string, refuse: (error: GatewayError) => Response): Response | null => {
    if (!held || held.state === "failed") return null;
    if (held.fingerprint !== fingerprint) return refuse(keyReused());
    if (held.state === "in_flight") return refuse(keyInFlight());
    return replay(held as Pick<Entry, "status" | "headers" | "body">);
  };

  /** A retry of a body no run of this process knows: the backend's latest result, waiting for one in flight. */
  async function remoteLatest(backend: ReplayBackend, fingerprint: string): Promise<Response | null> {
    const until = options.now() + REMOTE_WAIT_MS;
    for (;;) {
      const shared = await backend.latest(fingerprint);
      if (shared === "unavailable" || shared === null) return null;
      if (shared.state === "succeeded") return replay(shared);
      if (options.now() >= until) return null;
      await Bun.sleep(REMOTE_POLL_MS);
    }
  }

  /**
   * Runs `start` as a new request, recording its result for later retries: kept once both the response
   * (status, headers) and a successful outcome are known, in either order.
   */
  async function runFresh(keyId: string | null, fingerprint: string, start: (tracker: RunTracker) => Promise<Response>): Promise<Response> {
    const entry = register(keyId, fingerprint);
    // No closure is made in this async function: one would keep its whole scope, `start` included —
    // and with it the buyer's request and prompt — alive for as long as the stream runs.
    const run = trackRun(entry);
    let response: Response;
    try {
      response = await start(run.tracker);
    } catch (error) {
      finish(entry, null);
      throw error;
    }
    run.responded(response);
    return response;
  }

  /** The run's tracker, and what to call with its response: the result is kept once both are known. */
  function trackRun(entry: Entry): { tracker: RunTracker; responded: (response: Response) => void } {
    let ok: boolean | null = null;
    // Only the kept headers of the response, not the response itself.
    let headers: string[] | null = null;
    const settle = (): void | Promise<void> => {
      // A failed run keeps nothing, so it need not wait for its response: a non-streaming request whose
      // buyer hung up never gets one, and its entry would stay in flight (never pruned) for good.
      if (ok === false) return finish(entry, null);
      if (ok === null || headers === null) return;
      const body = entry.recording?.kept();
      return finish(entry, body ? { status: 200, headers, body } : null);
    };
    const tracker: RunTracker = {
      record: (text) => entry.recording?.add(text),
      recordFilled: (template, hole) => entry.recording?.addFilled(template, hole),
      outcome(succeeded) {
        if (ok !== null) return;
        ok = succeeded;
        settle();
      },
      result(response) {
        if (ok !== null) return;
        ok = true;
        headers = keptHeaders(response);
        return settle();
      },
    };
    const responded = (response: Response) => {
      if (response.status !== 200 || response.body === null) {
        finish(entry, null);
        return;
      }
      headers = keptHeaders(response);
      settle();
    };
    return { tracker, responded };
  }

  return {
    /**
     * Answers one buyer request: a replay, a refusal (409 / 422), or `start` run as a new request.
     * `refuse` renders a refusal in the entrypoint's envelope.
     */
    async run(identity: ReplayIdentity, start: (tracker: RunTracker) => Promise<Response>, refuse: (error: GatewayError) => Response): Promise<Response> {
      const now = options.now();
      prune(now);
      const fingerprint = `${identity.account_id}\u0000${identity.route}\u0000${createHash("sha256").update(identity.body).digest("base64")}`;
      if (identity.idempotencyKey !== null) {
        if (identity.idempotencyKey.length === 0 || identity.idempotencyKey.length > MAX_KEY_LENGTH) {
          return refuse(gatewayError("invalid_request", `Idempotency-Key must be 1 to ${MAX_KEY_LENGTH} characters.`, { param: "Idempotency-Key" }));
        }
        const keyId = `${identity.account_id}\u0000${identity.idempotencyKey}`;
        const answered = heldKey(live(byKey.get(keyId), now), fingerprint, refuse);
        if (answered) return answered;
        const backend = options.backend;
        if (backend) {
          const shared = await backend.claim(keyId, fingerprint);
          if (shared === "unavailable") return refuse(backendDown());
          // Another request of this process may have taken the key while the backend answered.
          const again = heldKey(live(byKey.get(keyId), options.now()), fingerprint, refuse) ?? (shared ? heldKey(shared, fingerprint, refuse) : null);
          if (again) return again;
        }
        return runFresh(keyId, fingerprint, start);
      }
      if (identity.retryMarked) {
        const latest = live(byBody.get(fingerprint), now);
        if (latest?.state === "in_flight") await settled(latest);
        if (latest?.state === "succeeded" && latest.body) return replay(latest);
        if (!latest && options.backend) {
          const replayed = await remoteLatest(options.backend, fingerprint);
          if (replayed) return replayed;
        }
      }
      options.backend?.started(fingerprint);
      return runFresh(null, fingerprint, start);
    },
    /** Retries waiting now for the result of an identical request in flight (metrics and tests). */
    waitingRetries: () => waitingRetries,
    /** Results held now (diagnostics and tests). */
    size: () => entries.size,
    /** In-flight results whose body is still being copied (diagnostics and tests). */
    recordings: () => {
      let n = 0;
      for (const e of entries.values()) if (e.recording) n++;
      return n;
    },
    /** Approximate bytes held: bodies plus a per-entry estimate (diagnostics). */
    footprintBytes: () => storedBytes + entries.size * ENTRY_OVERHEAD_BYTES,
  };
}

export type ReplayCache = ReturnType<typeof createReplayCache>;

function keptHeaders(response: Response): string[] {
  const headers: string[] = [];
  for (const name of KEPT_HEADERS) {
    const value = response.headers.get(name);
    if (value !== null) headers.push(name, value);
  }
  return headers;
}

/** Marks a templated piece in a recording: bytes UTF-8 text never holds. */
const FILLED = 0xff;
const FILLED_END = 0xfe;
/** The first byte of a compact body: a whole one is UTF-8 text, which never starts with it. */
const COMPACT = 0xff;
/** Templates a recording tells apart (one index byte, below the markers). */
const MAX_TEMPLATES = 0xfe;

/**
 * A response body as its responder writes it, in one growing buffer rather than a list of the
 * responder's pieces (each its own string or Uint8Array), copied once, to its exact length, at the end.
 * A templated piece is kept as FILLED, its template's index, the hole's UTF-8 and FILLED_END — about
 * 20 bytes for a chat stream's delta event instead of ~220 — and kept so (`kept`) until replayed.
 */
class Recording {
  private buffer = Buffer.allocUnsafeSlow(0);
  private length = 0;
  private templates: BodyTemplate[] | null = null;

  /** Room for `units` more UTF-16 code units (at most 3 UTF-8 bytes each) and `extra` bytes. */
  private reserve(units: number, extra: number): void {
    const needed = this.length + units * 3 + extra;
    if (needed > this.buffer.byteLength) {
      const grown = Buffer.allocUnsafeSlow(Math.max(this.buffer.byteLength * 2, needed, 1024));
      this.buffer.copy(grown, 0, 0, this.length);
      this.buffer = grown;
    }
  }

  add(text: string): void {
    // With this room `write` never cuts the text short.
    this.reserve(text.length, 0);
    this.length += this.buffer.write(text, this.length);
  }

  addFilled(template: BodyTemplate, hole: string): void {
    const templates = (this.templates ??= []);
    let index = templates.indexOf(template);
    if (index < 0) {
      if (templates.length === MAX_TEMPLATES) {
        this.add(template.prefix + hole + template.suffix);
        return;
      }
      index = templates.push(template) - 1;
    }
    this.reserve(hole.length, 3);
    const b = this.buffer;
    b[this.length++] = FILLED;
    b[this.length++] = index;
    this.length += b.write(hole, this.length);
    b[this.length++] = FILLED_END;
  }

  /**
   * The body as kept: its exact bytes when nothing was templated, else the compact form — COMPACT,
   * each template's prefix and suffix (a 4-byte length before each), then the recording as it is.
   * Expanded only when replayed (`expandBody`), not at every stream's end.
   */
  kept(): ArrayBuffer {
    const recorded = this.buffer.subarray(0, this.length);
    if (this.templates === null) return new Uint8Array(recorded).buffer;
    const parts = this.templates.flatMap((t) => [Buffer.from(t.prefix), Buffer.from(t.suffix)]);
    let size = 2 + this.length;
    for (const p of parts) size += 4 + p.length;
    const out = Buffer.allocUnsafeSlow(size);
    out[0] = COMPACT;
    out[1] = this.templates.length;
    let at = 2;
    for (const p of parts) {
      at = out.writeUInt32LE(p.length, at);
      at += p.copy(out, at);
    }
    recorded.copy(out, at);
    return out.buffer;
  }
}

/** A kept body made whole (a new buffer, also when it was whole already). */
export function expandBody(kept: ArrayBuffer): ArrayBuffer {
  const bytes = Buffer.from(kept);
  if (bytes[0] !== COMPACT) return kept.slice(0);
  const parts: Buffer[] = [];
  let at = 2;
  for (let i = 0; i < bytes[1]! * 2; i++) {
    const length = bytes.readUInt32LE(at);
    parts.push(bytes.subarray(at + 4, at + 4 + length));
    at += 4 + length;
  }
  const recorded = bytes.subarray(at);
  const pieces: Uint8Array[] = [];
  at = 0;
  for (let mark = recorded.indexOf(FILLED); mark >= 0; mark = recorded.indexOf(FILLED, at)) {
    const index = recorded[mark + 1]! * 2;
    const end = recorded.indexOf(FILLED_END, mark + 2);
    pieces.push(recorded.subarray(at, mark), parts[index]!, recorded.subarray(mark + 2, end), parts[index + 1]!);
    at = end + 1;
  }
  pieces.push(recorded.subarray(at));
  const whole = Buffer.concat(pieces);
  // Buffer.concat may return a view of a shared pool: the body gets a buffer of its own.
  return whole.byteOffset === 0 && whole.byteLength === whole.buffer.byteLength ? whole.buffer : new Uint8Array(whole).buffer;
}
