// The invariants of docs/reliability.md, checked once a run is quiet, against the gateway's durable
// store and what the simulated buyers saw:
//   I1 zero drift — every posting balances, `ledger audit` is clean, balances = grants − debits;
//   I2 everything settles — every attempt has a final label, by its pending deadline;
//   I3 charged ≤ delivered — per request at most one charged attempt, billed no more than delivered,
//      nothing charged for a request the buyer got no output of, each provider credit exactly its share;
//   I4 no silent hang — every buyer request ended, by its deadline, and a stream that ended ended with
//      [DONE] or an in-band error;
//   I5 nothing leaks — no live request, attempt, session, settlement actor, slot, held reservation or
//      timer is left.
import type { GatewayConfig } from "../../src/config/index.ts";
import type { RunningGateway } from "../../src/compositionRoot.ts";
import { auditLedger, catalogLookupFrom } from "../../src/ledger/audit.ts";
import { buyerAccount, FUNDING_ACCOUNT, PLATFORM_ACCOUNT, providerAccount } from "../../src/store/index.ts";
import type { SimBuyer } from "./buyer.ts";
import type { TimerScope } from "./clock.ts";

/** Bugs a test plants through the simulation's hooks, to prove the checks can fail (sim.test.ts). */
export type Bug = "double_charge" | "leaked_slot";

/** How long after the providers left and the pending deadline passed the gateway must be quiet (nothing armed but its catalog poll). */
export const QUIET_MS = 5_000;

export interface InvariantInput {
  gateway: RunningGateway;
  scope: TimerScope;
  buyers: readonly SimBuyer[];
  grants: ReadonlyMap<string, number>;
  config: GatewayConfig;
  allowance: { downMs: number; forwardJumpMs: number; backwardJumpMs: number };
  /** Each provider's acknowledged outcomes (`settled` frames it received), by attempt key. */
  acknowledged: ReadonlyMap<string, { label: string; providerCredits: number }>;
}

