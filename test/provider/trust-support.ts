// Test support for the provider's receipts and catalog: the gateway's side of an attempt built the way
// the gateway builds it (a persisted route snapshot, `job.route` from it), the delivered record
// computed independently (test/receipts/independent-signer.ts, no src/receipts hashing), and a signed
// catalog feed served over loopback HTTP.
import { generateKeyPairSync, randomBytes, type KeyObject } from "node:crypto";
import {
  buildCatalogBody,
  encodeCatalogBody,
  signCatalogBody,
  type CatalogModel,
} from "../../src/catalog/index.ts";
import { jobRouteOf, promptHash, promptTokenBound, snapshotDigest, verifyReceipt, type RouteSnapshot } from "../../src/receipts/index.ts";
import type { ReceiptJudgement } from "../../src/receipts/index.ts";
import { rawPublicKey } from "../../src/wire/handshake.ts";
import type { ChunkFrame, JobFrame, TerminalState } from "../../src/wire/frames.ts";
import type { ProviderKey } from "../../src/provider/keys.ts";
import { outputHashOf, type ToolCall } from "../receipts/independent-signer.ts";
import { makeJob } from "./fake-gateway.ts";

/** The wall clock the runtime is given in receipt tests (fixed: timestamps are checked exactly). */
export const CLOCK_MS = 1_760_000_000_000;

export interface RoutedJob {
  job: JobFrame;
  snapshot: RouteSnapshot;
  digest: string;
}

/** A job whose `route` comes from a snapshot persisted "before dispatch", as the gateway does it. */
export function routedJob(options: { key: ProviderKey; providerId: string; modelHash: string; overrides?: Partial<JobFrame> }): RoutedJob {
  const draft = makeJob(options.overrides);
  const snapshot: RouteSnapshot = {
    snapshot_version: 1,
    request_id: draft.request_id,
    attempt_n: draft.attempt_n,
    provider_id: options.providerId,
    provider_public_key: options.key.publicKeyBase64,
    model_id: draft.model_id,
    account_scope: "5c".repeat(32),
    catalog_id: "cat_20260101000000_0123456789ab",
    catalog_body_digest: "d1".repeat(32),
    expected_catalog_model_hash: options.modelHash,
    route_snapshot_mode: "enforce",
    route_snapshot_policy_version: "gw-settlement-v1",
    prompt_hash: promptHash(draft),
    prompt_token_bound: promptTokenBound(draft.messages, draft.params.tools),
    max_tokens: draft.params.max_tokens,
    rate_card_row: "default",
    prompt_credits_per_million: 1_000_000,
    completion_credits_per_million: 1_000_000,
    provider_share_bps: 9000,
    request_started_at_unix_ms: CLOCK_MS - 1_000,
    routed_at_unix_ms: CLOCK_MS - 900,
  };
  const digest = snapshotDigest(snapshot);
  return { job: { ...draft, route: jobRouteOf(snapshot, digest) }, snapshot, digest };
}

/** Tool calls assembled from deltas by docs/receipts.md's rule, written out here rather than imported. */
function assemble(chunks: readonly ChunkFrame[]): ToolCall[] | null {
  const calls = new Map<number, ToolCall>();
  for (const chunk of chunks) {
    for (const d of chunk.tool_calls ?? []) {
      const call = calls.get(d.index) ?? { index: d.index, id: null, name: null, arguments: "" };
      if (call.id === null && d.id !== undefined) call.id = d.id;
      if (call.name === null && d.name !== undefined) call.name = d.name;
      call.arguments += d.arguments ?? "";
      calls.set(d.index, call);
    }
  }
  return calls.size === 0 ? null : [...calls.values()].sort((a, b) => a.index - b.index);
}

/** What the gateway delivered when it relayed exactly `relayed` (its own record, hashed independently). */
export function deliveredRecord(relayed: readonly ChunkFrame[], terminal_state: TerminalState, finish_reason: string | null) {
  const content = relayed.map((c) => c.content ?? "").join("");
  const end = Buffer.byteLength(content, "utf8");
  return {
    output_hash: outputHashOf({ content, finish_reason, start: 0, end, terminal_state, tool_calls: assemble(relayed) }),
    start_byte: 0,
    end_byte: end,
    tokens: relayed.reduce((sum, c) => sum + c.tokens, 0),
    terminal_state,
  };
}

