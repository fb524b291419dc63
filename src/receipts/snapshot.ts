// The route snapshot (docs/receipts.md): everything an attempt is settled against, fixed at routing and
// persisted before the job is sent. Its JCS digest travels in `job.route` and comes back in the
// receipt, so a receipt can only settle the attempt it was issued for, at route-time prices.
import { Type, type Static } from "@sinclair/typebox";
import { TypeCompiler } from "@sinclair/typebox/compiler";
import type { JobRoute } from "../wire/frames.ts";
import { AttemptN, ProviderId, RequestId } from "../wire/frames.ts";
import { routeSnapshotDigest } from "./hashes.ts";
import { SnapshotMode } from "./schema.ts";

const Strict = { additionalProperties: false } as const;
const Count = Type.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER });
const Hex64 = Type.String({ pattern: "^[0-9a-f]{64}$" });
const Hex64OrEmpty = Type.String({ pattern: "^(?:[0-9a-f]{64})?$" });

/** Bumped only with a new snapshot shape; old rows keep verifying under their own version. */
export const ROUTE_SNAPSHOT_VERSION = 1;

export const RouteSnapshot = Type.Object(
  {
    snapshot_version: Type.Literal(ROUTE_SNAPSHOT_VERSION),
    request_id: RequestId,
    attempt_n: AttemptN,
    provider_id: ProviderId,
    /** Standard base64 of the raw Ed25519 key the session authenticated with: the key that must sign. */
    provider_public_key: Type.String({ pattern: "^[A-Za-z0-9+/]{43}=$" }),
    model_id: Type.String({ minLength: 1, maxLength: 256 }),
    account_scope: Type.String({ maxLength: 256 }),
    catalog_id: Type.String({ maxLength: 128 }),
    catalog_body_digest: Hex64OrEmpty,
    expected_catalog_model_hash: Hex64OrEmpty,
    route_snapshot_mode: SnapshotMode,
    route_snapshot_policy_version: Type.String({ minLength: 1, maxLength: 64 }),
    prompt_hash: Hex64,
    prompt_token_bound: Count,
    max_tokens: Count,
    /** Rate-card row in force at routing and its prices; settlement charges these, never later ones. */
    rate_card_row: Type.String({ minLength: 1, maxLength: 64 }),
    prompt_credits_per_million: Count,
    completion_credits_per_million: Count,
    provider_share_bps: Type.Integer({ minimum: 0, maximum: 10000 }),
    /** Start of the buyer's request (the lower end of the issued_at window). */
    request_started_at_unix_ms: Count,
    routed_at_unix_ms: Count,
  },
  Strict,
);
export type RouteSnapshot = Static<typeof RouteSnapshot>;

export const routeSnapshotChecker = TypeCompiler.Compile(RouteSnapshot);

/** The snapshot's digest (sha256 hex of its JCS). */
export const snapshotDigest = (snapshot: RouteSnapshot): string => routeSnapshotDigest(snapshot);

/** `job.route` for a snapshot: the echoed fields, verbatim, plus its digest. */
export function jobRouteOf(snapshot: RouteSnapshot, digest: string = snapshotDigest(snapshot)): JobRoute {
  return {
    account_scope: snapshot.account_scope,
    catalog_id: snapshot.catalog_id,
    catalog_body_digest: snapshot.catalog_body_digest,
    expected_catalog_model_hash: snapshot.expected_catalog_model_hash,
    route_snapshot_digest: digest,
    route_snapshot_mode: snapshot.route_snapshot_mode,
    route_snapshot_policy_version: snapshot.route_snapshot_policy_version,
    prompt_hash: snapshot.prompt_hash,
  };
}
