// A buyer's cancel that crosses the provider's `end normal_done` (docs/protocol.md, docs/receipts.md):
// the provider is paid, and the buyer charged, exactly for the delivered prefix. The gateway does not
// settle on the full-output receipt of the crossing `end`; it waits, until the pending deadline, for the
// provider's receipt bound to the cancel's `delivered_output_bytes` with the cancel's reason as its
// terminal state. Wire details with the scripted provider (independent signer); the whole flow with the
// real provider runtime behind a relay that holds its frames until the gateway's cancel has passed, so
// the crossing happens every time.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { join } from "node:path";
import type { ServerWebSocket } from "bun";
import { loadOrCreateProviderKey } from "../../src/provider/keys.ts";
import { startProviderRuntime, type ProviderRuntime } from "../../src/provider/runtime.ts";
import { createSyntheticEngine } from "../../src/provider/synthetic.ts";
import { decodeGatewayFrame, decodeProviderFrame } from "../../src/wire/codec.ts";
import { modelHash, startTestGateway, waitFor, waitForReadyProviders, type TestGateway } from "../support/harness.ts";
import { ScriptedProvider, utf8, type Script } from "../support/scriptedProvider.ts";
import { expectedCharge, expectLedgerBalanced, ledgerAudit, paidBuyer, settledRow, type Buyer } from "./support.ts";

const MODEL = "crossing-model";
const REAL_MODEL = "crossing-real";
const messages = [{ role: "user" as const, content: "Tell a long story." }];
const INPUT_TOKENS = 6;
const PENDING_DEADLINE_MS = 1500;
const CHUNKS: [string, number][] = [
  ["Once upon ", 3],
  ["a time ", 2],
  ["there was ", 3],
];

let gw: TestGateway;
let provider: ScriptedProvider;
let buyer: Buyer;
let script: Script;

beforeAll(async () => {
  gw = await startTestGateway({ settlementMode: "enforce", pendingDeadlineMs: PENDING_DEADLINE_MS }, { catalog: [MODEL, REAL_MODEL] });
  provider = await ScriptedProvider.connect({ url: gw.wsUrl, id: "crossing-prov", models: [MODEL], inputTokens: INPUT_TOKENS, script: (a) => script(a) });
  await waitForReadyProviders(gw, 1);
  buyer = await paidBuyer(gw, 1_000_000);
});

afterAll(async () => {
  await provider.close();
  await gw.close();
});

/** Streams `model`, aborting after the first content delta; returns the text the buyer saw. */
async function firstDeltaThenAbort(model: string, beforeAbort: () => Promise<void> = async () => {}): Promise<string> {
  const controller = new AbortController();
  let text = "";
  try {
    const s = await buyer.client.chat.completions.create({ model, messages, stream: true, max_tokens: 64 }, { signal: controller.signal });
    for await (const c of s) {
      const d = c.choices[0]?.delta.content;
      if (!d) continue;
      text += d;
      await beforeAbort();
      controller.abort();
    }
  } catch {}
  return text;
}

const buyerBalance = () => gw.gateway.store.ledgerBalance(`buyer:${buyer.accountId}`);

