// The gateway judges a receipt's signature off the main thread (WebCrypto), so its verdict reaches
// the settlement in a later turn than the receipt. These tests drive one attempt at a time through
// the gateway's settlement edge (src/gateway/settlements.ts) over a real SQLite store and hold the
// orderings that opens: the receipt riding on `end`, the pending deadline firing while a verdict is
// on its way, an attempt already settled when it comes, duplicate receipts, stop() with a
// verification in flight and the restart after it, and both settlement modes.
import { afterEach, describe, expect, spyOn, test } from "bun:test";
import { Database } from "bun:sqlite";
import { rmSync } from "node:fs";
import { join } from "node:path";
import type { CatalogState } from "../../src/catalog/index.ts";
import { createSettlements, type Settlements } from "../../src/gateway/settlements.ts";
import type { SettlementMode } from "../../src/ledger/charges.ts";
import { buildRateCard } from "../../src/ledger/index.ts";
import { inlineJudge, type ReceiptJudge } from "../../src/receipts/judge.ts";
import type { Log } from "../../src/log.ts";
import { createReceiptSigner, deliveredPrefixOf } from "../../src/receipts/index.ts";
import { asyncStore } from "../../src/store/asyncStore.ts";
import { openStore, type Store } from "../../src/store/index.ts";
import { decodeGatewayFrame } from "../../src/wire/codec.ts";
import type { JobRoute, SettledFrame } from "../../src/wire/frames.ts";
import { catalogModel, modelHash, tempDir, waitFor } from "../support/harness.ts";
import { keyFromSeed, rawPublic } from "../receipts/independent-signer.ts";
import * as jcs from "../../src/receipts/jcs.ts";

const MODEL = "async-model";
const PROVIDER = "prov-async";
const providerKey = keyFromSeed(new Uint8Array(32).fill(0x61));
const providerPublicKey = rawPublic(providerKey);
const signer = createReceiptSigner(providerKey, PROVIDER);
const CHUNKS = [
  { content: "Async ", tokens: 2 },
  { content: "verdicts.", tokens: 3 },
];
const INPUT_TOKENS = 5;
const messages = [{ content: "Judge me later.", role: "user" as const }];
const PROMPT_BOUND = Buffer.byteLength(messages[0]!.content) + 8 + 16;
const flipSignatureChar = (env: string) => env.slice(0, -10) + (env.at(-10) === "A" ? "B" : "A") + env.slice(-9);

const catalog: CatalogState = {
  seq: 1,
  catalog_id: "cat_async",
  body_digest: "c".repeat(64),
  body: { version: 1, catalog_id: "cat_async", issued_at: "2026-01-01T00:00:00Z", expires_at: "2099-01-01T00:00:00Z", models: [catalogModel(MODEL)] },
  bytes: new Uint8Array(0),
  signature: "",
  issued_at_ms: 0,
  expires_at_ms: Number.MAX_SAFE_INTEGER,
  models: new Map([[MODEL, catalogModel(MODEL)]]),
};

interface TrackedJudge extends ReceiptJudge {
  /** Resolves once every receipt handed to this judge has had its verdict delivered. */
  idle(): Promise<void>;
}

/** The gateway's inline judge (the signature checked by WebCrypto, later), counting verdicts to come. */
function trackedJudge(): TrackedJudge {
  let inFlight = 0;
  const waiters: (() => void)[] = [];
  return {
    judge(input, done) {
      inFlight++;
      return inlineJudge.judge(input, (result) => {
        try {
          done(result);
        } finally {
          if (--inFlight === 0) for (const wake of waiters.splice(0)) wake();
        }
      });
    },
    stop: () => inlineJudge.stop(),
    idle: () => (inFlight === 0 ? Promise.resolve() : new Promise((resolve) => waiters.push(resolve))),
  };
}

