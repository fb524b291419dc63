// The gateway's side of settlement (DESIGN §4): the route snapshot persisted before dispatch, the
// delivered prefix measured as chunks reach the buyer, receipts judged by the pure verifier, one
// `settlement` actor per attempt, and each outcome written to the ledger in one transaction.
import { createActor, type ActorRefFrom, type InspectionEvent } from "xstate";
import { settlementLogic, type FinalLabel } from "../../actors/settlement.ts";
import { lookupModel, routeCatalogFields, type CatalogState } from "../catalog/index.ts";
import { observedBilling, rowFor, type RateCard } from "../ledger/index.ts";
import {
  accountScope,
  canonicalize,
  deliveredNothing,
  DeliveredPrefixBuilder,
  judgeAcceptedMeasurement,
  jobRouteOf,
  promptHash,
  ROUTE_SNAPSHOT_VERSION,
  SETTLEMENT_POLICY_VERSION,
  sha256Hex,
  type DeliveredPrefix,
  type RouteSnapshot,
} from "../receipts/index.ts";
import { inlineJudge, type JudgedReceipt, type ReceiptJudge } from "../receipts/judge.ts";
import type { Log } from "../log.ts";
import type { NormalizedChat } from "../http/chat/normalize.ts";
import type { DeliveredRecord, Payer, SettleInput, SettleResult, SettlementRow } from "../store/index.ts";
import { isStoreUnavailable, type AsyncStore } from "../store/asyncStore.ts";
import { encodeFrame } from "../wire/codec.ts";
import type { ChunkFrame, EndFrame, JobRoute, TerminalState } from "../wire/frames.ts";
import { attemptKey } from "./registry.ts";

export type SettlementMode = "observe" | "enforce";

export interface SettlementDeps {
  store: AsyncStore;
  now: () => number;
  mode: SettlementMode;
  pendingDeadlineMs: number;
  gatewaySecret: Uint8Array;
  catalog: () => CatalogState | null;
  rateCard: () => RateCard;
  /** Sends a frame to the provider id's live session, when it has one. */
  sendToProvider: (providerId: string, frame: Uint8Array) => void;
  log: Log;
  inspect?: (event: InspectionEvent) => void;
  /** Called once per attempt with its final label (metrics). */
  onSettled?: (label: FinalLabel) => void;
  /** Where receipts are judged (default: on this thread, src/receipts/judge.ts). Stopped with the settlements. */
  judge?: ReceiptJudge;
}

export interface OpenAttemptInput {
  requestId: string;
  attemptN: number;
  providerId: string;
  /** Raw Ed25519 key the provider's session authenticated with. */
  providerPublicKey: Uint8Array;
  chat: NormalizedChat;
  accountId: string;
  payer: Payer;
  requestStartedAtMs: number;
  promptBound: number;
}

/** What the pipeline needs at admission to price and route a model. */
export type ModelAdmission =
  | { ok: true; rates: { prompt_credits_per_million: number; completion_credits_per_million: number; provider_share_bps: number } }
  | { ok: false; code: "model_not_available" };

interface OpenAttempt {
  requestId: string;
  attemptN: number;
  providerId: string;
  providerPublicKey: Uint8Array;
  snapshot: RouteSnapshot;
  digest: string;
  builder: DeliveredPrefixBuilder;
  actor: ActorRefFrom<SettlementLogic>;
  acceptedHash: string | null;
  cancelReason: TerminalState | null;
  /** The provider's `end`, when it came (before or after the gateway released the attempt). */
  end: EndFrame | null;
  /** The gateway's own record of the attempt, fixed when it released the attempt. */
  delivered: Pick<DeliveredPrefix, "output_hash" | "start_byte" | "end_byte" | "tokens" | "terminal_state"> | null;
  deadlineAtMs: number | null;
  /**
   * The delivered record while `released` has not persisted it yet: when the attempt settles in the
   * same call (it delivered nothing, or its receipt came with `end` and failed a rule checked before
   * the signature), the settlement writes it; otherwise `released` does, as the verdict comes later.
   */
  unwrittenEnd: NonNullable<SettleInput["ended"]> | null;
  /** A receipt that arrived before the attempt was released: judged at release. */
  earlyReceipt: string | null;
  /** The envelope that was judged, for the ledger row. */
  /** `arrivalId`: the receipt's row in the arrival log, null when that write failed (the envelope is then stored with the outcome). */
  judged: { envelope: string; arrivalId: Promise<number | null>; receivedAtMs: number; billable: { prompt_tokens: number; completion_tokens: number } | null } | null;
}