describe("scripted provider (independent signer)", () => {
  /** The provider "sent" end normal_done before the cancel reached it: it arrives after the gateway's cancel. */
  const crossing =
    (inline: boolean, answer: boolean): Script =>
    async (a) => {
      a.accept();
      a.chunk(CHUNKS[0]![0], CHUNKS[0]![1]);
      const cancel = await a.cancelled();
      for (const [c, t] of CHUNKS.slice(1)) a.chunk(c, t);
      // The full-output receipt, in `end` or in the `receipt` frame right after it.
      const full = a.receipt();
      a.end(inline ? { receipt: full } : { receipt: null });
      if (!inline) a.sendReceipt(full);
      if (answer) a.sendReceipt(a.receipt({ terminal_state: "buyer_cancel", finish_reason: null, boundBytes: cancel.delivered_output_bytes }));
    };

  test.each([
    ["full receipt in `end`", true],
    ["full receipt in a `receipt` frame after `end`", false],
  ])("%s, then the prefix receipt: verified, charged exactly the delivered prefix", async (_name, inline) => {
    script = crossing(inline, true);
    const before = await buyerBalance();
    expect(await firstDeltaThenAbort(MODEL)).toBe(CHUNKS[0]![0]);
    const requestId = provider.lastJob().request_id;
    const cancel = await provider.attempt(requestId).cancelled();
    expect(cancel).toMatchObject({ reason: "buyer_cancel", delivered_output_bytes: utf8(CHUNKS[0]![0]) });
    const row = await settledRow(gw, requestId);
    const charge = expectedCharge(INPUT_TOKENS, CHUNKS[0]![1], 1_000_000, 1_000_000);
    expect(row).toMatchObject({ label: "verified", reason: null, billed_completion_tokens: CHUNKS[0]![1], debit_credits: charge.debit, provider_credits: charge.provider });
    expect(row.delivered).toMatchObject({ terminal_state: "buyer_cancel", end_byte: utf8(CHUNKS[0]![0]), tokens: CHUNKS[0]![1] });
    expect(await buyerBalance()).toBe(before - charge.debit);
    expect(await provider.waitForSettled(requestId)).toMatchObject({ label: "verified", provider_credits: charge.provider });
  });

  test("no prefix receipt: the full one is not settled on; the attempt waits for the pending deadline (no_receipt)", async () => {
    script = crossing(false, false);
    const before = await buyerBalance();
    expect(await firstDeltaThenAbort(MODEL)).toBe(CHUNKS[0]![0]);
    const requestId = provider.lastJob().request_id;
    await provider.attempt(requestId).cancelled();
    // Well after the full receipt arrived, the attempt is still pending.
    await Bun.sleep(PENDING_DEADLINE_MS / 3);
    expect((await gw.gateway.store.getSettlement(requestId, 0))?.label).toBe("pending");
    const row = await settledRow(gw, requestId, 0, PENDING_DEADLINE_MS + 4000);
    expect(row).toMatchObject({ label: "quarantined", reason: "no_receipt", debit_credits: 0 });
    expect(await buyerBalance()).toBe(before);
  });
});

/**
 * A relay between a provider runtime and the gateway. Once armed for a request, it passes the
 * provider's frames of that request only up to and including its first chunk, holds the rest, and
 * releases them once the gateway's `cancel` for it has gone through: the gateway sees `end` after it
 * let the attempt go, exactly as when the two frames cross on the wire.
 */
function startHoldingRelay(gatewayUrl: string) {
  let armed: string | null = null;
  let heldFor: string | null = null;
  let chunksPassed = 0;
  const held: Uint8Array[] = [];
  let endHeld: () => void = () => {};
  type Link = { upstream: WebSocket; queue: Uint8Array[] };
  const server = Bun.serve<Link>({
    hostname: "127.0.0.1",
    port: 0,
    fetch(req, srv) {
      const upstream = new WebSocket(gatewayUrl);
      upstream.binaryType = "arraybuffer";
      return srv.upgrade(req, { data: { upstream, queue: [] } }) ? undefined : new Response("no", { status: 400 });
    },
    websocket: {
      open(ws: ServerWebSocket<Link>) {
        const { upstream } = ws.data;
        upstream.addEventListener("open", () => {
          for (const f of ws.data.queue.splice(0)) upstream.send(f);
        });
        upstream.addEventListener("message", (e) => {
          const bytes = new Uint8Array(e.data as ArrayBuffer);
          ws.send(bytes);
          const frame = decodeGatewayFrame(bytes);
          if (frame.ok && frame.frame.type === "cancel" && frame.frame.request_id === heldFor) {
            heldFor = null;
            for (const f of held.splice(0)) upstream.send(f);
          }
        });
        upstream.addEventListener("close", () => ws.close());
      },
      message(ws: ServerWebSocket<Link>, data) {
        const bytes = new Uint8Array(data as Uint8Array);
        const decoded = decodeProviderFrame(bytes);
        const f = decoded.ok ? decoded.frame : null;
        if (f && "request_id" in f && f.request_id === armed) {
          if (f.type === "chunk" && chunksPassed++ === 0) heldFor = armed;
          else if (heldFor === armed && f.type !== "accepted") {
            held.push(bytes);
            if (f.type === "end") endHeld();
            return;
          }
        }
        if (ws.data.upstream.readyState === WebSocket.OPEN) ws.data.upstream.send(bytes);
        else ws.data.queue.push(bytes);
      },
      close(ws: ServerWebSocket<Link>) {
        ws.data.upstream.close();
      },
    },
  });
  return {
    url: `ws://127.0.0.1:${server.port}/v1/provider/connect`,
    arm(requestId: string) {
      armed = requestId;
      chunksPassed = 0;
    },
    /** Resolves once the armed request's `end` is held (the runtime has ended the attempt). */
    endHeld: () => new Promise<void>((resolve) => (endHeld = resolve)),
    stop: () => server.stop(true),
  };
}