export async function checkInvariants(input: InvariantInput): Promise<{ violations: string[]; checks: number }> {
  const { gateway, buyers, grants, config } = input;
  const store = gateway.store;
  const violations: string[] = [];
  let checks = 0;
  const check = (ok: boolean, what: () => string) => {
    checks++;
    if (!ok) violations.push(what());
  };
  await store.flushCommits();

  // I1 zero drift.
  const data = await store.ledgerAuditData();
  const catalogs = new Map<string, { body: Uint8Array; body_digest: string } | null>();
  for (const s of data.settlements) {
    if (!s.snapshot_json) continue;
    const id = (JSON.parse(s.snapshot_json) as { catalog_id?: string }).catalog_id;
    if (id && !catalogs.has(id)) catalogs.set(id, await store.getCatalog(id));
  }
  const audit = auditLedger(data, catalogLookupFrom((id) => catalogs.get(id) ?? null));
  check(audit.clean, () => `I1 ledger audit not clean: ${JSON.stringify(audit.findings.slice(0, 3))}`);
  for (const p of data.postings) {
    const sum = p.entries.reduce((n, e) => n + e.amount, 0);
    check(sum === 0, () => `I1 posting ${p.id} does not balance (sum ${sum})`);
  }
  const settlements = data.settlements;
  const debits = new Map<string, number>();
  let providerTotal = new Map<string, number>();
  let platformTotal = 0;
  for (const s of settlements) {
    if (s.payer === "buyer") debits.set(s.account_id, (debits.get(s.account_id) ?? 0) + s.debit_credits);
    providerTotal.set(s.provider_id, (providerTotal.get(s.provider_id) ?? 0) + s.provider_credits);
    platformTotal += s.platform_credits;
  }
  for (const [account, granted] of grants) {
    const balance = await store.ledgerBalance(buyerAccount(account));
    const expected = granted - (debits.get(account) ?? 0);
    check(balance === expected, () => `I1 buyer ${account} balance ${balance} ≠ grants ${granted} − debits ${debits.get(account) ?? 0}`);
  }
  for (const [provider, credits] of providerTotal) {
    const balance = await store.ledgerBalance(providerAccount(provider));
    check(balance === credits, () => `I1 provider ${provider} balance ${balance} ≠ its settlements' credits ${credits}`);
  }
  const platform = await store.ledgerBalance(PLATFORM_ACCOUNT);
  check(platform === platformTotal, () => `I1 platform balance ${platform} ≠ its settlements' credits ${platformTotal}`);
  const funding = await store.ledgerBalance(FUNDING_ACCOUNT);
  const granted = [...grants.values()].reduce((a, b) => a + b, 0);
  check(funding === -granted, () => `I1 funding balance ${funding} ≠ −grants ${granted}`);

  // A restart loses nothing acknowledged: every `settled` frame a provider received is in the ledger as sent.
  const byKey = new Map(settlements.map((s) => [`${s.request_id}#${s.attempt_n}`, s]));
  for (const [key, ack] of input.acknowledged) {
    const row = byKey.get(key);
    check(row !== undefined && row.label === ack.label && row.provider_credits === ack.providerCredits, () =>
      `I1 ${key} was acknowledged ${ack.label} with ${ack.providerCredits} credits; the ledger has ${row ? `${row.label} with ${row.provider_credits}` : "nothing"}`,
    );
  }

  // I2 everything settles, by its deadline (allowing for the time the gateway was down and forward wall-clock jumps).
  const slack = input.allowance.downMs + input.allowance.forwardJumpMs + 1_000;
  for (const s of settlements) {
    const key = `${s.request_id}#${s.attempt_n}`;
    check(s.label !== "pending", () => `I2 ${key} is still pending`);
    if (s.pending_deadline_at_ms !== null && s.settled_at_ms !== null) {
      check(s.settled_at_ms <= s.pending_deadline_at_ms + slack, () => `I2 ${key} settled ${s.settled_at_ms! - s.pending_deadline_at_ms!} ms after its pending deadline`);
    }
  }

  // I3 charged ≤ delivered, and each provider credit is exactly its share.
  const byRequest = new Map<string, typeof settlements>();
  for (const s of settlements) {
    const list = byRequest.get(s.request_id) ?? [];
    list.push(s);
    byRequest.set(s.request_id, list);
  }
  const buyerOf = new Map<string, SimBuyer>();
  for (const b of buyers) if (b.result.requestId) buyerOf.set(b.result.requestId, b);
  for (const [requestId, attempts] of byRequest) {
    const charged = attempts.filter((s) => s.debit_credits > 0);
    check(charged.length <= 1, () => `I3 ${requestId} charged ${charged.length} attempts`);
    for (const s of attempts) {
      const key = `${s.request_id}#${s.attempt_n}`;
      const provider = (BigInt(s.debit_credits) * BigInt(s.rates.provider_share_bps)) / 10_000n;
      check(BigInt(s.provider_credits) === provider && s.platform_credits === s.debit_credits - s.provider_credits, () =>
        `I3 ${key} split ${s.provider_credits}+${s.platform_credits} of ${s.debit_credits} is not the provider's ${s.rates.provider_share_bps} bps share`,
      );
      if (s.debit_credits === 0) continue;
      check(s.label === "verified", () => `I3 ${key} charged ${s.debit_credits} with label ${s.label}`);
      const delivered = s.delivered;
      check(delivered !== null && s.billed_completion_tokens <= delivered.tokens, () => `I3 ${key} billed ${s.billed_completion_tokens} completion tokens of ${delivered?.tokens ?? 0} delivered`);
      const buyer = buyerOf.get(requestId);
      if (!buyer || buyer.result.aborted || buyer.result.reset) continue;
      const bytes = delivered ? delivered.end_byte - delivered.start_byte : 0;
      check(bytes <= buyer.result.contentBytes, () => `I3 ${key} charged for ${bytes} bytes; its buyer received ${buyer.result.contentBytes}`);
      check(buyer.result.status === 200, () => `I3 ${key} charged for a request answered ${buyer.result.status}`);
    }
  }

  // I4 no silent hang.
  for (const b of buyers) {
    const r = b.result;
    check(r.endedAt !== null, () => `I4 ${b.spec.name} (${r.requestId ?? "no id"}) never ended`);
    if (r.endedAt === null || r.aborted || r.reset) continue;
    const took = r.endedAt - r.startedAt;
    check(took <= config.requestDeadlineMs + 1_000, () => `I4 ${b.spec.name} took ${took} ms (deadline ${config.requestDeadlineMs})`);
    if (r.status === 200 && b.spec.stream) {
      check(r.completed || r.errorCode !== null, () => `I4 ${b.spec.name}'s stream ended without [DONE] or an error event`);
    }
  }

  // I5 nothing leaks.
  const g = gateway;
  check(g.liveRequests() === 0, () => `I5 ${g.liveRequests()} request actors left`);
  check(g.registry.attempts.size === 0, () => `I5 ${g.registry.attempts.size} attempts left in the registry`);
  check(g.registry.sessions.size === 0, () => `I5 ${g.registry.sessions.size} provider sessions left`);
  check(g.settlements.openCount() === 0, () => `I5 ${g.settlements.openCount()} settlement actors left`);
  for (const account of grants.keys()) {
    const slots = store.requestSlotsInUse(account);
    check(slots === 0, () => `I5 ${slots} request slots of ${account} still held`);
  }
  const held = data.reservations.filter((x) => x.state === "held");
  check(held.length === 0, () => `I5 ${held.length} reservations still held (${held.map((x) => x.request_id).join(", ")})`);
  const timers = input.scope.pending();
  check(timers === 0, () => `I5 ${timers} timers still armed ${QUIET_MS} ms after the providers left and the pending deadline passed`);
  return { violations, checks };
}
