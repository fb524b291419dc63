// What the operator console shows, gathered from the running gateway (docs/console.md): actors counted by
// state for the four machines, the provider pool, requests in flight, settlements, ledger totals,
// error rates and time to first token, plus one-second history for the charts. Nothing here is on the
// request path: the metrics tee adds a few array writes per request, the rest runs once a second while
// a console is open.
import type { AnyActorRef, InspectionEvent } from "xstate";
import { redactForInspector } from "../inspect.ts";
import type { SettlementLabel } from "../ledger/charges.ts";
import type { AttemptOutcome, MetricsPort, RequestSummary } from "../metrics.ts";
import type { LedgerBalance, ProviderBinding } from "../store/index.ts";
import type { MachineName } from "./charts.ts";

/** A live provider session, as the console lists it. */
export interface SessionSource {
  sessionId: string;
  actor: AnyActorRef;
  /** Attempts in flight on it. */
  inFlight: number;
}

export interface ConsoleSources {
  supervisor(): AnyActorRef;
  sessions(): Iterable<SessionSource>;
  /** Live request actors, by request id. */
  requests(): Iterable<[string, AnyActorRef]>;
  /** Live settlement actors, by attempt key (`request_id#n`). */
  settlements(): Iterable<[string, AnyActorRef]>;
  bindings(): ProviderBinding[] | Promise<ProviderBinding[]>;
  ledgerBalances(): LedgerBalance[] | Promise<LedgerBalance[]>;
  now(): number;
}

const HISTORY_POINTS = 600; // ten minutes at one point a second
const TTFT_WINDOW = 2_000;
const FAILURE_WINDOW_MS = 10 * 60 * 1000;
const WATCH_PER_MACHINE = 6;
const EVENTS_PER_ACTOR = 40;
const LEDGER_REFRESH_MS = 5_000;
const FAILED_OUTCOMES: ReadonlySet<AttemptOutcome> = new Set(["declined", "lost", "timeout", "provider_error", "bad_sequence"]);

/** Leaf state ids of a snapshot value and their ancestors: `{admitted: "ready"}` → providerSession.admitted, providerSession.admitted.ready. */
export function stateIds(machine: string, value: unknown, prefix = machine): string[] {
  if (typeof value === "string") return [`${prefix}.${value}`];
  if (value && typeof value === "object") {
    const out: string[] = [];
    for (const [key, child] of Object.entries(value)) out.push(`${prefix}.${key}`, ...stateIds(machine, child, `${prefix}.${key}`));
    return out;
  }
  return [];
}

interface Watched {
  machine: MachineName;
  id: string;
  actor: AnyActorRef;
  since: number;
  events: { at: number; type: string; event: unknown }[];
  endedAt: number | null;
  /** Stops following: the request and settlement actors share one system per kind, which outlives each actor. */
  unwatch: () => void;
}

/** Percentile of a sorted array (nearest rank). */
const percentile = (sorted: number[], p: number): number | null => (sorted.length === 0 ? null : sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]!);