type SettlementLogic = ReturnType<typeof settlementLogic>;

const b64 = (bytes: Uint8Array) => Buffer.from(bytes).toString("base64");

const SCOPE_CACHE_LIMIT = 10_000;

/** While the database is unreachable, how long a settlement write waits before it tries again. */
const RETRY_MS = 500;

export function createSettlements(deps: SettlementDeps) {
  const { store, log } = deps;
  const judgeReceipts = deps.judge ?? inlineJudge;
  let stopped = false;

  /**
   * Runs a settlement write; while the database is unreachable it is tried again every RETRY_MS (a
   * write is one transaction, so a failed try left nothing), until it lands or stop() runs (then null:
   * a restart's resumePending finishes the job). Any other failure is logged and gives null.
   */
  async function durably<T>(what: string, ids: { request_id: string; attempt_n?: number }, write: () => Promise<T>): Promise<T | null> {
    for (let tries = 0; !stopped; tries++) {
      try {
        return await write();
      } catch (error) {
        if (!isStoreUnavailable(error)) {
          log.error("settlement_write_failed", { ...ids, write: what, error: String(error) });
          return null;
        }
        if (tries === 0) log.warn("settlement_write_waiting", { ...ids, write: what, error: String(error) });
        await Bun.sleep(RETRY_MS);
      }
    }
    return null;
  }
  const open = new Map<string, OpenAttempt>();
  // account_scope per account id: an HMAC under a secret fixed for this instance, so computed once
  // per account instead of per attempt (bounded: cleared when full).
  const scopes = new Map<string, string>();
  const scopeOf = (accountId: string): string => {
    let scope = scopes.get(accountId);
    if (scope === undefined) {
      scope = accountScope(deps.gatewaySecret, accountId);
      if (scopes.size >= SCOPE_CACHE_LIMIT) scopes.clear();
      scopes.set(accountId, scope);
    }
    return scope;
  };

  /** The catalog entry (if any) and the rate-card row in force for a model. */
  function pricing(modelId: string) {
    const catalog = deps.catalog();
    const entry = catalog ? lookupModel(catalog, modelId) : undefined;
    return { catalog, entry, row: rowFor(deps.rateCard(), entry?.rate_card_row) };
  }

  /** Route-time pricing of a model, and whether it may route at all in this mode (DESIGN §4). */
  function admitModel(modelId: string): ModelAdmission {
    const { entry, row } = pricing(modelId);
    if (!entry && deps.mode === "enforce") return { ok: false, code: "model_not_available" };
    return {
      ok: true,
      rates: {
        prompt_credits_per_million: row.prompt_credits_per_million,
        completion_credits_per_million: row.completion_credits_per_million,
        provider_share_bps: row.provider_share_bps,
      },
    };
  }

  /** The hash a provider must advertise for a model to be routed to it; null: any (observe, uncatalogued). */
  function expectedHash(modelId: string): string | null {
    return pricing(modelId).entry?.model_hash ?? null;
  }

  // Made once, like `machine.provide`: the attempt is found by the actor's context.
  const logic = settlementLogic({
    settle: (label, context) => settle(attemptKey(context.requestId, context.attemptN), label, context.reason),
  });

  function startActor(att: Omit<OpenAttempt, "actor">, resumedPendingMs: number | null): OpenAttempt {
    const key = attemptKey(att.requestId, att.attemptN);
    const actor = createActor(
      logic,
      {
        input: {
          requestId: att.requestId,
          attemptN: att.attemptN,
          resumedPending: resumedPendingMs !== null,
          pendingDeadlineMs: resumedPendingMs ?? deps.pendingDeadlineMs,
        },
        inspect: deps.inspect,
      },
    );
    const full: OpenAttempt = { ...att, actor };
    open.set(key, full);
    actor.start();
    return full;
  }

  /**
   * Builds and persists the attempt's route snapshot (before the job is sent) and opens its
   * settlement; returns the job's `route`, or null when the snapshot could not be persisted.
   */
  function openAttempt(input: OpenAttemptInput): JobRoute | null {
    const { chat } = input;
    const { catalog, row } = pricing(chat.model);
    // Observe mode routes uncatalogued models with empty catalog fields; they can never verify.
    const catalogFields = (catalog ? routeCatalogFields(catalog, chat.model) : null) ?? {
      catalog_id: "",
      catalog_body_digest: "",
      expected_catalog_model_hash: "",
    };
    const admission = admitModel(chat.model);
    if (!admission.ok) return null;
    const now = deps.now();
    const { rates } = admission;
    // Members in canonical (JCS) order, so its canonicalisation takes the fast path (jcs.ts).
    const snapshot: RouteSnapshot = {
      account_scope: scopeOf(input.accountId),
      attempt_n: input.attemptN,
      catalog_body_digest: catalogFields.catalog_body_digest,
      catalog_id: catalogFields.catalog_id,
      completion_credits_per_million: rates.completion_credits_per_million,
      expected_catalog_model_hash: catalogFields.expected_catalog_model_hash,
      max_tokens: chat.params.max_tokens,
      model_id: chat.model,
      prompt_credits_per_million: rates.prompt_credits_per_million,
      prompt_hash: promptHash({ model_id: chat.model, messages: chat.messages, params: chat.params }),
      prompt_token_bound: input.promptBound,
      provider_id: input.providerId,
      provider_public_key: b64(input.providerPublicKey),
      provider_share_bps: rates.provider_share_bps,
      rate_card_row: row.slug,
      request_id: input.requestId,
      request_started_at_unix_ms: input.requestStartedAtMs,
      route_snapshot_mode: deps.mode,
      route_snapshot_policy_version: SETTLEMENT_POLICY_VERSION,
      routed_at_unix_ms: now,
      snapshot_version: ROUTE_SNAPSHOT_VERSION,
    };
    // The stored text and the digest come from one canonicalisation (digest = sha256 of JCS, DESIGN §4).
    const snapshotJson = canonicalize(snapshot);
    const digest = sha256Hex(snapshotJson);
    // The job leaves only once this write is durable (the dispatcher's afterCommit); a failed write
    // keeps it from leaving. The digest was just computed from this very text, so it cannot mismatch.
    const recorded = store.recordRouteSnapshot(
      {
        request_id: input.requestId,
        attempt_n: input.attemptN,
        provider_id: input.providerId,
        account_id: input.accountId,
        payer: input.payer,
        mode: deps.mode,
        snapshot_json: snapshotJson,
        digest,
        rates: admission.rates,
      },
      now,
    );
    recorded.then(
      (result) => {
        if (!result.ok) log.error("route_snapshot_refused", { request_id: input.requestId, attempt_n: input.attemptN, code: result.code });
      },
      (error) => log.warn("route_snapshot_not_written", { request_id: input.requestId, attempt_n: input.attemptN, error: String(error) }),
    );
    startActor(
      {
        requestId: input.requestId,
        attemptN: input.attemptN,
        providerId: input.providerId,
        providerPublicKey: input.providerPublicKey,
        snapshot,
        digest,
        builder: new DeliveredPrefixBuilder(0),
        acceptedHash: null,
        cancelReason: null,
        end: null,
        delivered: null,
        deadlineAtMs: null,
        unwrittenEnd: null,
        earlyReceipt: null,
        judged: null,
      },
      null,
    );
    return jobRouteOf(snapshot, digest);
  }

  /** `accepted`: persists the measurement; false when it contradicts the catalog (the attempt must end). */
  function accepted(requestId: string, attemptN: number, modelHash: string): boolean {
    const att = open.get(attemptKey(requestId, attemptN));
    if (!att || att.acceptedHash !== null) return true;
    att.acceptedHash = modelHash;
    void durably("accepted_measurement", { request_id: requestId, attempt_n: attemptN }, () =>
      store.recordAcceptedMeasurement(requestId, attemptN, modelHash),
    );
    const refusal = judgeAcceptedMeasurement(att.snapshot, modelHash);
    if (refusal === null) return true;
    log.warn("measurement_mismatch", { request_id: requestId, attempt_n: attemptN, provider_id: att.providerId, reason: refusal });
    // The reason judgeAcceptedMeasurement names (docs/receipts.md): the measured hash is not the catalog's.
    att.actor.send({ type: "attempt.rejected", reason: refusal });
    return false;
  }

  /**
   * The attempt's sink for relayed chunks: each chunk that reached the buyer (streaming) or the buyer's
   * pending body (non-streaming) is added to its delivered prefix. Bound once per attempt, so the
   * per-chunk path builds and looks up no key; reads the builder at each call, since `discarded`
   * replaces it.
   */
  function relayerFor(requestId: string, attemptN: number): (frame: ChunkFrame) => void {
    const att = open.get(attemptKey(requestId, attemptN));
    return att ? (frame) => att.builder.add(frame) : () => {};
  }

  /** A non-streaming attempt's buffered output was dropped for failover: nothing of it was delivered. */
  function discarded(requestId: string, attemptN: number): void {
    const att = open.get(attemptKey(requestId, attemptN));
    if (att && !att.delivered) att.builder = new DeliveredPrefixBuilder(0);
  }

  function cancelSent(requestId: string, attemptN: number, reason: "buyer_cancel" | "gateway_timeout"): void {
    const att = open.get(attemptKey(requestId, attemptN));
    if (att && att.cancelReason === null) att.cancelReason = reason;
  }

  /** The provider's `end` for an attempt of this provider (live or already released). */
  function endReceived(providerId: string, frame: EndFrame): boolean {
    const att = open.get(attemptKey(frame.request_id, frame.attempt_n));
    if (!att || att.providerId !== providerId || att.end) return false;
    att.end = frame;
    if (frame.receipt !== undefined) receiptArrived(providerId, frame.request_id, frame.attempt_n, frame.receipt);
    return true;
  }

  /**
   * The gateway is done with the attempt: nothing more reaches the buyer from it. Fixes the delivered
   * record, persists it with the pending deadline, and lets the actor move on.
   */
  function released(requestId: string, attemptN: number): void {
    const att = open.get(attemptKey(requestId, attemptN));
    if (!att || att.delivered) return;
    // The terminal state the provider's receipt must name: what its `end` said when it came first,
    // else the reason of our cancel, else a provider failure (lost socket, no end).
    const terminal: TerminalState = att.end?.terminal_state ?? att.cancelReason ?? "provider_error";
    const finishReason = att.end && att.end.terminal_state === terminal ? att.end.finish_reason : null;
    const prefix = att.builder.finish(terminal, finishReason);
    att.delivered = prefix;
    const now = deps.now();
    att.deadlineAtMs = now + deps.pendingDeadlineMs;
    const record: DeliveredRecord = {
      output_hash: prefix.output_hash,
      start_byte: prefix.start_byte,
      end_byte: prefix.end_byte,
      tokens: prefix.tokens,
      terminal_state: prefix.terminal_state,
      finish_reason: prefix.finish_reason,
      tool_calls_delivered: prefix.tool_calls_delivered,
      reported_input_tokens: att.end ? att.end.usage.input_tokens : null,
    };
    // One UPDATE instead of two when the actor settles right away (issue 7); otherwise written below.
    att.unwrittenEnd = { delivered: record, ended_at_ms: now, pending_deadline_at_ms: att.deadlineAtMs };
    let verdictDue = false;
    if (att.earlyReceipt !== null) {
      const envelope = att.earlyReceipt;
      att.earlyReceipt = null;
      verdictDue = judge(att, envelope);
    }
    att.actor.send({ type: "attempt.ended", deliveredNothing: deliveredNothing(prefix), verdictDue });
    writeEnd(att);
  }

  /** Persists the delivered record if the settlement did not (the attempt now waits for its receipt). */
  function writeEnd(att: OpenAttempt): void {
    const end = att.unwrittenEnd;
    if (end === null) return;
    // Kept as unwritten until the write lands: a settlement meanwhile carries it too (the store writes
    // a delivered record once, whichever comes first).
    void durably("attempt_end", { request_id: att.requestId, attempt_n: att.attemptN }, () =>
      store.recordAttemptEnd(att.requestId, att.attemptN, end.delivered, end.pending_deadline_at_ms, end.ended_at_ms),
    ).then((written) => {
      if (written !== null && att.unwrittenEnd === end) att.unwrittenEnd = null;
    });
  }

  /** A receipt (in `end` or a late `receipt` frame) for any still-pending attempt of this provider id. */
  function receiptArrived(providerId: string, requestId: string, attemptN: number, envelope: string): void {
    const att = open.get(attemptKey(requestId, attemptN));
    if (!att || att.providerId !== providerId) {
      const arrival = deps.now();
      // Diagnostics only (the arrival log): nothing waits for it, and a failure is logged.
      void (async () => {
        const known = await store.getSettlement(requestId, attemptN);
        const disposition = known && known.provider_id === providerId ? "after_final" : "unknown_attempt";
        await store.recordReceiptArrival({ request_id: requestId, attempt_n: attemptN, provider_id: providerId, envelope, disposition }, arrival);
      })().catch((error) => log.warn("receipt_arrival_not_logged", { request_id: requestId, attempt_n: attemptN, error: String(error) }));
      return;
    }
    if (att.judged) {
      store
        .recordReceiptArrival({ request_id: requestId, attempt_n: attemptN, provider_id: providerId, envelope, disposition: "after_final" }, deps.now())
        .catch((error) => log.warn("receipt_arrival_not_logged", { request_id: requestId, attempt_n: attemptN, error: String(error) }));
      return;
    }
    if (!att.delivered) {
      att.earlyReceipt ??= envelope;
      return;
    }
    if (judge(att, envelope)) att.actor.send({ type: "receipt.arrived" });
  }

  /**
   * Judges a receipt, on the judging thread unless `deps.judge` says otherwise (issue 7). Everything a
   * duplicate receipt reads (`judged`) is fixed now; the verdict and the billable usage the settlement
   * reads come with the judgement. Returns whether that is later: the caller then tells the actor
   * (`attempt.ended` or `receipt.arrived`), which holds the pending deadline for it.
   */
  function judge(att: OpenAttempt, envelope: string): boolean {
    const arrival = deps.now();
    const arrivalId = store
      .recordReceiptArrival({ request_id: att.requestId, attempt_n: att.attemptN, provider_id: att.providerId, envelope, disposition: "judged" }, arrival)
      .catch((error): null => {
        log.warn("receipt_arrival_not_logged", { request_id: att.requestId, attempt_n: att.attemptN, error: String(error) });
        return null;
      });
    const record: NonNullable<OpenAttempt["judged"]> = { envelope, arrivalId, receivedAtMs: arrival, billable: null };
    att.judged = record;
    return judgeReceipts.judge(
      {
        envelope,
        sessionPublicKey: att.providerPublicKey,
        snapshot: att.snapshot,
        snapshotDigest: att.digest,
        acceptedModelHash: att.acceptedHash,
        delivered: att.delivered!,
        promptTokenBound: att.snapshot.prompt_token_bound,
        requestStartMs: att.snapshot.request_started_at_unix_ms,
        arrivalMs: arrival,
        expected: {
          request_id: att.requestId,
          attempt_n: att.attemptN,
          provider_id: att.providerId,
          account_scope: att.snapshot.account_scope,
        },
        pendingDeadlineMs: att.deadlineAtMs ?? undefined,
      },
      (result) => {
        record.billable = result.billable;
        judged(att, result.verdict);
      },
    );
  }

  /**
   * A receipt's verdict reaches the attempt's actor — unless the attempt is no longer open: it settled
   * meanwhile (zero_settled), or stop() ran, and then nothing is sent or written.
   */
  function judged(att: OpenAttempt, verdict: JudgedReceipt["verdict"]): void {
    if (verdict.label === "quarantined") {
      log.warn("receipt_quarantined", { request_id: att.requestId, attempt_n: att.attemptN, provider_id: att.providerId, reason: verdict.reason });
    }
    if (open.get(attemptKey(att.requestId, att.attemptN)) === att) att.actor.send({ type: "receipt.judged", verdict });
  }

  /** The settlement actor reached a final state: one ledger transaction, then the `settled` frame. */
  function settle(key: string, label: FinalLabel, reason: string | null): void {
    const att = open.get(key);
    if (!att) return;
    open.delete(key);
    const observed = (): { prompt_tokens: number; completion_tokens: number } =>
      observedBilling({
        delivered_tokens: att.delivered?.tokens ?? 0,
        reported_input_tokens: att.end?.usage.input_tokens ?? att.judged?.billable?.prompt_tokens ?? 0,
        prompt_token_bound: att.snapshot.prompt_token_bound,
      });
    // enforce: only verified attempts are charged, at the receipt's billable usage. observe: billing
    // follows observed usage whatever the receipt says, except for attempts that delivered nothing.
    const billed =
      label === "zero_settled"
        ? null
        : deps.mode === "observe"
          ? observed()
          : label === "verified"
            ? att.judged!.billable
            : null;
    const settledAt = deps.now();
    void (async () => {
      const judged = att.judged;
      const arrivalId = judged ? await judged.arrivalId : null;
      const receipt = judged
        ? { envelope: judged.envelope, received_at_ms: judged.receivedAtMs, ...(arrivalId === null ? {} : { arrival_id: arrivalId }) }
        : undefined;
      const input: SettleInput = { request_id: att.requestId, attempt_n: att.attemptN, label, reason, receipt, billed, ended: att.unwrittenEnd ?? undefined };
      const result = await durably("settlement", { request_id: att.requestId, attempt_n: att.attemptN }, () => store.settleAttempt(input, settledAt));
      if (result !== null) written(att, label, reason, result);
    })();
  }

  /** The settlement transaction's answer: announce the outcome once it is durable. */
  function written(att: OpenAttempt, label: FinalLabel, reason: string | null, result: SettleResult): void {
    if (!result.ok) {
      log.error("settlement_not_written", { request_id: att.requestId, attempt_n: att.attemptN, code: result.code });
      // Nothing was written: the delivered record still is, as it would have been without the outcome.
      writeEnd(att);
      return;
    }
    att.unwrittenEnd = null;
    // Group commit (src/store/groupCommit.ts): the outcome is announced only once it is durable. No
    // buyer waits for it, so it asks for no commit of its own: at one request at a time that was a
    // second fsync per request, blocking the event loop when the next request came (issue 7).
    store.afterLazyCommit((committed) => {
      if (!committed) {
        log.error("settlement_not_written", { request_id: att.requestId, attempt_n: att.attemptN, code: "commit_failed" });
        return;
      }
      announceSettled(att, label, reason, result.settlement);
    });
  }

  function announceSettled(att: OpenAttempt, label: FinalLabel, reason: string | null, settlement: SettlementRow): void {
    deps.onSettled?.(label);
    log.info("attempt_settled", {
      request_id: att.requestId,
      attempt_n: att.attemptN,
      provider_id: att.providerId,
      label,
      reason,
      debit_credits: settlement.debit_credits,
      provider_credits: settlement.provider_credits,
    });
    deps.sendToProvider(
      att.providerId,
      encodeFrame({
        type: "settled",
        request_id: att.requestId,
        attempt_n: att.attemptN,
        label,
        reason,
        provider_credits: settlement.provider_credits,
      }),
    );
  }

  /** The request starts no more attempts: its reservation resolves once none is pending. */
  function requestEnded(requestId: string): void {
    const now = deps.now();
    void durably("request_ended", { request_id: requestId }, () => store.markRequestEnded(requestId, now));
  }

  /**
   * After a restart: attempts still pending resume their deadline (a late receipt can still settle
   * them); attempts the gateway was still relaying when it stopped have no delivered record and are
   * never charged.
   */
  async function resumePending(): Promise<{ resumed: number; interrupted: number }> {
    let resumed = 0;
    let interrupted = 0;
    const pending = await store.listSettlements({ label: "pending" });
    for (const row of pending) {
      const stored = await store.getRouteSnapshot(row.request_id, row.attempt_n);
      const snapshot = stored ? (JSON.parse(stored.snapshot_json) as RouteSnapshot) : null;
      if (!row.delivered || !snapshot || !stored) {
        await store.settleAttempt({ request_id: row.request_id, attempt_n: row.attempt_n, label: "quarantined", reason: "interrupted", billed: null }, deps.now());
        interrupted++;
        continue;
      }
      resumeRow(row, snapshot, stored.digest);
      resumed++;
    }
    // No request outlives the process: each of these will start no more attempts, so its reservation
    // resolves with its last settlement (now, for interrupted ones) instead of staying held forever.
    // The same holds for requests cut before or between attempts, which have no pending attempt at all.
    const cut = new Set([...pending.map((row) => row.request_id), ...(await store.unendedHeldReservations())]);
    for (const requestId of cut) await store.markRequestEnded(requestId, deps.now());
    return { resumed, interrupted };
  }

  function resumeRow(row: SettlementRow, snapshot: RouteSnapshot, digest: string): void {
    const delivered = row.delivered!;
    const deadlineAtMs = row.pending_deadline_at_ms ?? deps.now();
    startActor(
      {
        requestId: row.request_id,
        attemptN: row.attempt_n,
        providerId: row.provider_id,
        providerPublicKey: new Uint8Array(Buffer.from(snapshot.provider_public_key, "base64")),
        snapshot,
        digest,
        builder: new DeliveredPrefixBuilder(0),
        acceptedHash: row.accepted_model_hash,
        cancelReason: null,
        end:
          delivered.reported_input_tokens === null
            ? null
            : {
                type: "end",
                request_id: row.request_id,
                attempt_n: row.attempt_n,
                terminal_state: delivered.terminal_state as TerminalState,
                finish_reason: delivered.finish_reason,
                usage: { input_tokens: delivered.reported_input_tokens, output_tokens: delivered.tokens },
              },
        delivered: {
          output_hash: delivered.output_hash,
          start_byte: delivered.start_byte,
          end_byte: delivered.end_byte,
          tokens: delivered.tokens,
          terminal_state: delivered.terminal_state as TerminalState,
        },
        deadlineAtMs,
        unwrittenEnd: null,
        earlyReceipt: null,
        judged: null,
      },
      deadlineAtMs - deps.now(),
    );
  }

  return {
    admitModel,
    expectedHash,
    openAttempt,
    accepted,
    relayerFor,
    discarded,
    cancelSent,
    endReceived,
    released,
    receiptArrived,
    requestEnded,
    resumePending,
    /** Runs `effect` once the writes made so far are durable (group commit; see src/store/groupCommit.ts). */
    afterCommit: (effect: (committed: boolean) => void) => store.afterCommit(effect),
    /** Attempts not settled yet (metrics, tests). */
    openCount: () => open.size,
    stop: () => {
      stopped = true;
      judgeReceipts.stop();
      for (const att of open.values()) att.actor.stop();
      open.clear();
    },
  };
}

export type Settlements = ReturnType<typeof createSettlements>;
