// The route snapshot an attempt is settled against (docs/receipts.md): built from the request, the
// pricing in force and the provider chosen, before the job is sent.
import { routeCatalogFields, type CatalogState } from "../../catalog/state.ts";
import type { SettlementMode } from "../../ledger/charges.ts";
import {
  accountScope,
  promptHash,
  ROUTE_SNAPSHOT_VERSION,
  SETTLEMENT_POLICY_VERSION,
  type RouteSnapshot,
} from "../../receipts/index.ts";
import type { NormalizedChat } from "../../chat/contract.ts";
import type { Rates } from "../../ledger/money.ts";

const SCOPE_CACHE_LIMIT = 10_000;

/**
 * account_scope per account id: an HMAC under a secret fixed for this instance, so computed once per
 * account instead of per attempt (bounded: cleared when full).
 */
export function accountScopes(gatewaySecret: Uint8Array): (accountId: string) => string {
  const scopes = new Map<string, string>();
  return (accountId) => {
    let scope = scopes.get(accountId);
    if (scope === undefined) {
      scope = accountScope(gatewaySecret, accountId);
      if (scopes.size >= SCOPE_CACHE_LIMIT) scopes.clear();
      scopes.set(accountId, scope);
    }
    return scope;
  };
}

export interface SnapshotInput {
  requestId: string;
  attemptN: number;
  providerId: string;
  providerPublicKey: Uint8Array;
  chat: NormalizedChat;
  accountScope: string;
  requestStartedAtMs: number;
  promptBound: number;
  mode: SettlementMode;
  catalog: CatalogState | null;
  rateCardRow: string;
  rates: Rates;
  routedAtMs: number;
}

const b64 = (bytes: Uint8Array) => Buffer.from(bytes).toString("base64");

/** The snapshot of one attempt's route. Observe mode routes uncatalogued models with empty catalog fields; they can never verify. */
export function buildRouteSnapshot(input: SnapshotInput): RouteSnapshot {
  const { chat, rates } = input;
  const catalogFields = (input.catalog ? routeCatalogFields(input.catalog, chat.model) : null) ?? {
    catalog_id: "",
    catalog_body_digest: "",
    expected_catalog_model_hash: "",
  };
  // Members in canonical (JCS) order, so its canonicalisation takes the fast path (jcs.ts).
  return {
    account_scope: input.accountScope,
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
    rate_card_row: input.rateCardRow,
    request_id: input.requestId,
    request_started_at_unix_ms: input.requestStartedAtMs,
    route_snapshot_mode: input.mode,
    route_snapshot_policy_version: SETTLEMENT_POLICY_VERSION,
    routed_at_unix_ms: input.routedAtMs,
    snapshot_version: ROUTE_SNAPSHOT_VERSION,
  };
}
