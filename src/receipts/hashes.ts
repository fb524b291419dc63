// The hash inputs of docs/receipts.md, each in one place: prompt_hash, output_hash (and the delivered prefix
// it covers), route_snapshot_digest, account_scope, provider_receipt_key_id, the prompt-token bound.
// The gateway and the provider runtime both compute these from here; the golden fixtures and the
// independent test signer (test/receipts/) keep this code from agreeing with itself by a shared bug.
import { createHash, createHmac } from "node:crypto";
import type { JobMessage, JobParams, TerminalState, ToolCallDelta } from "../wire/frames.ts";
import { canonicalize, canonicalNumber, canonicalString } from "./jcs.ts";

export const sha256Hex = (data: string | Uint8Array): string => createHash("sha256").update(data).digest("hex");

/** sha256 hex of the UTF-8 bytes of JCS(value). */
export const jcsSha256 = (value: unknown): string => sha256Hex(canonicalize(value));

/** `provider_receipt_key_id` = "ed25519-sha256:" + hex(sha256(raw 32-byte public key)). */
export function receiptKeyId(publicKeyRaw: Uint8Array): string {
  return `ed25519-sha256:${sha256Hex(publicKeyRaw)}`;
}

/**
 * `account_scope` = hex HMAC-SHA256(gateway secret, account id): lets a receipt bind an account
 * without naming it. For demo traffic the id is `demo:` + the client's /32 or /64 (the caller's job).
 */
export function accountScope(gatewaySecret: Uint8Array, accountId: string): string {
  return createHmac("sha256", gatewaySecret).update(accountId, "utf8").digest("hex");
}

/** `prompt_hash` = sha256 hex of JCS({model, messages, params}) with the job's exact values. */
export function promptHash(job: { model_id: string; messages: readonly JobMessage[]; params: JobParams }): string {
  // Members in canonical order (jcs.ts's fast path).
  return jcsSha256({ messages: job.messages, model: job.model_id, params: job.params });
}

/** `route_snapshot_digest` = sha256 hex of JCS(the persisted snapshot object). */
export const routeSnapshotDigest = (snapshot: object): string => jcsSha256(snapshot);

/**
 * The gateway's own upper bound on prompt tokens (docs/receipts.md): UTF-8 bytes of every message content
 * and of the tools JSON, plus 8 per message, plus 16, plus, for each assistant tool call, the UTF-8
 * bytes of its function name and arguments plus 8 (a tool-heavy conversation's calls are prompt text
 * too). "The tools JSON" is JSON.stringify of the forwarded `params.tools` value. A token is at least
 * one byte of text in every tokenizer we route to, which is why bytes bound tokens.
 */
export function promptTokenBound(messages: readonly JobMessage[], tools: unknown): number {
  let bound = 16;
  for (const m of messages) {
    bound += 8 + (m.content ? Buffer.byteLength(m.content, "utf8") : 0);
    if (m.role === "assistant" && m.tool_calls !== undefined) for (const call of m.tool_calls) bound += toolCallBytes(call) + 8;
  }
  if (tools !== undefined) bound += Buffer.byteLength(JSON.stringify(tools), "utf8");
  return bound;
}

/**
 * UTF-8 bytes of one assistant tool call's `function.name` and `function.arguments` (docs/receipts.md).
 * Tool calls are forwarded as the buyer sent them, so a value that is not a string (arguments sent as
 * an object) counts as its JSON text, the form an upstream server reads; a missing one counts 0.
 */
function toolCallBytes(call: unknown): number {
  if (typeof call !== "object" || call === null) return 0;
  const fn = (call as { function?: unknown }).function;
  if (typeof fn !== "object" || fn === null) return 0;
  const { name, arguments: args } = fn as { name?: unknown; arguments?: unknown };
  return textBytes(name) + textBytes(args);
}

const textBytes = (value: unknown): number =>
  value === undefined || value === null ? 0 : Buffer.byteLength(typeof value === "string" ? value : (JSON.stringify(value) ?? ""), "utf8");

/**
 * Tokens a detokenizer may hold back in the middle of a character (a multi-byte character split over
 * tokens) on top of one token per delivered byte (docs/receipts.md).
 */
export const OUTPUT_TOKEN_ALLOWANCE = 4;

/**
 * The most output tokens an attempt can have produced for what it delivered (docs/receipts.md): a token
 * decodes to at least one byte, apart from special tokens, which are never content. So: delivered
 * content bytes + tool-call bytes (toolCallDeltaBytes) + OUTPUT_TOKEN_ALLOWANCE.
 */
export const outputTokenBound = (contentBytes: number, toolCallBytes: number): number => contentBytes + toolCallBytes + OUTPUT_TOKEN_ALLOWANCE;

