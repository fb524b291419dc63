// `bun test/bench/actor-lifecycles.ts`: µs of XState work per request, by actor — one request actor's
// life (create, dispatch, first chunk, end), one settlement actor's (create, end, receipt verdict), an
// admitted provider session's in-flight count (attempts.counted, up and down), and the supervisor's per-request
// events. Effects are no-ops: this measures the machines alone. The request and settlement actors are
// measured twice: the step logic the gateway runs, and their statecharts run by XState's interpreter.
// CPU time (process.cpuUsage), so a busy machine slows the run but not the figures much.
import { createActor, fromPromise } from "xstate";
import { gatewayMachine } from "../../actors/gateway.ts";
import { providerSessionMachine, type AdmissionVerdict } from "../../actors/providerSession.ts";
import { providedRequestMachine, requestLogic } from "../../actors/request.ts";
import { providedSettlementMachine, settlementLogic } from "../../actors/settlement.ts";
import type { ChunkFrame, EndFrame, HelloFrame } from "../../src/wire/frames.ts";

const chunk = { type: "chunk", request_id: "r", attempt_n: 0, seq: 0, content: "x", tokens: 1 } as unknown as ChunkFrame;
const end = { type: "end", request_id: "r", attempt_n: 0, terminal_state: "normal_done", finish_reason: "stop", usage: { input_tokens: 1, output_tokens: 1 } } as unknown as EndFrame;
const attempt = { attemptN: 0, sessionId: "s", providerId: "p" };

const DELAYS = { firstByteTimeout: 30_000, streamIdleCheck: 30_000, requestDeadline: 300_000 };
const request = requestLogic({}, DELAYS);
const requestStatechart = providedRequestMachine({}, DELAYS);
const requestLife = (logic: typeof request | typeof requestStatechart) => (): void => {
  const a = createActor(logic as typeof request, { input: { requestId: "r", streaming: true, maxTokens: 16, maxAttempts: 3 } }).start();
  a.send({ type: "route.dispatched", attempt });
  a.send({ type: "provider.chunk", frame: chunk });
  a.send({ type: "provider.ended", frame: end });
  if (a.getSnapshot().status !== "done") throw new Error("request did not finish");
};

const settlement = settlementLogic({ settle: () => {} });
const settlementStatechart = providedSettlementMachine({ settle: () => {} });
const settlementLife = (logic: typeof settlement | typeof settlementStatechart) => (): void => {
  const a = createActor(logic as typeof settlement, { input: { requestId: "r", attemptN: 0, resumedPending: false, pendingDeadlineMs: 60_000 } }).start();
  a.send({ type: "attempt.ended", deliveredNothing: false, verdictDue: true });
  a.send({ type: "receipt.judged", verdict: { label: "verified" } });
  if (a.getSnapshot().status !== "done") throw new Error("settlement did not finish");
};

const gateway = createActor(gatewayMachine).start();
function supervisorEvents(): void {
  gateway.send({ type: "request.opened" });
  gateway.send({ type: "request.closed" });
}

const session = createActor(
  providerSessionMachine.provide({ actors: { admitProvider: fromPromise(async (): Promise<AdmissionVerdict> => ({ admitted: true, tier: "pinned" })) } }),
  { input: { sessionId: "s", nonce: new Uint8Array(32), heartbeatIntervalMs: 600_000 } },
).start();
const hello = { type: "hello", protocol: 1, provider_id: "p", receipt_public_key: new Uint8Array(32), runtime: { name: "x", version: "1" }, hardware: { ram_gb: 1 }, max_concurrency: 1024, models: [] } as HelloFrame;
session.send({ type: "provider.hello", frame: hello });
session.send({ type: "provider.auth", signature: new Uint8Array(64) });
await Bun.sleep(10);
if (!session.getSnapshot().matches({ admitted: "ready" })) throw new Error("session not admitted");
function sessionEvents(): void {
  session.send({ type: "attempts.counted", inFlight: 1 });
  session.send({ type: "attempts.counted", inFlight: 0 });
}

const N = Number(process.argv[2] ?? 20_000);
const lives = [
  ["request", requestLife(request)],
  ["request (statechart)", requestLife(requestStatechart)],
  ["settlement", settlementLife(settlement)],
  ["settlement (statechart)", settlementLife(settlementStatechart)],
  ["session", sessionEvents],
  ["supervisor", supervisorEvents],
] as const;
for (const [name, life] of lives) {
  for (let i = 0; i < N / 4; i++) life();
  const before = process.cpuUsage();
  for (let i = 0; i < N; i++) life();
  const used = process.cpuUsage(before);
  console.log(`${name.padEnd(24)} ${((used.user + used.system) / N).toFixed(2)} µs CPU`);
}
process.exit(0);
