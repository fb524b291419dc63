// Receipts the gateway may not have are re-sent as `receipt` frames on the next session (docs/protocol.md):
// an attempt whose session died before `end`, and an `end` whose socket died before the gateway's
// `settled`. A settled attempt's receipt is not re-sent; the outbox forgets receipts past the
// pending deadline and survives a restart when persisted.
import { afterAll, afterEach, describe, expect, test } from "bun:test";
import { mkdtemp, rm, stat } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { loadOrCreateProviderKey } from "../../src/provider/keys.ts";
import { ReceiptOutbox } from "../../src/provider/outbox.ts";
import { journalFileOf } from "../../src/provider/outboxJournal.ts";
import { startProviderRuntime } from "../../src/provider/runtime.ts";
import { createSyntheticEngine, type SyntheticOptions } from "../../src/provider/synthetic.ts";
import type { AcceptedFrame, ChunkFrame, EndFrame, ProviderFrame, ReceiptFrame } from "../../src/wire/frames.ts";
import { startFakeGateway, withTimeout } from "./fake-gateway.ts";
import { CLOCK_MS, deliveredRecord, judge, routedJob } from "./trust-support.ts";

const HASH = "cd".repeat(32);
const PROVIDER = "prov-late";
const models = [{ model_id: "demo-model", model_hash: HASH, max_context_tokens: 8192 }];
const dir = await mkdtemp(join(tmpdir(), "provider-late-"));
const key = await loadOrCreateProviderKey(join(dir, "provider.pem"));

let cleanups: Array<() => unknown> = [];
afterEach(async () => {
  for (const cleanup of cleanups.reverse()) await cleanup();
  cleanups = [];
});

function start(engine: SyntheticOptions, outbox?: ReceiptOutbox) {
  const gateway = startFakeGateway({ heartbeatIntervalMs: 10_000 });
  const logs: Array<{ event: string } & Record<string, unknown>> = [];
  const runtime = startProviderRuntime({
    gatewayUrl: gateway.url,
    providerId: PROVIDER,
    key,
    engine: createSyntheticEngine(engine),
    models,
    backoff: { minMs: 5, maxMs: 20 },
    now: () => CLOCK_MS,
    log: (event, fields) => logs.push({ event, ...fields }),
    ...(outbox ? { outbox } : {}),
  });
  cleanups.push(() => gateway.stop(), () => runtime.stop());
  let settledCount = 0;
  const wakeups = new Set<() => void>();
  runtime.on("settled", () => {
    settledCount++;
    for (const wake of [...wakeups]) wake();
  });
  const settledSeen = (n: number) =>
    withTimeout(
      new Promise<void>((resolve) => {
        const check = () => settledCount >= n && (wakeups.delete(check), resolve(), true);
        if (!check()) wakeups.add(check);
      }),
      1500,
      `${n} settled frames`,
    );
  return { gateway, runtime, logs, settledSeen };
}

const of =
  <T extends ProviderFrame["type"]>(type: T, requestId?: string) =>
  (f: ProviderFrame) =>
    f.type === type && (requestId === undefined || (f as { request_id?: string }).request_id === requestId);

