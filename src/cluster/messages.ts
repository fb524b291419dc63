// What nodes tell each other over Redis pub/sub (docs/scale-out.md): a JSON header, a newline, and —
// for messages that carry a provider frame — the frame's msgpack bytes as latin1 text (Bun's pub/sub
// carries strings; latin1 maps each byte to one code unit, so the bytes round-trip exactly).
import type { ProviderView } from "../gateway/routing.ts";

/** A provider session as other nodes route to it. */
export interface SharedProviderView extends ProviderView {
  nodeId: string;
  /** min(max_concurrency, reported capacity): the slots the session has in all. */
  capacity: number;
  /** Attempts in flight on the session, per node that owns them. */
  inFlightByNode: Record<string, number>;
  /** Models it may serve, with the hashes it advertised (models it was caught measuring otherwise are left out). */
  models: { model_id: string; model_hash: string }[];
  /** Its receipt key (base64), for the route snapshot. */
  publicKey: string;
}

export type NodeMessage =
  /** owner → holder: send this job frame to the session, for attempt `key`. */
  | { t: "job"; from: string; session: string; key: string }
  /** owner → holder: send this frame (cancel) to the session. */
  | { t: "to_session"; from: string; session: string; key: string }
  /** any → holder: send this frame (settled) to the provider's session, whichever it is. */
  | { t: "to_provider"; from: string; provider: string }
  /** owner → holder: the owner let attempt `key` go (its slot frees; its frames still come back). */
  | { t: "release"; from: string; key: string }
  /** holder → owner: a frame the provider sent about the owner's attempt. */
  | { t: "frame"; from: string; session: string; provider: string }
  /** holder → owner: the attempt cannot run there, or the session holding it is gone. */
  | { t: "lost"; from: string; key: string };

/** Registry broadcasts: a node's sessions, whole (`full`) or only those that changed. */
export interface RegistryMessage {
  node: string;
  full: boolean;
  views: SharedProviderView[];
  gone: string[];
}

/** Changes every node must apply within a second (docs/scale-out.md, "Changes"). */
export type ChangeMessage =
  | { kind: "key_revoked" | "tier_changed" | "accounts_changed" }
  | { kind: "provider_banned"; provider_id: string }
  | { kind: "catalog_signed" };

export function encodeMessage(header: NodeMessage, frame?: Uint8Array): string {
  const head = JSON.stringify(header);
  return frame ? `${head}\n${Buffer.from(frame.buffer, frame.byteOffset, frame.byteLength).toString("latin1")}` : head;
}

export function decodeMessage(text: string): { header: NodeMessage; frame: Uint8Array | null } | null {
  const cut = text.indexOf("\n");
  try {
    const header = JSON.parse(cut < 0 ? text : text.slice(0, cut)) as NodeMessage;
    const frame = cut < 0 ? null : new Uint8Array(Buffer.from(text.slice(cut + 1), "latin1"));
    return { header, frame };
  } catch {
    return null;
  }
}
