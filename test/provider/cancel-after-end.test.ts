// A `cancel` that crosses the provider's `end` (docs/protocol.md): the runtime had sent `end
// normal_done` and its full receipt, but the gateway had already let the attempt go with only a prefix
// delivered. The runtime answers with a `receipt` frame bound to exactly that prefix, terminal state
// = the cancel's reason; it replaces the full receipt in the outbox. Checked with the gateway's
// verifier against a delivered record built by the independent signer (trust-support.ts).
import { afterEach, expect, test } from "bun:test";
import { mkdtemp } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { loadOrCreateProviderKey } from "../../src/provider/keys.ts";
import { ReceiptOutbox } from "../../src/provider/outbox.ts";
import { startProviderRuntime } from "../../src/provider/runtime.ts";
import { createSyntheticEngine } from "../../src/provider/synthetic.ts";
import { parseEnvelope } from "../../src/receipts/index.ts";
import type { ChunkFrame, EndFrame, ProviderFrame, ReceiptFrame } from "../../src/wire/frames.ts";
import { waitFor } from "../support/harness.ts";
import { startFakeGateway } from "./fake-gateway.ts";
import { CLOCK_MS, deliveredRecord, judge, routedJob } from "./trust-support.ts";

const HASH = "ce".repeat(32);
const PROVIDER = "prov-crossing";
const key = await loadOrCreateProviderKey(join(await mkdtemp(join(tmpdir(), "provider-crossing-")), "provider.pem"));

let cleanups: Array<() => unknown> = [];
afterEach(async () => {
  for (const cleanup of cleanups.reverse()) await cleanup();
  cleanups = [];
});

const of = (type: ProviderFrame["type"], requestId: string) => (f: ProviderFrame) => f.type === type && (f as { request_id?: string }).request_id === requestId;

async function ended(requestId: string) {
  const gateway = startFakeGateway({ heartbeatIntervalMs: 10_000 });
  const outbox = new ReceiptOutbox({ now: () => CLOCK_MS });
  const logs: Array<{ event: string } & Record<string, unknown>> = [];
  const runtime = startProviderRuntime({
    gatewayUrl: gateway.url,
    providerId: PROVIDER,
    key,
    // Tokens apart, so they leave as separate chunk frames.
    engine: createSyntheticEngine({ tokensPerSecond: 2000 }),
    models: [{ model_id: "demo-model", model_hash: HASH, max_context_tokens: 8192 }],
    backoff: { minMs: 5, maxMs: 20 },
    now: () => CLOCK_MS,
    outbox,
    log: (event, fields) => logs.push({ event, ...fields }),
  });
  cleanups.push(() => gateway.stop(), () => runtime.stop());
  const session = await gateway.session(0);
  await session.welcomed;
  const routed = routedJob({ key, providerId: PROVIDER, modelHash: HASH, overrides: { request_id: requestId } });
  session.send(routed.job);
  const end = await session.take<EndFrame>(of("end", requestId));
  const full = await session.take<ReceiptFrame>(of("receipt", requestId));
  const chunks = session.frames.filter((f): f is ChunkFrame => f.type === "chunk" && f.request_id === requestId);
  return { session, routed, end, full, chunks, outbox, logs };
}

test("a cancel after `end normal_done` is answered with a receipt for the delivered prefix, terminal state = the cancel's reason", async () => {
  const { session, routed, end, full, chunks, outbox, logs } = await ended("req-crossing");
  expect(end.terminal_state).toBe("normal_done");
  expect(chunks.length).toBeGreaterThanOrEqual(3);
  const delivered = chunks.slice(0, 2);
  const bytes = delivered.reduce((n, c) => n + Buffer.byteLength(c.content ?? "", "utf8"), 0);
  // The full receipt binds everything; against the prefix the gateway delivered it cannot verify.
  const prefixRecord = deliveredRecord(delivered, "buyer_cancel", null);
  expect(judge(routed, full.receipt, key, HASH, prefixRecord)).toMatchObject({ label: "quarantined", reason: "terminal_state_mismatch" });

  session.send({ type: "cancel", request_id: "req-crossing", attempt_n: 0, reason: "buyer_cancel", delivered_output_bytes: bytes });
  const prefix = await session.take<ReceiptFrame>((f) => of("receipt", "req-crossing")(f) && (f as ReceiptFrame).receipt !== full.receipt);
  expect(judge(routed, prefix.receipt, key, HASH, prefixRecord)).toMatchObject({
    label: "verified",
    receipt: {
      terminal_state: "buyer_cancel",
      output_prefix_end_byte: bytes,
      usage: { billable_output_tokens: delivered.reduce((n, c) => n + c.tokens, 0), delivered_output_bytes: bytes },
    },
  });
  expect(logs.find((l) => l.event === "cancel_after_end")).toMatchObject({ request_id: "req-crossing", reason: "buyer_cancel", delivered_output_bytes: bytes });
  // The outbox now holds the prefix receipt, not the full one (a reconnect re-sends only it).
  expect(outbox.ids()).toEqual([{ request_id: "req-crossing", attempt_n: 0 }]);
  const kept = outbox.flush({}, () => true);
  expect(kept).toBe(1);
});

test("gateway_timeout (the max_tokens cap) crossing `end` gets its prefix receipt too; after `settled` a cancel is ignored", async () => {
  const { session, routed, chunks, logs } = await ended("req-cap");
  const delivered = chunks.slice(0, 1);
  const bytes = Buffer.byteLength(delivered[0]!.content ?? "", "utf8");
  session.send({ type: "cancel", request_id: "req-cap", attempt_n: 0, reason: "gateway_timeout", delivered_output_bytes: bytes });
  const receipts = () => session.frames.filter((f): f is ReceiptFrame => of("receipt", "req-cap")(f));
  await session.take<ReceiptFrame>(() => receipts().length === 2);
  const body = parseEnvelope(receipts()[1]!.receipt);
  expect(body.ok && body.envelope.body.terminal_state).toBe("gateway_timeout");
  expect(judge(routed, receipts()[1]!.receipt, key, HASH, deliveredRecord(delivered, "gateway_timeout", null)).label).toBe("verified");

  session.send({ type: "settled", request_id: "req-cap", attempt_n: 0, label: "verified", reason: null, provider_credits: 1 });
  session.send({ type: "cancel", request_id: "req-cap", attempt_n: 0, reason: "buyer_cancel", delivered_output_bytes: 0 });
  await waitFor(() => logs.some((l) => l.event === "frame_ignored" && l.type === "cancel"), 2000, "the late cancel ignored");
  expect(receipts()).toHaveLength(2);
});