interface Rig {
  path: string;
  store: Store;
  settlements: Settlements;
  accountId: string;
  /** `settled` frames sent to the provider (after their commit). */
  settled: SettledFrame[];
  warnings: { event: string; reason: unknown }[];
  /** Receipt events sent to settlement actors (and `attempt.ended` saying a verdict is due), with the actor's status when it got them. */
  receiptEvents: { type: string; status: string }[];
  /** The settlement edge's clock (the machine's pending deadline runs on real timers). */
  clock: { ms: number };
  /** The rig's judge: the gateway's inline judge, counting the verdicts still to come. */
  judge: TrackedJudge;
  /** Stops the settlements, then closes the store (idempotent). */
  close(): void;
}

const cleanups: (() => void)[] = [];
afterEach(() => {
  for (const c of cleanups.splice(0).reverse()) c();
});

/** A gateway's settlement edge over a real SQLite file (a new one, or `path` to reopen one). */
function openRig(options: { mode?: SettlementMode; pendingDeadlineMs?: number; path?: string } = {}): Rig {
  let path = options.path;
  if (path === undefined) {
    const dir = tempDir("gw-async-verdict-");
    cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
    path = join(dir, "gateway.db");
  }
  const store = openStore(path, { groupCommit: true });
  const card = buildRateCard();
  if (!card.ok) throw new Error(card.message);
  const settled: SettledFrame[] = [];
  const warnings: Rig["warnings"] = [];
  const log: Log = { debug() {}, info() {}, warn: (event, fields) => void warnings.push({ event, reason: fields?.reason }), error() {} };
  const receiptEvents: Rig["receiptEvents"] = [];
  const clock = { ms: Date.now() };
  const judge = trackedJudge();
  const settlements = createSettlements({
    judge,
    store: asyncStore(store),
    now: () => clock.ms,
    mode: options.mode ?? "enforce",
    pendingDeadlineMs: options.pendingDeadlineMs ?? 300_000,
    gatewaySecret: new Uint8Array(32).fill(7),
    catalog: () => catalog,
    rateCard: () => card.card,
    sendToProvider: (_id, bytes) => {
      const frame = decodeGatewayFrame(bytes);
      if (frame.ok && frame.frame.type === "settled") settled.push(frame.frame);
    },
    log,
    inspect: (e) => {
      if (e.type !== "@xstate.event") return;
      const status = e.actorRef.getSnapshot().status;
      if (e.event.type.startsWith("receipt.")) receiptEvents.push({ type: e.event.type, status });
      else if (e.event.type === "attempt.ended" && e.event.verdictDue) receiptEvents.push({ type: "attempt.ended (verdict due)", status });
    },
  });
  let closed = false;
  const close = () => {
    if (closed) return;
    closed = true;
    settlements.stop();
    store.close();
  };
  cleanups.push(close);
  const accounts = store.listAccounts();
  const accountId = accounts[0]?.account_id ?? store.createAccount({ tier: "free" }).account_id;
  return { path, store, settlements, accountId, settled, warnings, receiptEvents, clock, judge, close };
}

let requests = 0;

/** Opens an attempt, relays CHUNKS, and returns what a receipt for it needs. */
function startAttempt(rig: Rig): { requestId: string; route: JobRoute } {
  const requestId = `req_async_${++requests}`;
  const day = new Date(rig.clock.ms).toISOString().slice(0, 10);
  expect(rig.store.reserve({ request_id: requestId, account_id: rig.accountId, payer: "promotion", day, tokens: 1000, credits: 1000 }).ok).toBe(true);
  const route = rig.settlements.openAttempt({
    requestId,
    attemptN: 0,
    providerId: PROVIDER,
    providerPublicKey,
    chat: { model: MODEL, messages, params: { max_tokens: 16 }, stream: false, includeUsage: false },
    accountId: rig.accountId,
    payer: "promotion",
    requestStartedAtMs: rig.clock.ms,
    promptBound: PROMPT_BOUND,
  });
  if (route === null) throw new Error("attempt not opened");
  expect(rig.settlements.accepted(requestId, 0, modelHash(MODEL))).toBe(true);
  return { requestId, route };
}

/** Relays CHUNKS (or none) to the buyer. */
function deliver(rig: Rig, requestId: string, chunks = CHUNKS): void {
  const relay = rig.settlements.relayerFor(requestId, 0);
  chunks.forEach((c, seq) => relay({ type: "chunk", request_id: requestId, attempt_n: 0, seq, ...c }));
}

