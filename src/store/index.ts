// The store's public face: openStore and the Store interface. Nothing outside src/store/ sees SQL.

import { randomBytes as cryptoRandomBytes } from "node:crypto";
import * as accounts from "./accounts.ts";
import { demoSessionStore } from "./demoSessions.ts";
import { identityStore } from "./identities.ts";
import { ledgerStore } from "./ledgerStore.ts";
import { feedbackStore } from "./feedback.ts";
import { requestSlotStore } from "./requestSlots.ts";
import { usageStore } from "./usage.ts";
import * as catalog from "./catalog.ts";
import { cacheApiKeyLookups } from "./apiKeyCache.ts";
import { immediateCommits, withGroupCommit } from "./groupCommit.ts";
import { openDatabase } from "./db.ts";
import { walSyncer } from "./walSync.ts";
import { KEY_PREFIX_PATTERN, type RandomBytes } from "./ids.ts";
import * as providers from "./providers.ts";
import { getOrCreateSecret } from "./secrets.ts";
import type { GroupCommitPort, Store, StoreOptions } from "./types.ts";
export type { AccountSession, IdentityRow, IssueKeyResult, PendingLogin, SealKey, SignInInput, SignInResult } from "./identities.ts";
export { SIGNUP_KEY_LABEL } from "./identities.ts";
export type { FeedbackRating, FeedbackRow, RecordFeedbackInput, RecordFeedbackResult } from "./feedback.ts";
export type { AcquireSlotResult } from "./requestSlots.ts";
export type { AccountUsage, ModelUsage } from "./usage.ts";
export type { DemoSessionResult } from "./demoSessions.ts";
export type {
  DeliveredRecord,
  LedgerAuditData,
  LedgerBalance,
  NewAttempt,
  Payer,
  PostingRow,
  ReceiptDisposition,
  ReservationRow,
  ReserveInput,
  ReserveResult,
  SettleInput,
  SettleResult,
  SettlementLabel,
  SettlementMode,
  SettlementRates,
  SettlementRow,
  FinalLabel,
} from "./ledgerTypes.ts";
export { buyerAccount, FUNDING_ACCOUNT, PLATFORM_ACCOUNT, PROMOTION_ACCOUNT, providerAccount } from "./ledgerStore.ts";

export type {
  AccountRow,
  ApiKeyRow,
  AppendCatalogInput,
  AppendCatalogResult,
  CatalogHistoryEntry,
  AuthenticatedKey,
  BindResult,
  ProviderBinding,
  Store,
  StoreOptions,
  AccountTier,
} from "./types.ts";

export const DEFAULT_KEY_PREFIX = "gw";

/**
 * Opens the SQLite-backed store at `path` (file and parent directory created when missing,
 * migrations applied). Throws on an invalid `keyPrefix` or an unusable database file.
 */
export function openStore(path: string, options: StoreOptions = {}): Store {
  const keyPrefix = options.keyPrefix ?? DEFAULT_KEY_PREFIX;
  if (!KEY_PREFIX_PATTERN.test(keyPrefix)) throw new Error(`invalid API key prefix ${JSON.stringify(keyPrefix)}`);
  const clock = options.now ?? Date.now;
  const random: RandomBytes = options.randomBytes ?? cryptoRandomBytes;
  const db = openDatabase(path);

  const store: Omit<Store, keyof GroupCommitPort> = {
    createAccount: (input, now_ms = clock()) => accounts.createAccount(db, random, input, now_ms),
    listAccounts: () => accounts.listAccounts(db),
    getAccount: (account_id) => accounts.getAccount(db, account_id),
    setAccountTier: (account_id, tier) => accounts.setAccountTier(db, account_id, tier),

    createApiKey: (input, now_ms = clock()) => accounts.createApiKey(db, random, keyPrefix, input, now_ms),
    authenticateApiKey: (api_key, now_ms = clock()) => accounts.authenticateApiKey(db, keyPrefix, api_key, now_ms),
    revokeApiKey: (key_id, now_ms = clock()) => accounts.revokeApiKey(db, key_id, now_ms),
    listApiKeys: (account_id) => accounts.listApiKeys(db, account_id),

    getProviderBinding: (provider_id) => providers.getProviderBinding(db, provider_id),
    bindProvisionalProvider: (provider_id, public_key, now_ms = clock()) =>
      providers.bindProvisionalProvider(db, provider_id, public_key, now_ms),
    countFirstAdmissionsSince: (since_ms) => providers.countFirstAdmissionsSince(db, since_ms),
    pinProvider: (provider_id, public_key, now_ms = clock()) =>
      providers.pinProvider(db, provider_id, public_key, now_ms),
    unpinProvider: (provider_id, now_ms = clock()) => providers.unpinProvider(db, provider_id, now_ms),
    banProvider: (provider_id, now_ms = clock()) => providers.banProvider(db, provider_id, now_ms),
    unbanProvider: (provider_id, now_ms = clock()) => providers.unbanProvider(db, provider_id, now_ms),
    listProviders: () => providers.listProviders(db),

    getOrCreateSecret: (name, byteLength) => getOrCreateSecret(db, random, name, byteLength),

    appendCatalog: (input, now_ms = clock()) => catalog.appendCatalog(db, input, now_ms),
    latestCatalog: () => catalog.latestCatalog(db),
    latestCatalogSeq: () => catalog.latestSeq(db),
    getCatalog: (catalog_id) => catalog.getCatalog(db, catalog_id),
    listCatalogHistory: (after_seq) => catalog.listCatalogHistory(db, after_seq),

    ...identityStore(db, random, keyPrefix, clock),
    ...demoSessionStore(db, random, clock),
    ...ledgerStore(db, clock),
    ...feedbackStore(db, clock),
    ...usageStore(db),
    ...requestSlotStore(),

    close: () => db.close(),
  };
  if (!options.groupCommit) return { ...store, ...immediateCommits };
  // Group commit wraps every method (see groupCommit.ts for the invariants); any call that may revoke a
  // key or change a tier forgets the cached key lookups first.
  // Durability tiers: the gateway's groups append to the WAL and money waits for an off-loop fsync.
  const wal = path === ":memory:" || options.syncWal !== undefined ? null : walSyncer(`${path}-wal`);
  const syncWal = options.syncWal === undefined ? wal?.sync : (options.syncWal ?? undefined);
  const grouped = withGroupCommit(store, db, {
    beforeOtherCall: () => keys.forget(),
    scheduleLazy: options.lazyCommitTimer,
    schedule: options.endOfTurn,
    commitFails: options.commitFails,
    onCommitFailed: options.onCommitFailed,
    ...(syncWal ? { syncWal } : {}),
  });
  // The cache answers a hit from memory; only a miss (and its last-use write) reaches the grouped store.
  const keys = cacheApiKeyLookups(grouped.authenticateApiKey, db, keyPrefix, clock);
  return {
    ...grouped,
    authenticateApiKey: keys.authenticateApiKey,
    forgetCachedKeys: keys.forget,
    close: () => {
      grouped.close();
      wal?.close();
    },
  };
}
