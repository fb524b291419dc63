// The operator actions the console offers (the same store operations as `gateway providers …` and
// `gateway keys revoke`), applied to the running gateway at once: a ban also closes the provider's live
// session, a drain tells it to finish its work and take no more.
import type { AnyActorRef } from "xstate";
import type { ProviderBinding } from "../store/index.ts";
import { CloseCode } from "../wire/frames.ts";
import type { ActionResult, ConsoleActions } from "./routes.ts";

type Maybe<T> = T | Promise<T>;

export interface ActionDeps {
  banProvider(providerId: string): Maybe<ProviderBinding>;
  unbanProvider(providerId: string): Maybe<ProviderBinding | null>;
  getProviderBinding(providerId: string): Maybe<ProviderBinding | null>;
  pinProvider(providerId: string, publicKey: Uint8Array): Maybe<ProviderBinding>;
  revokeApiKey(keyId: string): Maybe<boolean>;
  /** The provider's admitted session on this gateway, if connected here. */
  session(providerId: string): { actor: AnyActorRef; close(code: number, reason: string): void } | undefined;
}

const ok = (detail: string): ActionResult => ({ ok: true, detail });
const fail = (status: number, message: string): ActionResult => ({ ok: false, status, message });

export function consoleActions(deps: ActionDeps): ConsoleActions {
  return {
    async ban(providerId) {
      await deps.banProvider(providerId);
      const session = deps.session(providerId);
      session?.close(CloseCode.banned, "banned");
      return ok(session ? "banned; its connection was closed" : "banned");
    },
    async unban(providerId) {
      return (await deps.unbanProvider(providerId)) ? ok("unbanned: it may connect again") : fail(404, `unknown provider ${providerId}`);
    },
    async pin(providerId) {
      const binding = await deps.getProviderBinding(providerId);
      if (!binding?.public_key) return fail(409, `${providerId} has no key bound yet: pin it with gateway providers pin ID --public-key B64`);
      await deps.pinProvider(providerId, binding.public_key);
      return ok("pinned to the key it is bound to (its tier changes at its next connection)");
    },
    async drain(providerId) {
      const session = deps.session(providerId);
      if (!session) return fail(404, `${providerId} is not connected to this gateway`);
      session.actor.send({ type: "gateway.drain" });
      return ok("draining: it finishes its work and takes no new requests");
    },
    async revokeKey(keyId) {
      return (await deps.revokeApiKey(keyId)) ? ok("revoked") : fail(404, `unknown key ${keyId}`);
    },
  };
}