/** UTF-8 bytes of the model output in tool-call deltas: every `name` and `arguments` fragment (ids are the server's). */
export function toolCallDeltaBytes(deltas: readonly ToolCallDelta[]): number {
  let bytes = 0;
  for (const d of deltas) {
    if (d.name !== undefined) bytes += Buffer.byteLength(d.name, "utf8");
    if (d.arguments !== undefined) bytes += Buffer.byteLength(d.arguments, "utf8");
  }
  return bytes;
}

/** One delivered tool call as it enters output_hash: arguments are the raw concatenated text. */
export interface DeliveredToolCall {
  index: number;
  id: string | null;
  name: string | null;
  arguments: string;
}

/**
 * Assembles streamed tool-call deltas into delivered calls, the rule both sides must share:
 * - deltas are taken in chunk `seq` order, and within a chunk in array order;
 * - deltas with the same `index` form one call; calls are listed by ascending `index`;
 * - `id` and `name` are the first value given for that index (later ones are ignored: OpenAI-style
 *   streams send them once, and a buyer's client keeps the first);
 * - `arguments` is the concatenation of every `arguments` fragment, as raw text, never parsed;
 *   a call with no fragment has `""`;
 * - no tool-call delta delivered at all → `null` (not `[]`).
 */
export class ToolCallAssembler {
  private readonly calls = new Map<number, DeliveredToolCall>();

  add(deltas: readonly ToolCallDelta[]): void {
    for (const d of deltas) {
      let call = this.calls.get(d.index);
      if (call === undefined) {
        call = { index: d.index, id: null, name: null, arguments: "" };
        this.calls.set(d.index, call);
      }
      if (call.id === null && d.id !== undefined) call.id = d.id;
      if (call.name === null && d.name !== undefined) call.name = d.name;
      if (d.arguments !== undefined) call.arguments += d.arguments;
    }
  }

  get any(): boolean {
    return this.calls.size > 0;
  }

  result(): DeliveredToolCall[] | null {
    if (this.calls.size === 0) return null;
    return [...this.calls.values()].sort((a, b) => a.index - b.index).map((c) => ({ ...c }));
  }
}

/** One relayed chunk, as far as settlement cares. */
export interface DeliveredChunk {
  content?: string;
  tool_calls?: readonly ToolCallDelta[];
  tokens: number;
}

/**
 * What the gateway delivered for one attempt (or what a provider binds in its receipt). Persisted
 * with the route snapshot without the text itself: the hash stands for it.
 */
export interface DeliveredPrefix {
  output_hash: string;
  /** Byte offsets over the request's delivered stream (UTF-8 bytes of delivered `content`). */
  start_byte: number;
  end_byte: number;
  /** Sum of the `tokens` of every delivered chunk. */
  tokens: number;
  terminal_state: TerminalState;
  finish_reason: string | null;
  /** True when at least one tool-call delta was delivered. */
  tool_calls_delivered: boolean;
  /** UTF-8 bytes of the delivered tool-call names and arguments (toolCallDeltaBytes): the output-token bound's share. */
  tool_call_bytes: number;
}

/** The object whose JCS is hashed into `output_hash` (docs/receipts.md). */
export interface OutputHashInput {
  content: string;
  finish_reason: string | null;
  output_prefix_end_byte: number;
  output_prefix_start_byte: number;
  terminal_state: TerminalState;
  tool_calls: DeliveredToolCall[] | null;
}

/** `output_hash` = sha256 hex of JCS({content, finish_reason, output_prefix_end_byte, output_prefix_start_byte, terminal_state, tool_calls}). */
export const outputHash = (input: OutputHashInput): string => jcsSha256(input);

/** Pending content (UTF-16 code units) past which the builder hashes what it holds. */
const HASH_BATCH_UNITS = 2048;
/**
 * Pending chunks past which it does too: the pending text is a rope that costs heap per piece, so a
 * batch of token-sized chunks is bounded by count as well as by length (docs/benchmarks.md,
 * Measurements behind the code).
 */
const HASH_BATCH_PIECES = 16;

/**
 * Accumulates a delivered prefix chunk by chunk and hashes it at the end without keeping the text:
 * `content` is the first member of the JCS object (keys sort as content < finish_reason < …), so
 * `{"content":"` + escaped text can be streamed into the hash. Content is hashed in batches of
 * about HASH_BATCH_UNITS or HASH_BATCH_PIECES chunks (one escape and one hash update per batch, not
 * per chunk). Escaping a batch equals escaping its chunks one by one, because JSON string
 * escaping is per code point and each chunk is checked to be well-formed (no lone surrogate) as it is
 * added — so two halves of a pair split over chunks are still refused, as escaping each chunk would.
 * Equality with outputHash() is a test.
 */
