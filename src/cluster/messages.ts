// What nodes tell each other (docs/scale-out.md). Over Redis pub/sub: a JSON header, a newline, and —
// for messages that carry a provider frame — the frame's msgpack bytes as latin1 text (Bun's pub/sub
// carries strings; latin1 maps each byte to one code unit, so the bytes round-trip exactly). Over a
// node link (links.ts): binary, the header's length, the header, and the frame's bytes as they are.
/** What the cluster itself reads of a shared provider session; the gateway's bridge adds the rest. */
export interface SharedSessionView {
  sessionId: string;
  providerId: string;
  nodeId: string;
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
  | { t: "lost"; from: string; key: string }
  /** Over pub/sub only: everything `from` published here before it is delivered; its link `link` may carry the rest. */
  | { t: "linked"; from: string; link: string }
  /** Over pub/sub, and a link still open: `from` dropped links `links` between the two (either way) as silent; so must the receiver. */
  | { t: "unlinked"; from: string; links: string[] };

/** Registry broadcasts: a node's sessions, whole (`full`) or only those that changed. */
export interface RegistryMessage<V extends SharedSessionView = SharedSessionView> {
  node: string;
  /** The sending process's incarnation of `node` (a node restarted under its id sends a new one). */
  incarnation?: string;
  full: boolean;
  /** With `full`: where the node's link server listens (none: reach it over pub/sub only). */
  link?: { url: string; token: string };
  views: V[];
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

/** A message as one binary WebSocket message of a node link: header length (u32), header JSON, frame. */
export function encodeBinaryMessage(header: NodeMessage, frame?: Uint8Array): Uint8Array {
  const head = Buffer.from(JSON.stringify(header));
  const out = new Uint8Array(4 + head.length + (frame?.byteLength ?? 0));
  new DataView(out.buffer).setUint32(0, head.length);
  out.set(head, 4);
  if (frame) out.set(frame, 4 + head.length);
  return out;
}

export function decodeBinaryMessage(bytes: Uint8Array): { header: NodeMessage; frame: Uint8Array | null } | null {
  if (bytes.byteLength < 4) return null;
  const length = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength).getUint32(0);
  if (4 + length > bytes.byteLength) return null;
  try {
    const header = JSON.parse(Buffer.from(bytes.buffer, bytes.byteOffset + 4, length).toString()) as NodeMessage;
    // A copy: what is decoded from it may be kept after the socket's buffer is reused.
    const frame = 4 + length < bytes.byteLength ? bytes.slice(4 + length) : null;
    return { header, frame };
  } catch {
    return null;
  }
}
