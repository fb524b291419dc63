// Frame decoding under random input: every frame type, mutated, and random bytes. Decoding never
// throws, answers a protocol close code on failure, returns only frames its schema accepts, and the
// per-token chunk decoder always agrees with the general msgpack + schema path.
import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { Packr } from "msgpackr";
import { decodeGatewayFrame, decodeProviderFrame, decodeProviderFrameGeneral, encodeFrame } from "../../src/wire/codec.ts";
import { gatewayFrameCheckers, providerFrameCheckers, type GatewayFrame, type ProviderFrame } from "../../src/wire/frames.ts";
import { runs } from "./runs.ts";

const packr = new Packr({ useRecords: false, mapsAsObjects: true, variableMapSize: true });
const CLOSE_CODES = new Set([1003, 1007, 1008]);
const hash = "ab".repeat(32);
const rid = "req_0123456789abcdef01234567";

/** One valid frame of every type each side may send. */
const providerFrames: ProviderFrame[] = [
  {
    type: "hello",
    protocol: 1,
    provider_id: "prov-1",
    receipt_public_key: new Uint8Array(32).fill(7),
    runtime: { name: "fuzz", version: "1" },
    hardware: { ram_gb: 16 },
    max_concurrency: 4,
    models: [{ model_id: "m", model_hash: hash, max_context_tokens: 8192 }],
  } as ProviderFrame,
  { type: "auth", signature: new Uint8Array(64).fill(1) } as ProviderFrame,
  { type: "heartbeat", state: "ready", slots_free: 2, models: [{ model_id: "m", model_hash: hash, max_context_tokens: 8192 }] } as ProviderFrame,
  { type: "accepted", request_id: rid, attempt_n: 0, model_hash: hash } as ProviderFrame,
  { type: "declined", request_id: rid, attempt_n: 0, code: "queue_full" } as ProviderFrame,
  { type: "chunk", request_id: rid, attempt_n: 0, seq: 3, content: "Hello", tokens: 1 },
  { type: "chunk", request_id: rid, attempt_n: 1, seq: 0, tool_calls: [{ index: 0, id: "c", name: "f", arguments: "{}" }], tokens: 2 },
  { type: "end", request_id: rid, attempt_n: 0, terminal_state: "normal_done", finish_reason: "stop", usage: { input_tokens: 3, output_tokens: 4 }, receipt: "a.b" },
  { type: "receipt", request_id: rid, attempt_n: 0, receipt: "a.b" },
];
const gatewayFrames = [
  { type: "challenge", session_id: "sess_1", nonce: new Uint8Array(32).fill(9) },
  { type: "drain" },
  { type: "cancel", request_id: rid, attempt_n: 0, reason: "buyer_cancel", delivered_output_bytes: 5 },
  { type: "settled", request_id: rid, attempt_n: 0, label: "verified", reason: null, provider_credits: 9 },
] as GatewayFrame[];

/** Values a hostile peer might put anywhere. */
const hostileValue = fc.oneof(
  fc.anything({ maxDepth: 2 }),
  fc.string({ unit: "binary" }),
  fc.integer(),
  fc.double(),
  fc.constantFrom(-1, 2 ** 53, Number.NaN, Infinity, "", null, true, [], {}, "\ud800", 0.5),
  fc.uint8Array({ maxLength: 70 }),
);

type Mutation = { kind: "set"; key: string; value: unknown } | { kind: "delete"; key: string } | { kind: "add"; key: string; value: unknown };

const mutation = (frame: Record<string, unknown>): fc.Arbitrary<Mutation> =>
  fc.oneof(
    fc.record({ kind: fc.constant("set" as const), key: fc.constantFrom(...Object.keys(frame)), value: hostileValue }),
    fc.record({ kind: fc.constant("delete" as const), key: fc.constantFrom(...Object.keys(frame)) }),
    fc.record({ kind: fc.constant("add" as const), key: fc.string({ maxLength: 12 }), value: hostileValue }),
  );