describe("late receipts", () => {
  test("session lost before end: the receipt (provider_error, every chunk that reached the gateway) comes on the next session and verifies", async () => {
    const { gateway } = start({ tokensPerSecond: 0, fault: { kind: "exit-after", n: 2 } });
    const first = await gateway.session(0);
    await first.welcomed;
    const routed = routedJob({ key, providerId: PROVIDER, modelHash: HASH, overrides: { request_id: "req-lost" } });
    first.send(routed.job);
    const accepted = await first.take<AcceptedFrame>(of("accepted", "req-lost"));
    expect((await first.closed).code).toBe(1006);
    expect(first.frames.some((f) => f.type === "end")).toBe(false);
    const relayed = first.frames.filter((f): f is ChunkFrame => f.type === "chunk");
    expect(relayed.reduce((n, c) => n + c.tokens, 0)).toBe(2); // both tokens, sent before the drop

    const second = await gateway.session(1);
    const late = await second.take<ReceiptFrame>(of("receipt", "req-lost"));
    expect(late.attempt_n).toBe(0);
    const verdict = judge(routed, late.receipt, key, accepted.model_hash, deliveredRecord(relayed, "provider_error", null));
    expect(verdict).toMatchObject({ label: "verified", receipt: { terminal_state: "provider_error", usage: { billable_output_tokens: 2 } } });
  });

  test("end sent but the socket died before settled: the same receipt is re-sent on the next session", async () => {
    const { gateway } = start({ tokensPerSecond: 0 });
    const first = await gateway.session(0);
    await first.welcomed;
    const routed = routedJob({ key, providerId: PROVIDER, modelHash: HASH, overrides: { request_id: "req-unsettled" } });
    first.send(routed.job);
    await first.take<EndFrame>(of("end", "req-unsettled"));
    const sent = await first.take<ReceiptFrame>(of("receipt", "req-unsettled"));
    first.terminate();
    const second = await gateway.session(1);
    const late = await second.take<ReceiptFrame>(of("receipt", "req-unsettled"));
    expect(late.receipt).toBe(sent.receipt);
  });

  test("a settled attempt's receipt is not re-sent; a pending label keeps it", async () => {
    const { gateway, settledSeen } = start({ tokensPerSecond: 0 });
    const first = await gateway.session(0);
    await first.welcomed;
    for (const id of ["req-settled", "req-pending"]) {
      first.send(routedJob({ key, providerId: PROVIDER, modelHash: HASH, overrides: { request_id: id } }).job);
      await first.take(of("end", id));
    }
    first.send({ type: "settled", request_id: "req-pending", attempt_n: 0, label: "pending", reason: null, provider_credits: 0 });
    first.send({ type: "settled", request_id: "req-settled", attempt_n: 0, label: "verified", reason: null, provider_credits: 42 });
    await settledSeen(2);
    first.close(4012, "heartbeat_timeout");
    const second = await gateway.session(1);
    await second.welcomed;
    // Receipts are flushed right after welcome: once a later job has ended, every re-sent one is in.
    second.send(routedJob({ key, providerId: PROVIDER, modelHash: HASH, overrides: { request_id: "req-next" } }).job);
    await second.take(of("end", "req-next"));
    expect(second.frames.filter((f): f is ReceiptFrame => f.type === "receipt").map((f) => f.request_id)).toEqual(["req-pending"]);
  });

  test("an attempt that delivered nothing is not kept (the gateway settles it zero_settled at once)", async () => {
    const outbox = new ReceiptOutbox({ now: () => CLOCK_MS });
    const { gateway } = start({ fault: { kind: "stall" } }, outbox);
    const first = await gateway.session(0);
    await first.welcomed;
    first.send(routedJob({ key, providerId: PROVIDER, modelHash: HASH, overrides: { request_id: "req-empty" } }).job);
    await first.take(of("accepted", "req-empty"));
    first.send({ type: "cancel", request_id: "req-empty", attempt_n: 0, reason: "buyer_cancel", delivered_output_bytes: 0 });
    await first.take<EndFrame>(of("end", "req-empty"));
    expect((await first.take<ReceiptFrame>(of("receipt", "req-empty"))).receipt).toBeString();
    expect(outbox.size).toBe(0);
  });
});

describe("across a restart", () => {
  test("stop() with an attempt in flight: its receipt is in the outbox file, and the next process sends it", async () => {
    const file = join(dir, "restart.receipts-outbox.json");
    const first = start({ tokensPerSecond: 50 }, await ReceiptOutbox.load({ file, now: () => CLOCK_MS }));
    const session = await first.gateway.session(0);
    await session.welcomed;
    const routed = routedJob({ key, providerId: PROVIDER, modelHash: HASH, overrides: { request_id: "req-restart" } });
    session.send(routed.job);
    const accepted = await session.take<AcceptedFrame>(of("accepted", "req-restart"));
    await session.take(of("chunk", "req-restart"));
    await session.take(of("chunk", "req-restart"));
    await first.runtime.stop(); // SIGTERM in the CLI
    expect(session.frames.some((f) => f.type === "end")).toBe(false);
    const relayed = session.frames.filter((f): f is ChunkFrame => f.type === "chunk");
    expect(first.logs.find((l) => l.event === "receipt_held")).toMatchObject({ request_id: "req-restart" });

    const second = start({ tokensPerSecond: 0 }, await ReceiptOutbox.load({ file, now: () => CLOCK_MS }));
    const next = await second.gateway.session(0);
    const late = await next.take<ReceiptFrame>(of("receipt", "req-restart"));
    const verdict = judge(routed, late.receipt, key, accepted.model_hash, deliveredRecord(relayed, "provider_error", null));
    expect(verdict).toMatchObject({ label: "verified" });
  });
});