describe("real provider runtime", () => {
  let runtime: ProviderRuntime;
  let relay: ReturnType<typeof startHoldingRelay>;
  const jobs: string[] = [];
  let crossings = 0;

  beforeAll(async () => {
    relay = startHoldingRelay(gw.wsUrl);
    const key = await loadOrCreateProviderKey(join(gw.dataDir, "provider-keys", "real.key"));
    runtime = startProviderRuntime({
      gatewayUrl: relay.url,
      providerId: "real-crossing",
      key,
      // Tokens apart: separate chunk frames, all sent (with `end`) long before the buyer's cancel.
      engine: createSyntheticEngine({ tokensPerSecond: 5000 }),
      models: [{ model_id: REAL_MODEL, model_hash: modelHash(REAL_MODEL), max_context_tokens: 8192 }],
      backoff: { minMs: 20, maxMs: 100 },
      log: (event) => void (event === "cancel_after_end" && crossings++),
    });
    runtime.on("job", (requestId) => {
      jobs.push(requestId);
      relay.arm(requestId);
    });
    await waitForReadyProviders(gw, 2);
  });

  afterAll(async () => {
    await runtime.stop();
    relay.stop();
  });

  test("`end normal_done` crossing the buyer's cancel: the runtime's prefix receipt settles it verified, charged the delivered prefix", async () => {
    const before = await buyerBalance();
    const ended = relay.endHeld();
    // The buyer cancels only once the runtime has sent `end`: the two cross.
    const seen = await firstDeltaThenAbort(REAL_MODEL, () => ended);
    expect(seen.length).toBeGreaterThan(0);
    const requestId = jobs.at(-1)!;
    const row = await settledRow(gw, requestId, 0, 5000);
    expect(row).toMatchObject({ label: "verified", reason: null });
    expect(row.delivered).toMatchObject({ terminal_state: "buyer_cancel", end_byte: utf8(seen) });
    // One chunk reached the buyer; the rest was produced (and ended normal_done) but never delivered.
    expect(row.billed_completion_tokens).toBe(row.delivered!.tokens);
    const charge = expectedCharge(row.billed_prompt_tokens, row.delivered!.tokens, 1_000_000, 1_000_000);
    expect(row.debit_credits).toBe(charge.debit);
    expect(await buyerBalance()).toBe(before - charge.debit);
    await waitFor(async () => (await gw.gateway.store.ledgerBalance("provider:real-crossing")) === charge.provider, 2000, "the provider credited");
    expect(crossings).toBe(1); // the runtime answered a cancel for an attempt it had already ended
  });
});

test("the ledger balances and the audit is clean", () => {
  expectLedgerBalanced(gw);
  const audit = ledgerAudit(gw.dataDir);
  expect(audit.report.findings).toEqual([]);
  expect(provider.errors).toEqual([]);
});
