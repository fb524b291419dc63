// Live streams first, end to end (docs/architecture.md, "Admission and live streams"): with one
// admission a turn, a burst of streams that all arrive at once is still served in full — the gate
// delays admissions by turns, it never loses or reorders a request's answer — and a live stream keeps
// streaming while the burst is admitted. The gate's turn-by-turn bound itself is tested with stepped
// turns in test/unit/admission-gate.test.ts; the refusal of a shed request here.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { startTestGateway, waitForReadyProviders, type TestGateway } from "../support/harness.ts";
import { ScriptedProvider } from "../support/scriptedProvider.ts";
import { admitBuyerRequest, type PipelineDeps } from "../../src/http/pipeline.ts";
import { errorResponse } from "../../src/http/errors.ts";

const BURST = 40;
let gw: TestGateway;
let provider: ScriptedProvider;
/** Releases the live stream's second chunk (set by its script). */
let releaseLive: (() => void) | null = null;

beforeAll(async () => {
  gw = await startTestGateway({ admissionsPerTurn: 1, freeConcurrentRequests: BURST + 8, freeDailyTokens: 10_000_000 });
  provider = await ScriptedProvider.connect({
    url: gw.wsUrl,
    id: "gate-prov",
    models: ["test-model"],
    maxConcurrency: BURST + 8,
    script: async (a) => {
      a.accept();
      if (a.job.messages[0]?.content === "live") {
        a.chunk("first ", 1);
        await new Promise<void>((resolve) => (releaseLive = resolve));
        a.chunk("second", 1);
      } else a.chunk(`answer ${a.job.messages[0]?.content}`, 2);
      a.end();
    },
  });
  await waitForReadyProviders(gw, 1);
});

afterAll(async () => {
  await provider.close();
  await gw.close();
});

const post = (content: string, stream: boolean) =>
  fetch(`${gw.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${gw.apiKey}`, "content-type": "application/json" },
    body: JSON.stringify({ model: "test-model", stream, max_tokens: 8, messages: [{ role: "user", content }] }),
  });

test("a burst admitted one request a turn is answered in full, and a live stream keeps streaming through it", async () => {
  const live = await post("live", true);
  expect(live.status).toBe(200);
  const reader = live.body!.getReader();
  const decoder = new TextDecoder();
  let text = "";
  while (!text.includes("first ")) text += decoder.decode((await reader.read()).value!, { stream: true });

  const burst = Array.from({ length: BURST }, (_, i) => post(`b${i}`, true).then((r) => r.text().then((body) => ({ status: r.status, body }))));
  releaseLive!();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    text += decoder.decode(value, { stream: true });
  }
  expect(text).toContain('"content":"second"');
  expect(text).toContain("data: [DONE]");

  const answers = await Promise.all(burst);
  answers.forEach((a, i) => {
    expect(a.status).toBe(200);
    expect(a.body).toContain(`"content":"answer b${i}"`);
    expect(a.body).toContain("data: [DONE]");
  });
  expect(provider.errors).toEqual([]);
  // The burst's requests arrived together: all but one a turn waited for a later turn, none was shed.
  const metrics = await (await fetch(`${gw.url}/metrics`)).text();
  const waited = Number(/gateway_admission_turn_total\{outcome="waited"\} (\d+)/.exec(metrics)?.[1]);
  expect(waited).toBeGreaterThan(0);
  expect(waited).toBeLessThan(BURST);
  expect(metrics).toContain('gateway_admission_turn_total{outcome="shed"} 0');
  expect(metrics).toContain("gateway_admission_turn_waiting 0");
});

test("a request shed by the gate gets 503 coordinator_unavailable, retryable, with Retry-After, before any other check", async () => {
  let authenticated = false;
  const deps = {
    accepting: () => true,
    admission: { enter: () => false, waiting: 100 },
    maxBodyBytes: 1 << 20,
  } as unknown as PipelineDeps;
  const admitted = await admitBuyerRequest(deps, new Request("http://gw/v1/chat/completions", { method: "POST", body: "{}" }), async () => {
    authenticated = true;
    return { ok: false, error: { code: "invalid_api_key", message: "no" } } as never;
  });
  expect(admitted.ok).toBe(false);
  expect(authenticated).toBe(false);
  if (admitted.ok) return;
  const response = errorResponse(admitted.error, "req_1");
  expect(response.status).toBe(503);
  expect(response.headers.get("retry-after")).toBe("1");
  const body = (await response.json()) as { error: { code: string; type: string } };
  expect(body.error.code).toBe("coordinator_unavailable");
  expect(body.error.type).toBe("service_unavailable");
});
