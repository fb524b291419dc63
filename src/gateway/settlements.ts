// The gateway's side of settlement (docs/receipts.md, docs/ledger.md): the route snapshot persisted
// before dispatch, the delivered prefix measured as chunks reach the buyer, receipts judged by the pure
// verifier, one `settlement` actor per attempt, and each outcome written to the ledger in one
// transaction. This file composes the parts under src/gateway/settlement/.
import { createActor, type ActorOptions, type AnyActorLogic, type AnyActorRef, type InspectionEvent } from "xstate";
import { settlementLogic } from "../../actors/settlement.ts";
import type { CatalogState } from "../catalog/state.ts";
import type { NormalizedChat } from "../chat/contract.ts";
import type { FinalLabel, Payer, SettlementMode } from "../ledger/charges.ts";
import type { RateCard } from "../ledger/index.ts";
import { canonicalize, DeliveredPrefixBuilder, jobRouteOf, sha256Hex } from "../receipts/index.ts";
import { inlineJudge, type ReceiptJudge } from "../receipts/judge.ts";
import type { Log } from "../log.ts";
import { isAdoptedElsewhere, type AsyncStore as Store } from "../store/asyncStore.ts";
import { afterOutputSentQueue, type AfterOutputSent, type OutputGate } from "./outputSent.ts";
import { durableWrites } from "./settlement/durableWrites.ts";
import type { JobRoute } from "../wire/frames.ts";
import { actorHost } from "./actorHost.ts";
import { attemptKey } from "./registry.ts";
import type { OpenAttempt, OpenAttempts } from "./settlement/attempt.ts";
import { accepted, cancelSent, discarded, endReceived, relayerFor, released, type DeliveryDeps } from "./settlement/delivery.ts";
import { receiptArrived, type ReceiptArrival } from "./settlement/judging.ts";
import { writeOutcome, type OutcomeDeps } from "./settlement/outcome.ts";
import { admitModel, expectedHash, type AdmittedPricing, type PricingSources } from "./settlement/pricing.ts";
import { recoverOne, recoverPending } from "./settlement/recovery.ts";
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
  onSettled?: (label: FinalLabel, providerId: string) => void;
  /** Where receipts are judged (default: on this thread, src/receipts/judge.ts). Stopped with the settlements. */
  judge?: ReceiptJudge;
  /** The clock of the settlement actors' timers (the simulation's, test/sim/); default the real one. */
  clock?: ActorOptions<AnyActorLogic>["clock"];
  /** Called for each receipt frame counted and not stored, with why (metrics), whichever node path it took. */
  onIgnoredReceipt?: (why: Exclude<ReceiptArrival, "stored">) => void;
  /**
   * A cluster node records which attempts it owns until they settle, and which requests until their
   * end is written (`requestEnded`), so a survivor can resolve them.
   */
  ownership?: { opened(key: string, ttlMs: number): void; settled(key: string): void; requestEnded(requestId: string): void };
  /** The store refused a write of an attempt because another node adopted it (cluster fencing). */
  adoptedElsewhere?: (ids: { request_id: string; attempt_n?: number }) => void;
  /** When the response bytes written so far have left the process (default: src/gateway/outputSent.ts). */
  afterOutputSent?: AfterOutputSent;
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
  /** The price the request was admitted at (its hold's); absent: the price in force now. */
  pricing?: AdmittedPricing;
}