/** The honest receipt for an attempt that delivered `chunks`. */
function receiptFor(rig: Rig, a: { requestId: string; route: JobRoute }, chunks = CHUNKS): string {
  return signer.sign({
    job: { request_id: a.requestId, attempt_n: 0, model_id: MODEL, route: a.route },
    model_hash: modelHash(MODEL),
    prefix: deliveredPrefixOf(chunks, "normal_done", "stop"),
    observed_input_tokens: INPUT_TOKENS,
    terminal_state_ts_unix_ms: rig.clock.ms,
    issued_at_unix_ms: rig.clock.ms,
  });
}

/** The provider's `end` (carrying `receipt` when given), then the gateway releases the attempt. */
function endAndRelease(rig: Rig, requestId: string, receipt: string | undefined, tokens = 5): void {
  rig.settlements.endReceived(PROVIDER, {
    type: "end",
    request_id: requestId,
    attempt_n: 0,
    terminal_state: "normal_done",
    finish_reason: "stop",
    usage: { input_tokens: INPUT_TOKENS, output_tokens: tokens },
    ...(receipt === undefined ? {} : { receipt }),
  });
  rig.settlements.released(requestId, 0);
  rig.settlements.requestEnded(requestId);
}

async function settledRow(rig: Rig, requestId: string) {
  await waitFor(() => rig.store.getSettlement(requestId, 0)?.label !== "pending", 5000, `${requestId} settled`);
  return rig.store.getSettlement(requestId, 0)!;
}

/** Waits until every receipt's verdict has come, then until the group commit they caused has run. */
async function settle(rig: Rig): Promise<void> {
  await rig.judge.idle();
  await new Promise((resolve) => setImmediate(resolve));
  rig.store.flushCommits();
}

/** Receipts the store logged for an attempt, by disposition (the store has no reader: read the table). */
function dispositions(rig: Rig, requestId: string): string[] {
  rig.store.flushCommits();
  const db = new Database(rig.path, { readonly: true });
  try {
    const rows = db.query("SELECT disposition FROM receipts_received WHERE request_id = ? ORDER BY rowid").all(requestId) as { disposition: string }[];
    return rows.map((r) => r.disposition);
  } finally {
    db.close();
  }
}

const CHARGE = { billed_prompt_tokens: INPUT_TOKENS, billed_completion_tokens: 5, debit_credits: 10, provider_credits: 9, platform_credits: 1 };