describe("receipt outbox", () => {
  test("forgets a receipt after the pending deadline (counted from the terminal time)", () => {
    let now = 1_000_000;
    const logs: string[] = [];
    const outbox = new ReceiptOutbox({ now: () => now, deadlineMs: 300_000, log: (e) => logs.push(e) });
    outbox.keep({ request_id: "r1", attempt_n: 0 }, "env-1", now, null);
    now += 300_000;
    const sent: ProviderFrame[] = [];
    expect(outbox.flush({}, (f) => (sent.push(f), true))).toBe(1);
    now += 1;
    expect(outbox.flush({}, (f) => (sent.push(f), true))).toBe(0);
    expect(outbox.size).toBe(0);
    expect(logs).toContain("receipt_expired");
    expect(sent).toEqual([{ type: "receipt", request_id: "r1", attempt_n: 0, receipt: "env-1" }]);
  });

  test("sends each receipt once per session; an unsendable one waits for the next try", () => {
    const outbox = new ReceiptOutbox({ now: () => 0 });
    const a = {};
    const b = {};
    outbox.keep({ request_id: "r1", attempt_n: 0 }, "env-1", 0, a);
    outbox.keep({ request_id: "r2", attempt_n: 1 }, "env-2", 0, null);
    const onA: string[] = [];
    expect(outbox.flush(a, (f) => (onA.push((f as ReceiptFrame).request_id), true))).toBe(1);
    expect(onA).toEqual(["r2"]);
    expect(outbox.flush(b, () => false)).toBe(0);
    const onB: string[] = [];
    expect(outbox.flush(b, (f) => (onB.push((f as ReceiptFrame).request_id), true))).toBe(2);
    expect(onB).toEqual(["r1", "r2"]);
  });

  test("drops the oldest beyond its size limit", () => {
    const outbox = new ReceiptOutbox({ now: () => 0, maxEntries: 2 });
    for (const id of ["r1", "r2", "r3"]) outbox.keep({ request_id: id, attempt_n: 0 }, id, 0, null);
    expect(outbox.ids().map((i) => i.request_id)).toEqual(["r2", "r3"]);
  });

  test("persisted (mode 0600) and restored after a restart; expired ones are not restored", async () => {
    const file = join(dir, "receipts-outbox.json");
    let now = 5_000;
    const outbox = new ReceiptOutbox({ now: () => now, file, deadlineMs: 1_000 });
    outbox.keep({ request_id: "r-old", attempt_n: 0 }, "env-old", 4_000, null);
    outbox.keep({ request_id: "r-new", attempt_n: 2 }, "env-new", 5_000, {});
    outbox.settled({ request_id: "r-gone", attempt_n: 0 }, "verified");
    await outbox.saved();
    for (const f of [file, journalFileOf(file)]) expect((await stat(f)).mode & 0o777).toBe(0o600);
    expect((await ReceiptOutbox.load({ file, now: () => now, deadlineMs: 1_000 })).size).toBe(2);

    now = 5_500; // r-old's deadline (5_000) has passed, r-new's (6_000) has not
    const restored = await ReceiptOutbox.load({ file, now: () => now, deadlineMs: 1_000 });
    expect(restored.ids()).toEqual([{ request_id: "r-new", attempt_n: 2 }]);
    // Restored receipts count as unsent: the first session after the restart gets them.
    const sent: ProviderFrame[] = [];
    restored.flush({}, (f) => (sent.push(f), true));
    expect(sent).toEqual([{ type: "receipt", request_id: "r-new", attempt_n: 2, receipt: "env-new" }]);
    restored.settled({ request_id: "r-new", attempt_n: 2 }, "quarantined");
    await restored.saved();
    expect((await ReceiptOutbox.load({ file, now: () => now, deadlineMs: 1_000 })).size).toBe(0);
  });

  test("an unreadable file starts empty", async () => {
    const file = join(dir, "garbage.json");
    await Bun.write(file, "{not json");
    const logs: string[] = [];
    const outbox = await withTimeout(ReceiptOutbox.load({ file, log: (e) => logs.push(e) }), 1000, "load");
    expect(outbox.size).toBe(0);
    expect(logs).toEqual(["receipt_outbox_unreadable"]);
  });
});

afterAll(() => rm(dir, { recursive: true, force: true }));
