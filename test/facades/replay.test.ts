// Retry replays (docs/buyer-api.md) through every inference entrypoint: the responder reports the bytes it
// writes, and a retry of a finished request gets exactly those bytes (streamed or JSON) and the kept
// headers, with no second provider job. A stream the buyer aborted is cancelled at the provider and
// never replayed. Raw fetch, so the bytes compared are the bytes on the wire.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { startTestGateway, waitForReadyProviders, type TestGateway } from "../support/harness.ts";
import { ScriptedProvider, type Script } from "../support/scriptedProvider.ts";

const MODEL = "replay-model";
let gw: TestGateway;
let provider: ScriptedProvider;

/** Text, a multi-byte piece, text: four chunks, then an honest end. */
const answer: Script = (a) => {
  a.accept();
  for (const c of ["Hello", ", ", "wörld 🌊", "!"]) a.chunk(c, 1);
  a.end();
};
let script: Script = answer;

beforeAll(async () => {
  gw = await startTestGateway({ messagesFacade: true, responsesFacade: true }, { catalog: [MODEL] });
  provider = await ScriptedProvider.connect({ url: gw.wsUrl, id: "replay-prov", models: [MODEL], maxConcurrency: 8, script: (a) => script(a) });
  await waitForReadyProviders(gw, 1);
});

afterAll(async () => {
  await provider.close();
  await gw.close();
});

const routes = {
  "/v1/chat/completions": (prompt: string, stream: boolean) => ({ model: MODEL, stream, max_tokens: 16, messages: [{ role: "user", content: prompt }] }),
  "/v1/messages": (prompt: string, stream: boolean) => ({ model: MODEL, stream, max_tokens: 16, messages: [{ role: "user", content: prompt }] }),
  "/v1/responses": (prompt: string, stream: boolean) => ({ model: MODEL, stream, max_output_tokens: 16, input: prompt }),
};
type Route = keyof typeof routes;

const post = (route: Route, body: unknown, retry: number, signal?: AbortSignal) =>
  fetch(`${gw.url}${route}`, {
    method: "POST",
    headers: { authorization: `Bearer ${gw.apiKey}`, "content-type": "application/json", "x-stainless-retry-count": String(retry) },
    body: JSON.stringify(body),
    signal,
  });

const cases = Object.keys(routes).flatMap((route) => [true, false].map((stream) => [route as Route, stream] as const));

describe("a retry of a finished request replays its bytes", () => {
  test.each(cases)("%s, stream: %p", async (route, stream) => {
    script = answer;
    const body = routes[route](`replay ${route} ${stream}`, stream);
    const jobsBefore = provider.jobs.length;
    const first = await post(route, body, 0);
    expect(first.status).toBe(200);
    const firstBytes = new Uint8Array(await first.arrayBuffer());
    const retry = await post(route, body, 1);
    expect(retry.status).toBe(200);
    expect(retry.headers.get("idempotent-replayed")).toBe("true");
    for (const name of ["content-type", "cache-control", "x-request-id"]) expect(retry.headers.get(name)).toBe(first.headers.get(name));
    expect(new Uint8Array(await retry.arrayBuffer())).toEqual(firstBytes);
    expect(new TextDecoder().decode(firstBytes)).toContain(stream ? "wörld 🌊" : "Hello, wörld 🌊!");
    expect(provider.jobs.length - jobsBefore).toBe(1);
  });
});

describe("a stream the buyer aborted is cancelled at the provider and never replayed", () => {
  test.each(Object.keys(routes) as Route[])("%s", async (route) => {
    // The first attempt sends one chunk and then waits for the gateway's cancel.
    script = async (a) => {
      a.accept();
      a.chunk("Hello", 1);
      await a.cancelled(5000);
      a.end({ terminal_state: "buyer_cancel" });
    };
    const body = routes[route](`abort ${route}`, true);
    const jobsBefore = provider.jobs.length;
    const abort = new AbortController();
    const cut = await post(route, body, 0, abort.signal);
    expect(cut.status).toBe(200);
    await cut.body!.getReader().read();
    abort.abort();
    const abortedAt = performance.now();
    const attempt = provider.attempt(provider.lastJob().request_id);
    expect((await attempt.cancelled(1000)).reason).toBe("buyer_cancel");
    expect(performance.now() - abortedAt).toBeLessThan(1000);

    script = answer;
    const retry = await post(route, body, 1);
    expect(retry.status).toBe(200);
    expect(retry.headers.get("idempotent-replayed")).toBeNull();
    expect(await retry.text()).toContain("wörld 🌊");
    expect(provider.jobs.length - jobsBefore).toBe(2);
  });
});