function mutate(frame: Record<string, unknown>, mutations: Mutation[]): Record<string, unknown> {
  const out: Record<string, unknown> = { ...frame };
  for (const m of mutations) {
    if (m.kind === "delete") delete out[m.key];
    else out[m.key] = m.value;
  }
  return out;
}

/** The decoder's contract on any input: no throw, a close code on failure, a schema-valid frame on success. */
function expectContract(bytes: Uint8Array): void {
  const fast = decodeProviderFrame(bytes);
  const general = decodeProviderFrameGeneral(bytes);
  if (!fast.ok) expect(CLOSE_CODES.has(fast.closeCode)).toBe(true);
  else expect(providerFrameCheckers[fast.frame.type].Check(fast.frame)).toBe(true);
  // The chunk fast path must be indistinguishable from the general path.
  expect(fast.ok).toBe(general.ok);
  if (fast.ok && general.ok) expect(fast.frame).toEqual(general.frame);
  else if (!fast.ok && !general.ok) expect(fast.closeCode).toBe(general.closeCode);
  const toProvider = decodeGatewayFrame(bytes);
  if (!toProvider.ok) expect(CLOSE_CODES.has(toProvider.closeCode)).toBe(true);
  else expect(gatewayFrameCheckers[toProvider.frame.type].Check(toProvider.frame)).toBe(true);
}

describe("frame decoding (fuzzed)", () => {
  test("valid frames of every type round-trip", () => {
    for (const frame of providerFrames) {
      const decoded = decodeProviderFrame(encodeFrame(frame));
      expect(decoded.ok).toBe(true);
    }
    for (const frame of gatewayFrames) expect(decodeGatewayFrame(encodeFrame(frame)).ok).toBe(true);
  });

  test("random bytes", () => {
    fc.assert(fc.property(fc.uint8Array({ maxLength: 300 }), (bytes) => expectContract(bytes)), runs(400));
  }, 3_600_000);

  test("every frame type with mutated fields", () => {
    const frames = [...providerFrames, ...gatewayFrames] as unknown as Record<string, unknown>[];
    const arb = fc.integer({ min: 0, max: frames.length - 1 }).chain((i) => fc.tuple(fc.constant(i), fc.array(mutation(frames[i]!), { minLength: 1, maxLength: 3 })));
    fc.assert(
      fc.property(arb, ([i, mutations]) => {
        let bytes: Uint8Array;
        try {
          bytes = packr.pack(mutate(frames[i]!, mutations));
        } catch {
          return; // a value msgpack cannot carry never reaches the wire
        }
        expectContract(bytes);
      }),
      runs(400),
    );
  }, 3_600_000);

  test("encoded frames with flipped, cut and inserted bytes", () => {
    const encoded = [...providerFrames, ...gatewayFrames].map((f) => encodeFrame(f));
    const edit = fc.oneof(
      fc.record({ kind: fc.constant("flip" as const), at: fc.nat(), bits: fc.integer({ min: 1, max: 255 }) }),
      fc.record({ kind: fc.constant("cut" as const), at: fc.nat() }),
      fc.record({ kind: fc.constant("insert" as const), at: fc.nat(), byte: fc.integer({ min: 0, max: 255 }) }),
    );
    fc.assert(
      fc.property(fc.integer({ min: 0, max: encoded.length - 1 }), fc.array(edit, { minLength: 1, maxLength: 4 }), (i, edits) => {
        let bytes = Array.from(encoded[i]!);
        for (const e of edits) {
          const at = e.at % Math.max(1, bytes.length);
          if (e.kind === "flip") bytes[at] = (bytes[at] ?? 0) ^ e.bits;
          else if (e.kind === "cut") bytes = bytes.slice(0, at);
          else bytes.splice(at, 0, e.byte);
        }
        expectContract(new Uint8Array(bytes));
      }),
      runs(400),
    );
  }, 3_600_000);
});