/** The gateway's verdict on `envelope` for this attempt (src/receipts' verifier, what settlement runs). */
export function judge(
  routed: RoutedJob,
  envelope: string,
  key: ProviderKey,
  acceptedModelHash: string,
  delivered: ReturnType<typeof deliveredRecord>,
  arrivalMs = CLOCK_MS,
): ReceiptJudgement {
  return verifyReceipt({
    envelope,
    sessionPublicKey: key.publicKeyRaw,
    snapshot: routed.snapshot,
    snapshotDigest: routed.digest,
    acceptedModelHash,
    delivered,
    promptTokenBound: routed.snapshot.prompt_token_bound,
    requestStartMs: routed.snapshot.request_started_at_unix_ms,
    arrivalMs,
    expected: {
      request_id: routed.snapshot.request_id,
      attempt_n: routed.snapshot.attempt_n,
      provider_id: routed.snapshot.provider_id,
      account_scope: routed.snapshot.account_scope,
    },
    pendingDeadlineMs: arrivalMs + 300_000,
  });
}

// ---- a signed catalog feed over HTTP ----

export interface CatalogFeedStub {
  readonly publicKeyRaw: Uint8Array;
  readonly publicKeyBase64: string;
  /** Paths requested so far, in order. */
  readonly requests: string[];
  /** Signs and serves a new feed with these models, issued at `issuedAtMs` (default: later than the last). */
  publish(models: readonly CatalogModel[], options?: { issuedAtMs?: number; signer?: KeyObject }): { bytes: Uint8Array; signature: string };
  /** Serves exactly these bytes and signature (e.g. an old feed: a rollback). */
  serve(feed: { bytes: Uint8Array; signature: string }): void;
  /** Serve 404 for the feed (no catalog yet). */
  unpublish(): void;
  /** The operator key `/v1/catalog/pubkey` answers with (default: the signing key's). */
  servePublicKey(raw: Uint8Array): void;
  /** Handler for FakeGatewayOptions.http. */
  handle(request: Request): Response | undefined;
}

export function catalogModel(model_id: string, model_hash: string): CatalogModel {
  return { model_id, model_hash, hash_scope: "gguf-file-v1", min_ram_gb: 0, rate_card_row: "default", capabilities: { tools: false, structured_output: false } };
}

export function newOperatorKey(): { privateKey: KeyObject; raw: Uint8Array } {
  const { privateKey } = generateKeyPairSync("ed25519");
  return { privateKey, raw: rawPublicKey(privateKey) };
}

export function startCatalogFeed(): CatalogFeedStub {
  const operator = newOperatorKey();
  let current: { bytes: Uint8Array; signature: string } | null = null;
  let servedKey = operator.raw;
  let lastIssued = Date.UTC(2026, 0, 1);
  const requests: string[] = [];
  return {
    publicKeyRaw: operator.raw,
    publicKeyBase64: Buffer.from(operator.raw).toString("base64"),
    requests,
    publish(models, options = {}) {
      const issued_at_ms = options.issuedAtMs ?? (lastIssued += 60_000);
      const body = buildCatalogBody({ models, issued_at_ms, valid_for_ms: 365 * 86_400_000, random: (n) => new Uint8Array(randomBytes(n)) });
      const bytes = encodeCatalogBody(body);
      current = { bytes, signature: signCatalogBody(bytes, options.signer ?? operator.privateKey) };
      return current;
    },
    serve(feed) {
      current = feed;
    },
    unpublish() {
      current = null;
    },
    servePublicKey(raw) {
      servedKey = raw;
    },
    handle(request) {
      const path = new URL(request.url).pathname;
      requests.push(path);
      if (path === "/v1/catalog/pubkey") return new Response(Buffer.from(servedKey).toString("base64"), { headers: { "content-type": "text/plain" } });
      if (path !== "/v1/catalog" && path !== "/v1/catalog.sig") return undefined;
      if (current === null) return new Response('{"error":{"code":"not_found"}}', { status: 404 });
      return path === "/v1/catalog"
        ? new Response(current.bytes, { headers: { "content-type": "application/json" } })
        : new Response(current.signature, { headers: { "content-type": "text/plain" } });
    },
  };
}
