// Sticky conversation affinity (docs/routing.md): the X-Conversation-ID tag's rule and the key the
// sticky map stores instead of it.
import { createHmac } from "node:crypto";

export const CONVERSATION_HEADER = "x-conversation-id";
const TAG = /^[A-Za-z0-9._:-]{1,128}$/;

/** The header's tag, null when absent, or "invalid" when it breaks the rule (400 naming the header). */
export function conversationTag(value: string | null): string | null | "invalid" {
  if (value === null) return null;
  return TAG.test(value) ? value : "invalid";
}

/** HMAC-SHA256(gateway secret, "sticky" ‖ account id ‖ tag), hex: one account's tag never meets another's. */
export function conversationKey(secret: Uint8Array, accountId: string, tag: string): string {
  return createHmac("sha256", secret).update(`sticky\u0000${accountId}\u0000${tag}`).digest("hex");
}