export class DeliveredPrefixBuilder {
  private readonly hash = createHash("sha256");
  private readonly toolCalls = new ToolCallAssembler();
  /** JCS text not yet hashed that precedes `pending`: the object's opening until the first update. */
  private unhashed = '{"content":"';
  /** Delivered content not yet escaped and hashed. */
  private pending = "";
  /** Chunks whose content `pending` holds. */
  private pendingPieces = 0;
  /** UTF-8 bytes of the content already hashed. */
  private hashedBytes = 0;
  private tokens = 0;
  private toolCallBytes = 0;

  /** @param startByte bytes the request delivered before this attempt (0 while failover precedes the first byte). */
  constructor(private readonly startByte = 0) {}

  add(chunk: DeliveredChunk): void {
    const content = chunk.content;
    if (content !== undefined && content.length > 0) {
      // What canonicalString would refuse, refused as it would be.
      if (!content.isWellFormed()) canonicalString(content);
      this.pending += content;
      if (this.pending.length >= HASH_BATCH_UNITS || ++this.pendingPieces >= HASH_BATCH_PIECES) this.hashPending("");
    }
    if (chunk.tool_calls !== undefined) {
      this.toolCalls.add(chunk.tool_calls);
      this.toolCallBytes += toolCallDeltaBytes(chunk.tool_calls);
    }
    this.tokens += chunk.tokens;
  }

  /** Hashes the pending content (escaped, without the quotes canonicalString adds) and then `tail`. */
  private hashPending(tail: string): void {
    this.hashedBytes += Buffer.byteLength(this.pending, "utf8");
    this.hash.update(this.unhashed + JSON.stringify(this.pending).slice(1, -1) + tail);
    this.unhashed = "";
    this.pending = "";
    this.pendingPieces = 0;
  }

  get deliveredBytes(): number {
    return this.hashedBytes + Buffer.byteLength(this.pending, "utf8");
  }

  get deliveredTokens(): number {
    return this.tokens;
  }

  /** Closes the hash; the builder must not be used afterwards. */
  finish(terminal_state: TerminalState, finish_reason: string | null): DeliveredPrefix {
    const start = this.startByte;
    const end = start + this.deliveredBytes;
    const rest =
      `",${canonicalString("finish_reason")}:${finish_reason === null ? "null" : canonicalString(finish_reason)}` +
      `,${canonicalString("output_prefix_end_byte")}:${canonicalNumber(end)}` +
      `,${canonicalString("output_prefix_start_byte")}:${canonicalNumber(start)}` +
      `,${canonicalString("terminal_state")}:${canonicalString(terminal_state)}` +
      `,${canonicalString("tool_calls")}:${canonicalize(this.toolCalls.result())}}`;
    this.hashPending(rest);
    return {
      output_hash: this.hash.digest("hex"),
      start_byte: start,
      end_byte: end,
      tokens: this.tokens,
      terminal_state,
      finish_reason,
      tool_calls_delivered: this.toolCalls.any,
      tool_call_bytes: this.toolCallBytes,
    };
  }
}

/** The delivered prefix of a whole chunk list (convenience over DeliveredPrefixBuilder). */
export function deliveredPrefixOf(
  chunks: readonly DeliveredChunk[],
  terminal_state: TerminalState,
  finish_reason: string | null,
  startByte = 0,
): DeliveredPrefix {
  const builder = new DeliveredPrefixBuilder(startByte);
  for (const c of chunks) builder.add(c);
  return builder.finish(terminal_state, finish_reason);
}

/**
 * The chunks a provider binds after `cancel {delivered_output_bytes: N}`: the longest prefix of its
 * chunks (in seq order) whose content bytes total at most N. The gateway relays whole chunks, so N
 * falls on a chunk boundary; a content-free chunk (tool-call delta) right after that boundary is
 * included, so a gateway that had not relayed it sees a different hash and settles `quarantined`
 * (never a charge for what the buyer did not get).
 */
export function chunksWithinBytes<C extends DeliveredChunk>(chunks: readonly C[], deliveredBytes: number): C[] {
  const out: C[] = [];
  let total = 0;
  for (const c of chunks) {
    total += c.content === undefined ? 0 : Buffer.byteLength(c.content, "utf8");
    if (total > deliveredBytes) break;
    out.push(c);
  }
  return out;
}

/**
 * True when an attempt delivered nothing to the buyer: no content byte and no tool-call delta (chunk
 * tokens without visible output are not delivery). Such an attempt settles `zero_settled` whatever any
 * receipt claims (docs/receipts.md: no bytes delivered and no billable work), so it never waits for a receipt.
 * Same meaning as `deliveredNothing` of the settlement actor's `attempt.ended` event.
 */
export function deliveredNothing(prefix: Pick<DeliveredPrefix, "start_byte" | "end_byte" | "tool_calls_delivered">): boolean {
  return prefix.end_byte === prefix.start_byte && !prefix.tool_calls_delivered;
}
