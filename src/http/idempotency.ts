// Retries replayed instead of re-run (DESIGN §7). A request is a new request unless it says it is a
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
// Results live in process memory only, bounded in bytes and in time: output text is never written to
// disk for this, and a retry arrives within seconds of the failure it retries. A restart forgets them
// (docs/quotas.md, "Retries": a retry that crosses a restart runs again). Several nodes would keep
// these in Redis, or route an account's requests to one node (DESIGN §8).
import { createHash } from "node:crypto";
import { gatewayError, type GatewayError } from "./errors.ts";

export const REPLAY_WINDOW_MS = 10 * 60_000;
/** Marks a replayed response (the same header name as Stripe's: clients that know it can log it). */
export const REPLAYED_HEADER = "idempotent-replayed";
/** Longest Idempotency-Key accepted (Stripe's limit). */
const MAX_KEY_LENGTH = 255;

/** Response headers a replay carries over from the first result. */
const KEPT_HEADERS = ["content-type", "cache-control", "x-request-id", "x-accel-buffering"];

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

/** What a fresh run tells the cache about its outcome: the responder's success, or anything else. */
export interface RunTracker {
  outcome(ok: boolean): void;
}

interface StoredResult {
  status: number;
  headers: [string, string][];
  body: Uint8Array;
}

interface Entry {
  seq: number;
  account_id: string;
  fingerprint: string;
  idempotencyKey: string | null;
  state: "in_flight" | "succeeded" | "failed";
  result: StoredResult | null;
  at_ms: number;
  done: Promise<void>;
  settle: () => void;
}

