// The gateway's side of settlement (docs/receipts.md, docs/ledger.md): the route snapshot persisted
// before dispatch, the delivered prefix measured as chunks reach the buyer, receipts judged by the pure
// verifier, one `settlement` actor per attempt, and each outcome written to the ledger in one
// transaction. This file composes the parts under src/gateway/settlement/.
import { createActor, type InspectionEvent } from "xstate";
import { settlementLogic } from "../../actors/settlement.ts";
import type { CatalogState } from "../catalog/state.ts";
import type { NormalizedChat } from "../chat/contract.ts";
import type { FinalLabel, Payer, SettlementMode } from "../ledger/charges.ts";
import type { RateCard } from "../ledger/index.ts";
import { canonicalize, DeliveredPrefixBuilder, jobRouteOf, sha256Hex } from "../receipts/index.ts";
import { inlineJudge, type ReceiptJudge } from "../receipts/judge.ts";
import type { Log } from "../log.ts";
import type { AsyncStore as Store } from "../store/asyncStore.ts";
import { durableWrites } from "./settlement/durableWrites.ts";
import type { JobRoute } from "../wire/frames.ts";
import { attemptKey } from "./registry.ts";
import type { OpenAttempt, OpenAttempts } from "./settlement/attempt.ts";
import { accepted, cancelSent, discarded, endReceived, relayerFor, released, type DeliveryDeps } from "./settlement/delivery.ts";
import { receiptArrived } from "./settlement/judging.ts";
import { writeOutcome, type OutcomeDeps } from "./settlement/outcome.ts";
import { admitModel, expectedHash, pricing, type PricingSources } from "./settlement/pricing.ts";
import { recoverPending } from "./settlement/recovery.ts";
import { accountScopes, buildRouteSnapshot } from "./settlement/routeSnapshot.ts";

export interface SettlementDeps {
  store: Store;
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

export function createSettlements(deps: SettlementDeps) {
  const open: OpenAttempts = new Map();
  const writes = durableWrites(deps.log);
  const parts: DeliveryDeps & OutcomeDeps & PricingSources = { ...deps, judge: deps.judge ?? inlineJudge, open, writes };
  const scopeOf = accountScopes(deps.gatewaySecret);

  // Made once, like `machine.provide`: the attempt is found by the actor's context.
  const logic = settlementLogic({
    settle: (label, context) => {
      const key = attemptKey(context.requestId, context.attemptN);
      const att = open.get(key);
      if (!att) return;
      open.delete(key);
      writeOutcome(parts, att, label, context.reason);
    },
  });

  /** Opens the attempt's settlement: its actor waits `pendingMs` for a receipt once the attempt ended. */
  function startActor(att: Omit<OpenAttempt, "actor">, resumedPendingMs: number | null): void {
    const actor = createActor(logic, {
      input: {
        requestId: att.requestId,
        attemptN: att.attemptN,
        resumedPending: resumedPendingMs !== null,
        pendingDeadlineMs: resumedPendingMs ?? deps.pendingDeadlineMs,
      },
      inspect: deps.inspect,
    });
    open.set(attemptKey(att.requestId, att.attemptN), { ...att, actor });
    actor.start();
  }

  /**
   * Builds and persists the attempt's route snapshot (before the job is sent) and opens its
   * settlement; returns the job's `route`, or null when the model may not route or the snapshot could
   * not be persisted.
   */
  function openAttempt(input: OpenAttemptInput): JobRoute | null {
    const { catalog, row } = pricing(parts, input.chat.model);
    const admission = admitModel(parts, input.chat.model);
    if (!admission.ok) return null;
    const now = deps.now();
    const snapshot = buildRouteSnapshot({
      ...input,
      accountScope: scopeOf(input.accountId),
      mode: deps.mode,
      catalog,
      rateCardRow: row.slug,
      rates: admission.rates,
      routedAtMs: now,
    });
    // The stored text and the digest come from one canonicalisation (digest = sha256 of JCS).
    const snapshotJson = canonicalize(snapshot);
    const digest = sha256Hex(snapshotJson);
    // The job leaves only once this write is durable (the dispatcher's afterCommit); a failed write
    // keeps it from leaving. The digest was just computed from this very text, so it cannot mismatch.
    const recorded = deps.store.recordRouteSnapshot(
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
        if (!result.ok) deps.log.error("route_snapshot_refused", { request_id: input.requestId, attempt_n: input.attemptN, code: result.code });
      },
      (error) => deps.log.warn("route_snapshot_not_written", { request_id: input.requestId, attempt_n: input.attemptN, error: String(error) }),
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
        crossedEnd: false,
        judged: null,
      },
      null,
    );
    return jobRouteOf(snapshot, digest);
  }

  return {
    admitModel: (modelId: string) => admitModel(parts, modelId),
    expectedHash: (modelId: string) => expectedHash(parts, modelId),
    openAttempt,
    accepted: (requestId: string, attemptN: number, modelHash: string) => accepted(parts, requestId, attemptN, modelHash),
    relayerFor: (requestId: string, attemptN: number) => relayerFor(open, requestId, attemptN),
    discarded: (requestId: string, attemptN: number) => discarded(open, requestId, attemptN),
    cancelSent: (requestId: string, attemptN: number, reason: "buyer_cancel" | "gateway_timeout") => cancelSent(open, requestId, attemptN, reason),
    endReceived: (providerId: string, frame: Parameters<typeof endReceived>[2]) => endReceived(parts, providerId, frame),
    released: (requestId: string, attemptN: number) => released(parts, requestId, attemptN),
    receiptArrived: (providerId: string, requestId: string, attemptN: number, envelope: string) =>
      receiptArrived(parts, providerId, requestId, attemptN, envelope),
    /** The request starts no more attempts: its reservation resolves once none is pending. */
    requestEnded: (requestId: string) => {
      const now = deps.now();
      void writes.run("request_ended", { request_id: requestId }, () => deps.store.markRequestEnded(requestId, now));
    },
    resumePending: () => recoverPending(deps.store, deps.now, (att) => startActor(att, att.deadlineAtMs! - deps.now())),
    /** Runs `effect` once the writes made so far are durable (group commit; see src/store/groupCommit.ts). */
    afterCommit: (effect: (committed: boolean) => void) => deps.store.afterCommit(effect),
    /** Attempts not settled yet (metrics, tests). */
    openCount: () => open.size,
    /** The live settlement actors by attempt key (the operator console counts and follows them). */
    *actors(): Generator<[string, OpenAttempt["actor"]]> {
      for (const [key, att] of open) yield [key, att.actor];
    },
    stop: () => {
      writes.stop();
      parts.judge.stop();
      for (const att of open.values()) att.actor.stop();
      open.clear();
    },
  };
}

export type Settlements = ReturnType<typeof createSettlements>;