export function createSettlements(deps: SettlementDeps) {
  const open: OpenAttempts = new Map();
  /** Dead nodes' attempts being read back from the store (cluster adoption), by attempt key. */
  const adopting = new Map<string, Promise<boolean>>();
  const writes = durableWrites(deps.log, Bun.sleep, (ids) => {
    if (ids.attempt_n !== undefined) dropAdopted(attemptKey(ids.request_id, ids.attempt_n));
    deps.adoptedElsewhere?.(ids);
  });
  /** An attempt another node adopted: nothing of it is this node's to settle any more. */
  const dropAdopted = (key: string) => {
    // Its actor goes without writing.
    const att = open.get(key);
    if (att) {
      open.delete(key);
      // Its request's end, if it was to ride this settlement, is written on its own.
      if (closed(att.requestId) && endingWithSettlement.delete(att.requestId)) writeRequestEnd(att.requestId);
      (att.actor as AnyActorRef).send({ type: "xstate.stop" });
    }
    deps.ownership?.settled(key);
  };
  /** Attempts open here, by request id. */
  const openByRequest = new Map<string, number>();
  /**
   * Requests that ended while an attempt of theirs was open here: the end is written by the settlement
   * of their last open attempt (one transaction a request less, docs/scale-out.md "Measured"). Their
   * reservation cannot resolve before that settlement anyway.
   */
  const endingWithSettlement = new Set<string>();
  const opened = (requestId: string) => openByRequest.set(requestId, (openByRequest.get(requestId) ?? 0) + 1);
  /** One attempt of the request left; whether it was the last one open here. */
  const closed = (requestId: string): boolean => {
    const left = (openByRequest.get(requestId) ?? 1) - 1;
    if (left > 0) openByRequest.set(requestId, left);
    else openByRequest.delete(requestId);
    return left <= 0;
  };
  const writeRequestEnd = (requestId: string) => {
    const now = deps.now();
    void writes
      .run("request_ended", { request_id: requestId }, () => deps.store.markRequestEnded(requestId, now))
      .then((written) => {
        if (written !== null) deps.store.afterLazyCommit((committed) => committed && deps.ownership?.requestEnded(requestId), requestId);
      });
  };
  const afterOutputSent = deps.afterOutputSent ?? afterOutputSentQueue();
  const parts: DeliveryDeps & OutcomeDeps & PricingSources = { ...deps, judge: deps.judge ?? inlineJudge, open, writes };
  const scopeOf = accountScopes(deps.gatewaySecret);

  // Every settlement actor runs in this host's system (its clock and inspector); nothing subscribes to
  // one, so an error of one (a bug) is thrown as XState throws a root actor's.
  const host = actorHost({ clock: deps.clock, inspect: deps.inspect, unobservedErrors: "throw" });
  // Made once, like `machine.provide`: the attempt is found by the actor's context.
  const logic = settlementLogic({
    settle: (label, context) => {
      const key = attemptKey(context.requestId, context.attemptN);
      const att = open.get(key);
      if (!att) return;
      open.delete(key);
      const endsRequest = closed(att.requestId) && endingWithSettlement.delete(att.requestId);
      writeOutcome(
        parts,
        att,
        label,
        label === "zero_settled" && att.hedgeLost ? "hedge_lost" : context.reason,
        endsRequest ? () => writeRequestEnd(att.requestId) : null,
      );
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
      parent: host,
    });
    const key = attemptKey(att.requestId, att.attemptN);
    open.set(key, { ...att, actor });
    opened(att.requestId);
    // Recorded for as long as a receipt may still come (the pending deadline, with room for the attempt).
    deps.ownership?.opened(key, (resumedPendingMs ?? deps.pendingDeadlineMs) + 3_600_000);
    actor.start();
  }

  /**
   * Builds and persists the attempt's route snapshot (before the job is sent) and opens its
   * settlement; returns the job's `route`, or null when the model may not route or the snapshot could
   * not be persisted.
   */
  function openAttempt(input: OpenAttemptInput): JobRoute | null {
    const catalog = parts.catalog();
    // Whether the model may route is decided now (a catalog signed since may have dropped it); its
    // price is the one the request was admitted at, so the charge stays within the hold.
    const admission = admitModel(parts, input.chat.model);
    if (!admission.ok) return null;
    const { rateCardRow, rates } = input.pricing ?? admission;
    const now = deps.now();
    const snapshot = buildRouteSnapshot({
      ...input,
      accountScope: scopeOf(input.accountId),
      mode: deps.mode,
      catalog,
      rateCardRow,
      rates,
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
        rates,
      },
      now,
    );
    recorded.then(
      (result) => {
        if (!result.ok) deps.log.error("route_snapshot_refused", { request_id: input.requestId, attempt_n: input.attemptN, code: result.code });
      },
      (error) => {
        deps.log.warn("route_snapshot_not_written", { request_id: input.requestId, attempt_n: input.attemptN, error: String(error) });
        // Refused as a reaped writer's (docs/scale-out.md, "Fencing"): this node was taken for dead.
        if (isAdoptedElsewhere(error)) deps.adoptedElsewhere?.({ request_id: input.requestId, attempt_n: input.attemptN });
      },
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
        heldWrites: null,
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
    /** The attempt lost a hedge race: it delivered nothing, and its provider is told why. */
    hedgeLost: (requestId: string, attemptN: number) => {
      const att = open.get(attemptKey(requestId, attemptN));
      if (att) att.hedgeLost = true;
    },
    endReceived: (providerId: string, frame: Parameters<typeof endReceived>[2]) => endReceived(parts, providerId, frame),
    /** With `outputLeft` (a stream's), its record is written once that gate opens: the bytes it covers have left the process. */
    released: (requestId: string, attemptN: number, outputLeft: OutputGate | null = null) => released(parts, requestId, attemptN, outputLeft),
    /** Runs `run` once the response bytes written by this turn have been handed to their sockets. */
    afterOutputSent,
    receiptArrived: (providerId: string, requestId: string, attemptN: number, envelope: string) => {
      const arrival = receiptArrived(parts, providerId, requestId, attemptN, envelope);
      // A store that answers later (PostgreSQL) counts the closed attempt's receipt when it knows.
      if (typeof arrival !== "string") void arrival.then((why) => deps.onIgnoredReceipt?.(why));
      else if (arrival !== "stored") deps.onIgnoredReceipt?.(arrival);
      return arrival;
    },
    /** The request starts no more attempts: its reservation resolves once none is pending. */
    requestEnded: (requestId: string) => {
      if (openByRequest.has(requestId)) endingWithSettlement.add(requestId);
      else writeRequestEnd(requestId);
    },
    resumePending: () => recoverPending(deps.store, deps.now, (att) => startActor(att, att.deadlineAtMs! - deps.now())),
    /** A dead node's attempt, taken over from the store (cluster; true when it now waits here). */
    adopt: (requestId: string, attemptN: number): Promise<boolean> => {
      const key = attemptKey(requestId, attemptN);
      if (open.has(key)) return Promise.resolve(true);
      // Frames of one attempt may arrive while its row is being read: they all wait for one adoption.
      let adoption = adopting.get(key);
      if (!adoption) {
        // Tried again while the database is unreachable: the dead node's owned set is already taken, so
        // an adoption given up here would leave the attempt pending for good.
        adoption = writes
          .run("adoption", { request_id: requestId, attempt_n: attemptN }, () =>
            recoverOne(deps.store, deps.now, requestId, attemptN, (att) => {
              if (!open.has(key)) startActor(att, att.deadlineAtMs! - deps.now());
            }),
          )
          .then((resumed) => resumed === true)
          .finally(() => adopting.delete(key));
        adopting.set(key, adoption);
      }
      return adoption;
    },
    /**
     * A dead node incarnation's writer, marked reaped before anything of it is read (cluster; tried
     * again while the database is unreachable, like an adoption: the owned set naming it is taken).
     */
    writerReaped: async (writer: string): Promise<void> => {
      if (deps.store.writerReaped === undefined) return;
      await writes.run("writer_reaped", { request_id: `(writer ${writer})` }, () => deps.store.writerReaped!(writer, deps.now()));
    },
    /** Every registered writer but this node's and `live`'s, marked reaped (cluster sweep; tried again likewise). */
    writersReapedExcept: async (live: readonly string[]): Promise<number> => {
      if (deps.store.writersReapedExcept === undefined) return 0;
      return (await writes.run("writers_reaped", { request_id: "(writers not alive)" }, () => deps.store.writersReapedExcept!(live, deps.now()))) ?? 0;
    },
    /** Whether this node has the attempt open (not settled yet). */
    isOpen: (requestId: string, attemptN: number) => open.has(attemptKey(requestId, attemptN)),
    /** Runs `effect` once the writes made so far are durable (group commit; see src/store/groupCommit.ts). */
    afterCommit: (effect: (committed: boolean) => void, requestId?: string) => deps.store.afterCommit(effect, requestId),
    /** The request's writes from now on (its delivered record, its outcome) wait for `gate` (see AsyncStore). */
    writesAfter: (requestId: string, gate: Promise<void>) => deps.store.writesAfter?.(requestId, gate),
    /** Attempts not settled yet (metrics, tests). */
    openCount: () => open.size,
    /** The live settlement actors by attempt key (the operator console counts and follows them). */
    *actors(): Generator<[string, OpenAttempt["actor"]]> {
      for (const [key, att] of open) yield [key, att.actor];
    },
    stop: () => {
      writes.stop();
      parts.judge.stop();
      // What `stop()` does for a root actor; the host's actors take it as an event.
      for (const att of open.values()) (att.actor as AnyActorRef).send({ type: "xstate.stop" });
      open.clear();
      openByRequest.clear();
      endingWithSettlement.clear();
    },
  };
}

export type Settlements = ReturnType<typeof createSettlements>;