describe("a receipt's verdict arrives after the receipt", () => {
  test("receipt with `end`: pending (delivered record written) until the signature is checked, then verified", async () => {
    const rig = openRig();
    const a = startAttempt(rig);
    deliver(rig, a.requestId);
    endAndRelease(rig, a.requestId, receiptFor(rig, a));
    // Same turn: every other rule passed, the signature is still being checked.
    const waiting = rig.store.getSettlement(a.requestId, 0)!;
    expect(waiting.label).toBe("pending");
    expect(waiting.delivered).toMatchObject({ end_byte: 15, tokens: 5, terminal_state: "normal_done", reported_input_tokens: INPUT_TOKENS });
    expect(rig.settled).toEqual([]);

    const row = await settledRow(rig, a.requestId);
    expect(row).toMatchObject({ label: "verified", reason: null, ...CHARGE });
    expect(row.delivered).toEqual(waiting.delivered);
    expect(row.receipt).not.toBeNull();
    await waitFor(() => rig.settled.length === 1);
    expect(rig.settled[0]).toMatchObject({ request_id: a.requestId, label: "verified", provider_credits: 9 });
    expect(rig.store.getReservation(a.requestId)).toMatchObject({ state: "finalised", used_credits: 10 });
  });

  test("a forged receipt with `end` → bad_signature, uncharged", async () => {
    const rig = openRig();
    const a = startAttempt(rig);
    deliver(rig, a.requestId);
    endAndRelease(rig, a.requestId, flipSignatureChar(receiptFor(rig, a)));
    expect(rig.store.getSettlement(a.requestId, 0)!.label).toBe("pending");
    expect(await settledRow(rig, a.requestId)).toMatchObject({ label: "quarantined", reason: "bad_signature", debit_credits: 0 });
    expect(rig.warnings).toEqual([{ event: "receipt_quarantined", reason: "bad_signature" }]);
    expect(rig.store.getReservation(a.requestId)).toMatchObject({ state: "released", used_credits: 0 });
  });

  test("a receipt decided before its signature (malformed) settles with `end` at once, delivered record included", () => {
    const rig = openRig();
    const a = startAttempt(rig);
    deliver(rig, a.requestId);
    endAndRelease(rig, a.requestId, "not-an-envelope");
    const row = rig.store.getSettlement(a.requestId, 0)!;
    expect(row).toMatchObject({ label: "quarantined", reason: "malformed", debit_credits: 0 });
    expect(row.delivered).toMatchObject({ end_byte: 15, tokens: 5, reported_input_tokens: INPUT_TOKENS });
    expect(row.pending_deadline_at_ms).toBe(rig.clock.ms + 300_000);
  });

  test("a late `receipt` frame (after the release) is judged the same way", async () => {
    const rig = openRig();
    const a = startAttempt(rig);
    deliver(rig, a.requestId);
    endAndRelease(rig, a.requestId, undefined);
    rig.clock.ms += 1000;
    rig.settlements.receiptArrived(PROVIDER, a.requestId, 0, receiptFor(rig, a));
    expect(rig.store.getSettlement(a.requestId, 0)!.label).toBe("pending");
    expect(await settledRow(rig, a.requestId)).toMatchObject({ label: "verified", receipt_received_at_ms: rig.clock.ms, ...CHARGE });
  });

  test("a receipt after the deadline is `late` at once, whatever its signature", () => {
    const rig = openRig({ pendingDeadlineMs: 1000 });
    const a = startAttempt(rig);
    deliver(rig, a.requestId);
    endAndRelease(rig, a.requestId, undefined);
    // The edge's clock is past the deadline; the machine's own timer has not fired yet.
    rig.clock.ms += 1001;
    rig.settlements.receiptArrived(PROVIDER, a.requestId, 0, receiptFor(rig, a));
    expect(rig.store.getSettlement(a.requestId, 0)).toMatchObject({ label: "quarantined", reason: "late" });
  });
});

