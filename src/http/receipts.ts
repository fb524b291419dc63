// GET /v1/receipts/{request_id}: a buyer's view of their own request's settlement (docs/receipts.md) —
// labels, reasons and charges per attempt; never prompts, outputs or provider identities.
import type { AsyncStore as Store } from "../store/asyncStore.ts";

/** Ids buyers see (`req_<hex>`, `chatcmpl-req_<hex>`, `msg_<hex>`, `resp_<hex>`) all end with the request id's hex. */
const REQUEST_HEX_IN = /(?:^|[_-])([0-9a-f]{24})$/;

export async function buyerReceiptsBody(store: Store, accountId: string, requestId: string, settlementMode: "observe" | "enforce") {
  const hex = REQUEST_HEX_IN.exec(requestId)?.[1];
  if (!hex) return null;
  const id = `req_${hex}`;
  const attempts = await store.listSettlements({ request_id: id });
  // Another account's request is indistinguishable from an unknown one.
  if (attempts.length === 0 || attempts.some((a) => a.account_id !== accountId)) return null;
  return {
    object: "request.receipts",
    request_id: id,
    settlement_mode: settlementMode,
    charged_credits: attempts.reduce((n, a) => n + (a.payer === "buyer" ? a.debit_credits : 0), 0),
    attempts: attempts.map((a) => ({
      attempt_n: a.attempt_n,
      label: a.label,
      reason: a.reason,
      billed_prompt_tokens: a.billed_prompt_tokens,
      billed_completion_tokens: a.billed_completion_tokens,
      debit_credits: a.debit_credits,
    })),
  };
}
