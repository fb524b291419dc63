// Concurrency slots: how many requests an account has running at once (docs/quotas.md: 2 per account).
// Deliberately process memory, not SQLite: a slot stands for a live HTTP response on this process, so
// a restart — which ends every such response — must free every slot, and a durable row would instead
// leak slots across a crash. Acquire and release are synchronous, so a check-and-take is atomic with
// respect to every other request of the process (one event loop). A cluster node takes its slots in
// Redis under a lease instead (src/cluster/slots.ts, docs/scale-out.md).

export type AcquireSlotResult = { ok: true; in_use: number } | { ok: false; code: "concurrency_exhausted"; in_use: number };

export interface RequestSlotStore {
  /**
   * Takes one of `limit` slots of `account_id` for `request_id`, or refuses when all are taken.
   * Taking a slot the request already holds is a no-op success.
   */
  acquireRequestSlot(account_id: string, request_id: string, limit: number): AcquireSlotResult;
  /** Frees the request's slot; false when it held none (released already, or never acquired). */
  releaseRequestSlot(request_id: string): boolean;
  /** Slots the account holds now. */
  requestSlotsInUse(account_id: string): number;
}

export function requestSlotStore(): RequestSlotStore {
  const byAccount = new Map<string, Set<string>>();
  const accountOf = new Map<string, string>();
  return {
    acquireRequestSlot(account_id, request_id, limit) {
      const held = byAccount.get(account_id) ?? new Set<string>();
      if (held.has(request_id)) return { ok: true, in_use: held.size };
      if (held.size >= limit) return { ok: false, code: "concurrency_exhausted", in_use: held.size };
      held.add(request_id);
      byAccount.set(account_id, held);
      accountOf.set(request_id, account_id);
      return { ok: true, in_use: held.size };
    },
    releaseRequestSlot(request_id) {
      const account_id = accountOf.get(request_id);
      if (account_id === undefined) return false;
      accountOf.delete(request_id);
      const held = byAccount.get(account_id);
      held?.delete(request_id);
      if (held && held.size === 0) byAccount.delete(account_id);
      return true;
    },
    requestSlotsInUse: (account_id) => byAccount.get(account_id)?.size ?? 0,
  };
}