export function createConsoleLive(sources: ConsoleSources) {
  // Per-second counters, folded into the history by `tick`.
  let completed = 0;
  let failed = 0;
  const errorCodes = new Map<string, number>();
  const labels: Record<Exclude<SettlementLabel, "pending">, number> = { verified: 0, quarantined: 0, zero_settled: 0 };
  const labelTotals: Record<Exclude<SettlementLabel, "pending">, number> = { verified: 0, quarantined: 0, zero_settled: 0 };
  let requestsTotal = 0;
  let failedTotal = 0;
  const ttfts: number[] = [];
  const failuresByProvider = new Map<string, { at: number; outcome: AttemptOutcome }[]>();
  const history: { t: number[]; rps: number[]; errors: number[]; ttftP50: (number | null)[]; ttftP99: (number | null)[]; verified: number[]; quarantined: number[]; zeroSettled: number[]; pending: number[]; inFlight: number[] } = {
    t: [],
    rps: [],
    errors: [],
    ttftP50: [],
    ttftP99: [],
    verified: [],
    quarantined: [],
    zeroSettled: [],
    pending: [],
    inFlight: [],
  };
  const watched = new Map<AnyActorRef, Watched>();
  let ledger: { at: number; balances: LedgerBalance[] } | null = null;

  /** The metrics the gateway reports, teed: the console keeps what it charts. */
  const observe: Pick<MetricsPort, "requestCompleted" | "attemptFinished" | "settlementLabelled"> = {
    requestCompleted(summary: RequestSummary) {
      completed++;
      requestsTotal++;
      if (summary.outcome !== "succeeded" && summary.outcome !== "cancelled") {
        failed++;
        failedTotal++;
        const code = summary.errorCode ?? summary.outcome;
        errorCodes.set(code, (errorCodes.get(code) ?? 0) + 1);
      }
      if (summary.ttftMs !== null) {
        ttfts.push(summary.ttftMs);
        if (ttfts.length > TTFT_WINDOW) ttfts.splice(0, ttfts.length - TTFT_WINDOW);
      }
    },
    attemptFinished(outcome: AttemptOutcome, providerId?: string) {
      if (!providerId || !FAILED_OUTCOMES.has(outcome)) return;
      const list = failuresByProvider.get(providerId) ?? [];
      list.push({ at: sources.now(), outcome });
      if (list.length > 50) list.shift();
      failuresByProvider.set(providerId, list);
    },
    settlementLabelled(label: SettlementLabel) {
      if (label === "pending") return;
      labels[label]++;
      labelTotals[label]++;
    },
  };

  const machineActors = (): [MachineName, string, AnyActorRef][] => {
    const out: [MachineName, string, AnyActorRef][] = [["gateway", "gateway", sources.supervisor()]];
    for (const s of sources.sessions()) out.push(["providerSession", s.sessionId, s.actor]);
    for (const [id, actor] of sources.requests()) out.push(["request", id, actor]);
    for (const [id, actor] of sources.settlements()) out.push(["settlement", id, actor]);
    return out;
  };

  /** Follows an actor's events from now on (its actor system's inspection stream), up to a bounded number at a time. */
  function watch(machine: MachineName, id: string, actor: AnyActorRef): Watched {
    const existing = watched.get(actor);
    if (existing) return existing;
    const events: Watched["events"] = [];
    const subscription = actor.system.inspect((event: InspectionEvent) => {
      if (event.type !== "@xstate.event" || event.actorRef !== actor) return;
      events.push({ at: sources.now(), type: event.event.type, event: redactForInspector(event.event) });
      if (events.length > EVENTS_PER_ACTOR) events.shift();
    });
    const w: Watched = { machine, id, actor, since: sources.now(), events, endedAt: null, unwatch: () => subscription.unsubscribe() };
    watched.set(actor, w);
    return w;
  }

  /** Counts actors by state, keeps a few of each machine watched, and appends one history point. */
  function tick(): void {
    const t = sources.now();
    // Watched actors that ended are kept a minute for click-through, then dropped.
    for (const [actor, w] of watched) {
      if (w.endedAt === null && actor.getSnapshot().status !== "active") {
        w.endedAt = t;
        w.unwatch();
      }
      if (w.endedAt !== null && t - w.endedAt > 60_000) watched.delete(actor);
    }
    const perMachine = new Map<MachineName, number>();
    for (const w of watched.values()) if (w.endedAt === null) perMachine.set(w.machine, (perMachine.get(w.machine) ?? 0) + 1);
    for (const [machine, id, actor] of machineActors()) {
      if ((perMachine.get(machine) ?? 0) >= WATCH_PER_MACHINE || watched.has(actor) || actor.getSnapshot().status !== "active") continue;
      watch(machine, id, actor);
      perMachine.set(machine, (perMachine.get(machine) ?? 0) + 1);
    }
    const sorted = [...ttfts].sort((a, b) => a - b);
    const census = counts();
    const push = <K extends keyof typeof history>(k: K, v: (typeof history)[K][number]) => {
      (history[k] as unknown[]).push(v);
      if (history[k].length > HISTORY_POINTS) history[k].shift();
    };
    push("t", Math.round(t / 1000));
    push("rps", completed);
    push("errors", failed);
    push("ttftP50", percentile(sorted, 50));
    push("ttftP99", percentile(sorted, 99));
    push("verified", labels.verified);
    push("quarantined", labels.quarantined);
    push("zeroSettled", labels.zero_settled);
    push("pending", (census["settlement.running"] ?? 0) + (census["settlement.pending"] ?? 0));
    push("inFlight", census["request"] ?? 0);
    completed = 0;
    failed = 0;
    labels.verified = labels.quarantined = labels.zero_settled = 0;
  }

  /** Live actors per state id (and per machine, under the machine's name). */
  function counts(): Record<string, number> {
    const out: Record<string, number> = {};
    for (const [machine, , actor] of machineActors()) {
      const snapshot = actor.getSnapshot();
      if (snapshot.status !== "active" && machine !== "gateway") continue;
      out[machine] = (out[machine] ?? 0) + 1;
      for (const id of stateIds(machine, snapshot.value)) out[id] = (out[id] ?? 0) + 1;
    }
    return out;
  }

  async function ledgerTotals(): Promise<{ byKind: Record<string, number>; byAccount: Map<string, number> }> {
    const t = sources.now();
    if (!ledger || t - ledger.at > LEDGER_REFRESH_MS) ledger = { at: t, balances: await sources.ledgerBalances() };
    const byKind: Record<string, number> = {};
    const byAccount = new Map<string, number>();
    for (const b of ledger.balances) {
      byKind[b.kind] = (byKind[b.kind] ?? 0) + b.balance;
      byAccount.set(b.account_id, b.balance);
    }
    return { byKind, byAccount };
  }

  /** Everything the page shows, as one JSON-safe object (no prompt, output or key). */
  async function state() {
    const t = sources.now();
    const census = counts();
    const { byKind, byAccount } = await ledgerTotals();
    const bindings = new Map((await sources.bindings()).map((b) => [b.provider_id, b]));
    const connected = new Set<string>();
    const providers = [...sources.sessions()].map((s) => {
      const snapshot = s.actor.getSnapshot();
      const c = snapshot.context as { hello: { provider_id: string; max_concurrency: number } | null; tier: string | null; models: { model_id: string }[]; reportedState: string };
      const providerId = c.hello?.provider_id ?? null;
      if (providerId) connected.add(providerId);
      const binding = providerId ? bindings.get(providerId) : undefined;
      const failures = (providerId ? failuresByProvider.get(providerId) : undefined)?.filter((f) => t - f.at < FAILURE_WINDOW_MS) ?? [];
      return {
        sessionId: s.sessionId,
        providerId,
        tier: c.tier,
        state: stateIds("providerSession", snapshot.value).at(-1)?.replace(/^providerSession\./, "") ?? String(snapshot.status),
        models: c.models.map((m) => m.model_id),
        slots: c.hello?.max_concurrency ?? 0,
        inFlight: s.inFlight,
        recentFailures: failures.length,
        lastFailure: failures.at(-1)?.outcome ?? null,
        earnings: providerId ? (byAccount.get(`provider:${providerId}`) ?? 0) : 0,
        pinned: binding?.pinned ?? false,
        banned: binding?.banned ?? false,
      };
    });
    // Known ids that are not connected (e.g. banned ones), so they can be unbanned or pinned.
    const offline = [...bindings.values()]
      .filter((b) => !connected.has(b.provider_id))
      .map((b) => ({ providerId: b.provider_id, pinned: b.pinned, banned: b.banned, earnings: byAccount.get(`provider:${b.provider_id}`) ?? 0 }));
    const inFlight = [...sources.requests()].slice(0, 100).map(([id, actor]) => {
      const s = actor.getSnapshot();
      const c = s.context as { current: { attemptN: number; providerId: string } | null; streaming: boolean; nextAttemptN: number };
      return { requestId: id, state: String(s.value), streaming: c.streaming, attempt: c.current?.attemptN ?? null, providerId: c.current?.providerId ?? null, attempts: c.nextAttemptN };
    });
    const sorted = [...ttfts].sort((a, b) => a - b);
    const gateway = sources.supervisor().getSnapshot();
    return {
      at: t,
      gateway: { state: String(gateway.value) },
      counts: census,
      providers,
      offlineProviders: offline,
      requests: { inFlight, total: requestsTotal, failed: failedTotal, errorRate: requestsTotal === 0 ? 0 : failedTotal / requestsTotal, errorCodes: Object.fromEntries(errorCodes) },
      ttft: { p50: percentile(sorted, 50), p99: percentile(sorted, 99), samples: sorted.length },
      settlements: { totals: { ...labelTotals }, pending: (census["settlement.running"] ?? 0) + (census["settlement.pending"] ?? 0) },
      ledger: byKind,
      history,
    };
  }

  /** One live (or recently ended) actor in `stateId`, watched from now on if it was not already. */
  function actorIn(machine: MachineName, stateId: string) {
    const inState = (actor: AnyActorRef) => stateId === machine || stateIds(machine, actor.getSnapshot().value).includes(stateId);
    let w = [...watched.values()].find((x) => x.machine === machine && x.endedAt === null && inState(x.actor));
    if (!w) {
      const found = machineActors().find(([m, , actor]) => m === machine && actor.getSnapshot().status === "active" && inState(actor));
      if (found) w = watch(found[0], found[1], found[2]);
    }
    w ??= [...watched.values()].reverse().find((x) => x.machine === machine && inState(x.actor));
    return w ? describe(w) : null;
  }

  function describe(w: Watched) {
    const s = w.actor.getSnapshot();
    return {
      machine: w.machine,
      id: w.id,
      status: s.status,
      value: s.value,
      context: redactForInspector(s.context),
      watchingSince: w.since,
      events: w.events,
    };
  }

  return { observe, tick, state, actorIn, counts };
}

export type ConsoleLive = ReturnType<typeof createConsoleLive>;

/** The gateway's metrics port with the console's observer added to it. */
export function teeMetrics<M extends MetricsPort>(metrics: M, live: ConsoleLive): M {
  return {
    ...metrics,
    requestCompleted: (s: RequestSummary) => {
      metrics.requestCompleted(s);
      live.observe.requestCompleted(s);
    },
    attemptFinished: (outcome: AttemptOutcome, providerId?: string) => {
      metrics.attemptFinished(outcome);
      live.observe.attemptFinished(outcome, providerId);
    },
    settlementLabelled: (label: SettlementLabel) => {
      metrics.settlementLabelled(label);
      live.observe.settlementLabelled(label);
    },
  };
}
