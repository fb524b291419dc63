// Provider admission (docs/protocol.md): proof of possession first, then ban, key binding, provisional limits.
import type { AdmissionInput, AdmissionVerdict } from "../../actors/providerSession.ts";
import type { AsyncStore as Store } from "../store/asyncStore.ts";
import { CloseCode } from "../wire/frames.ts";
import { verifyHandshake } from "../wire/handshake.ts";

export interface AdmissionPolicy {
  store: Store;
  now: () => number;
  provisionalAdmissionsPerHour: number;
  provisionalMaxSessions: number;
  /** Provisional sessions connected now (excluding the one being admitted). */
  provisionalSessionCount: () => number;
}

const HOUR_MS = 3_600_000;
const refuse = (closeCode: number, reason: string): AdmissionVerdict => ({ admitted: false, closeCode, reason });

const sameKey = (a: Uint8Array, b: Uint8Array): boolean => a.length === b.length && Buffer.compare(a, b) === 0;

export async function admitProvider(policy: AdmissionPolicy, input: AdmissionInput): Promise<AdmissionVerdict> {
  const { hello } = input;
  if (!verifyHandshake(hello.receipt_public_key, input.sessionId, hello.provider_id, input.nonce, input.signature)) {
    return refuse(CloseCode.authFailed, "auth_failed");
  }
  const binding = await policy.store.getProviderBinding(hello.provider_id);
  if (binding?.banned) return refuse(CloseCode.banned, "banned");
  if (binding?.public_key) {
    if (!sameKey(binding.public_key, hello.receipt_public_key)) return refuse(CloseCode.keyMismatch, "key_mismatch");
    return { admitted: true, tier: binding.pinned ? "pinned" : "provisional" };
  }
  // A never-bound id: counts toward both provisional limits.
  if (policy.provisionalSessionCount() >= policy.provisionalMaxSessions) {
    return refuse(CloseCode.provisionalPoolFull, "provisional_pool_full");
  }
  const now = policy.now();
  if ((await policy.store.countFirstAdmissionsSince(now - HOUR_MS)) >= policy.provisionalAdmissionsPerHour) {
    return refuse(CloseCode.provisionalRateLimited, "provisional_rate_limited");
  }
  const bound = await policy.store.bindProvisionalProvider(hello.provider_id, hello.receipt_public_key, now);
  if (!bound.ok && !sameKey(bound.binding.public_key ?? new Uint8Array(), hello.receipt_public_key)) {
    return refuse(CloseCode.keyMismatch, "key_mismatch");
  }
  return { admitted: true, tier: "provisional" };
}