export interface ReplayCacheOptions {
  now: () => number;
  windowMs?: number;
  /** Total bytes of stored results kept; the oldest go first. Default 32 MiB. */
  maxBytes?: number;
}

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
  // Insertion order = creation order: pruning walks from the oldest.
  const entries = new Map<number, Entry>();
  const byKey = new Map<string, Entry>();
  const byBody = new Map<string, Entry>();
  let seq = 0;
  let storedBytes = 0;

  const keyOf = (account_id: string, key: string) => `${account_id}\u0000${key}`;
  const bodyKeyOf = (account_id: string, fingerprint: string) => `${account_id}\u0000${fingerprint}`;

  function forget(e: Entry): void {
    entries.delete(e.seq);
    if (e.result) storedBytes -= e.result.body.byteLength;
    if (e.idempotencyKey !== null && byKey.get(keyOf(e.account_id, e.idempotencyKey)) === e) byKey.delete(keyOf(e.account_id, e.idempotencyKey));
    if (byBody.get(bodyKeyOf(e.account_id, e.fingerprint)) === e) byBody.delete(bodyKeyOf(e.account_id, e.fingerprint));
  }

  /** Drops finished entries older than the window, then the oldest results while over the byte budget. */
  function prune(now: number): void {
    for (const e of entries.values()) {
      if (e.at_ms > now - windowMs) break;
      if (e.state !== "in_flight") forget(e);
    }
    for (const e of entries.values()) {
      if (storedBytes <= maxBytes) break;
      if (e.state === "succeeded") forget(e);
    }
  }

  const live = (e: Entry | undefined, now: number): Entry | undefined =>
    e && (e.state === "in_flight" || e.at_ms > now - windowMs) ? e : undefined;

  function register(identity: ReplayIdentity, fingerprint: string): Entry {
    let settle!: () => void;
    const done = new Promise<void>((r) => (settle = r));
    const e: Entry = {
      seq: ++seq,
      account_id: identity.account_id,
      fingerprint,
      idempotencyKey: identity.idempotencyKey,
      state: "in_flight",
      result: null,
      at_ms: options.now(),
      done,
      settle,
    };
    entries.set(e.seq, e);
    if (e.idempotencyKey !== null) byKey.set(keyOf(e.account_id, e.idempotencyKey), e);
    byBody.set(bodyKeyOf(e.account_id, fingerprint), e);
    return e;
  }

  function finish(e: Entry, result: StoredResult | null): void {
    if (e.state !== "in_flight") return;
    e.state = result ? "succeeded" : "failed";
    e.result = result;
    e.at_ms = options.now();
    // Re-inserted so creation order stays completion order for pruning.
    entries.delete(e.seq);
    entries.set(e.seq, e);
    if (result) storedBytes += result.body.byteLength;
    e.settle();
    prune(e.at_ms);
  }

  function replay(e: Entry): Response {
    const r = e.result!;
    const headers = new Headers(r.headers);
    headers.set(REPLAYED_HEADER, "true");
    return new Response(r.body.slice(), { status: r.status, headers });
  }

  /** Runs `start` as a new request, recording its result for later retries. */
  async function runFresh(identity: ReplayIdentity, fingerprint: string, start: (tracker: RunTracker) => Promise<Response>): Promise<Response> {
    const entry = register(identity, fingerprint);
    let ok = false;
    const tracker: RunTracker = { outcome: (succeeded) => (ok = succeeded) };
    let response: Response;
    try {
      response = await start(tracker);
    } catch (error) {
      finish(entry, null);
      throw error;
    }
    if (response.status !== 200 || response.body === null) {
      finish(entry, null);
      return response;
    }
    const headers: [string, string][] = [];
    for (const name of KEPT_HEADERS) {
      const value = response.headers.get(name);
      if (value !== null) headers.push([name, value]);
    }
    const store = (body: Uint8Array | null) => finish(entry, ok && body ? { status: 200, headers, body } : null);
    if (!(response.headers.get("content-type") ?? "").startsWith("text/event-stream")) {
      // A JSON body is complete by now: copy it without touching the response the buyer gets.
      response
        .clone()
        .arrayBuffer()
        .then((b) => store(new Uint8Array(b)), () => store(null));
      return response;
    }
    return new Response(recordingStream(response.body, store), { status: response.status, headers: response.headers });
  }

  return {
    /**
     * Answers one buyer request: a replay, a refusal (409 / 422), or `start` run as a new request.
     * `refuse` renders a refusal in the entrypoint's envelope.
     */
    async run(identity: ReplayIdentity, start: (tracker: RunTracker) => Promise<Response>, refuse: (error: GatewayError) => Response): Promise<Response> {
      const now = options.now();
      prune(now);
      const fingerprint = `${identity.route}\u0000${createHash("sha256").update(identity.body).digest("hex")}`;
      if (identity.idempotencyKey !== null) {
        if (identity.idempotencyKey.length === 0 || identity.idempotencyKey.length > MAX_KEY_LENGTH) {
          return refuse(gatewayError("invalid_request", `Idempotency-Key must be 1 to ${MAX_KEY_LENGTH} characters.`, { param: "Idempotency-Key" }));
        }
        const first = live(byKey.get(keyOf(identity.account_id, identity.idempotencyKey)), now);
        if (first && first.state !== "failed") {
          if (first.fingerprint !== fingerprint) {
            return refuse(
              gatewayError("idempotency_key_reused", "This Idempotency-Key was used with another request body or route in the last 10 minutes. Use a new key for a new request."),
            );
          }
          if (first.state === "in_flight") {
            return refuse(gatewayError("duplicate_request_id", "A request with this Idempotency-Key is still running. Its result is replayed once it has finished."));
          }
          return replay(first);
        }
        return runFresh(identity, fingerprint, start);
      }
      if (identity.retryMarked) {
        const latest = live(byBody.get(bodyKeyOf(identity.account_id, fingerprint)), now);
        if (latest?.state === "in_flight") await latest.done;
        if (latest?.state === "succeeded" && latest.result) return replay(latest);
      }
      return runFresh(identity, fingerprint, start);
    },
    /** Results held now (diagnostics and tests). */
    size: () => entries.size,
  };
}

export type ReplayCache = ReturnType<typeof createReplayCache>;

/**
 * Passes `body` through unchanged while keeping a copy; `done` gets the bytes once it ended normally,
 * or null when the buyer went away first. A cancel is passed on, so the responder still sees the buyer
 * leave.
 */
function recordingStream(body: ReadableStream<Uint8Array>, done: (bytes: Uint8Array | null) => void): ReadableStream<Uint8Array> {
  const reader = body.getReader();
  const parts: Uint8Array[] = [];
  let length = 0;
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      try {
        const { value, done: ended } = await reader.read();
        if (ended) {
          controller.close();
          const bytes = new Uint8Array(length);
          let at = 0;
          for (const p of parts) {
            bytes.set(p, at);
            at += p.byteLength;
          }
          done(bytes);
          return;
        }
        parts.push(value);
        length += value.byteLength;
        controller.enqueue(value);
      } catch (error) {
        done(null);
        controller.error(error);
      }
    },
    cancel(reason) {
      done(null);
      return reader.cancel(reason);
    },
  });
}

