// Accounts and API keys as the store returns them.

export type AccountTier = "free" | "paid";

export interface AccountRow {
  account_id: string;
  name: string | null;
  tier: AccountTier;
  created_at_ms: number;
}

/** A key as listed: never the key itself nor its hash, only the display prefix. */
export interface ApiKeyRow {
  key_id: string;
  account_id: string;
  display_prefix: string;
  label: string | null;
  created_at_ms: number;
  last_used_at_ms: number | null;
  revoked_at_ms: number | null;
}

export interface AuthenticatedKey {
  account_id: string;
  key_id: string;
  tier: AccountTier;
}

export interface ApiKeyLookup {
  /** The key's owner, or null for an unknown or revoked key. Records last use at most once a minute. */
  authenticateApiKey(api_key: string, now_ms?: number): AuthenticatedKey | null;
}