describe("orderings", () => {
  test("a receipt at the deadline with `end` (in time) is judged, not preempted by the deadline's timer", async () => {
    // Deadline 0: the machine's timer is due as soon as the attempt is pending, while the receipt's
    // signature is still being checked (which fires first is up to the event loop; the machine
    // tests below fix the order).
    const rig = openRig({ pendingDeadlineMs: 0 });
    const a = startAttempt(rig);
    deliver(rig, a.requestId);
    endAndRelease(rig, a.requestId, receiptFor(rig, a));
    expect(await settledRow(rig, a.requestId)).toMatchObject({ label: "verified", ...CHARGE });
    expect(rig.receiptEvents.map((e) => e.type)).toEqual(["attempt.ended (verdict due)", "receipt.judged"]);
  });

  test("an attempt settled before its verdict comes (nothing delivered) stays settled; the actor gets no event", async () => {
    const rig = openRig();
    const a = startAttempt(rig);
    endAndRelease(rig, a.requestId, flipSignatureChar(receiptFor(rig, a, [])), 0);
    expect(rig.store.getSettlement(a.requestId, 0)).toMatchObject({ label: "zero_settled", reason: "nothing_delivered" });
    await settle(rig);
    expect(rig.store.getSettlement(a.requestId, 0)).toMatchObject({ label: "zero_settled", reason: "nothing_delivered" });
    // The verdict is still logged, as it was when judging was synchronous.
    expect(rig.warnings).toEqual([{ event: "receipt_quarantined", reason: "bad_signature" }]);
    // The settled frame follows the WAL sync of the posting's group (docs/decisions.md, durability tiers).
    await waitFor(() => rig.settled.length === 1);
    expect(rig.settled.map((f) => f.label)).toEqual(["zero_settled"]);
    expect(rig.receiptEvents).toEqual([{ type: "attempt.ended (verdict due)", status: "active" }]);
  });

  test("duplicate receipts: the first decides, even while its signature is still being checked", async () => {
    const rig = openRig();
    const a = startAttempt(rig);
    deliver(rig, a.requestId);
    endAndRelease(rig, a.requestId, undefined);
    const honest = receiptFor(rig, a);
    expect(rig.settlements.receiptArrived(PROVIDER, a.requestId, 0, flipSignatureChar(honest))).toBe("stored");
    expect(rig.settlements.receiptArrived(PROVIDER, a.requestId, 0, honest)).toBe("duplicate");
    expect(await settledRow(rig, a.requestId)).toMatchObject({ label: "quarantined", reason: "bad_signature" });
    await waitFor(() => rig.settled.length === 1);
    // After the final outcome: not stored, answered with that outcome again (issue 26, defect 3).
    expect(rig.settlements.receiptArrived(PROVIDER, a.requestId, 0, honest)).toBe("after_final");
    expect(dispositions(rig, a.requestId)).toEqual(["judged"]);
    await waitFor(() => rig.settled.length === 2);
    await settle(rig);
    expect(rig.settled.map((f) => f.reason)).toEqual(["bad_signature", "bad_signature"]);
  });

  test("stop() with a verification in flight: nothing more is written; after a restart the re-sent receipt settles", async () => {
    const first = openRig();
    const a = startAttempt(first);
    deliver(first, a.requestId);
    endAndRelease(first, a.requestId, undefined);
    const receipt = receiptFor(first, a);
    first.settlements.receiptArrived(PROVIDER, a.requestId, 0, receipt);
    first.close(); // the store is closed too: a write after stop() would throw
    await settle(first);
    expect(first.settled).toEqual([]);
    expect(first.receiptEvents).toEqual([{ type: "receipt.arrived", status: "active" }]);

    const second = openRig({ path: first.path });
    expect(second.store.getSettlement(a.requestId, 0)).toMatchObject({ label: "pending" });
    expect(await second.settlements.resumePending()).toEqual({ resumed: 1, interrupted: 0 });
    second.settlements.receiptArrived(PROVIDER, a.requestId, 0, receipt);
    expect(await settledRow(second, a.requestId)).toMatchObject({ label: "verified", ...CHARGE });
    await waitFor(() => second.settled.length === 1);
    expect(dispositions(second, a.requestId)).toEqual(["judged", "judged"]);
  });

  test("observe mode: the async verdict is recorded, billing follows observed usage either way", async () => {
    const rig = openRig({ mode: "observe" });
    const good = startAttempt(rig);
    deliver(rig, good.requestId);
    endAndRelease(rig, good.requestId, receiptFor(rig, good));
    const forged = startAttempt(rig);
    deliver(rig, forged.requestId);
    endAndRelease(rig, forged.requestId, flipSignatureChar(receiptFor(rig, forged)));
    expect(await settledRow(rig, good.requestId)).toMatchObject({ label: "verified", ...CHARGE });
    expect(await settledRow(rig, forged.requestId)).toMatchObject({ label: "quarantined", reason: "bad_signature", ...CHARGE });
  });
});

test("the route snapshot, its prompt-hash input and the receipt body are built in canonical member order (JCS's fast path)", () => {
  const rig = openRig();
  const canonicalize = spyOn(jcs, "canonicalize");
  try {
    const a = startAttempt(rig);
    receiptFor(rig, a);
    const values = canonicalize.mock.calls.map(([value]) => value);
    // The snapshot (stored and digested), {messages, model, params} (prompt_hash), the receipt body.
    const has = (member: string) => values.some((v) => typeof v === "object" && v !== null && member in v);
    expect([has("snapshot_version"), has("receipt_version"), has("messages")]).toEqual([true, true, true]);
    for (const v of values) expect(jcs.inCanonicalOrder(v)).toBe(true);
  } finally {
    canonicalize.mockRestore();
  }
});
