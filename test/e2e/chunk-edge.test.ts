// Chunks after an attempt's first are judged at the edge of the request actor (src/gateway/chunkMeter.ts),
// end to end: a bad seq and the max_tokens cap mid-stream, a bad seq in a non-streaming body (failover),
// and the coarse idle watchdog — real sockets, the openai SDK, scripted providers.
import { afterEach, expect, test } from "bun:test";
import OpenAI from "openai";
import { startTestGateway, waitForReadyProviders, type TestGateway } from "../support/harness.ts";
import { ScriptedProvider, type Script, type ScriptedAttempt } from "../support/scriptedProvider.ts";

const MODEL = "edge-model";
const messages = [{ role: "user" as const, content: "Say something." }];

let gw: TestGateway | undefined;
let providers: ScriptedProvider[] = [];

afterEach(async () => {
  await Promise.all(providers.map((p) => p.close()));
  providers = [];
  await gw?.close();
  gw = undefined;
});

async function setup(scripts: Record<string, Script>, overrides = {}): Promise<OpenAI> {
  gw = await startTestGateway(overrides, { catalog: [MODEL] });
  for (const [id, script] of Object.entries(scripts)) {
    providers.push(await ScriptedProvider.connect({ url: gw.wsUrl, id, models: [MODEL], script }));
  }
  await waitForReadyProviders(gw, providers.length);
  return new OpenAI({ apiKey: gw.apiKey, baseURL: gw.baseURL, maxRetries: 0 });
}

/** A chunk with the seq given (ScriptedAttempt.chunk always sends the next one). */
const rawChunk = (a: ScriptedAttempt, seq: number, content: string, tokens = 1) =>
  a.provider.send({ type: "chunk", request_id: a.job.request_id, attempt_n: a.job.attempt_n, seq, content, tokens });

async function stream(client: OpenAI, maxTokens = 64) {
  const s = await client.chat.completions.create({
    model: MODEL,
    messages,
    max_tokens: maxTokens,
    stream: true,
    stream_options: { include_usage: true },
  });
  let text = "";
  let finish: string | null = null;
  let completionTokens: number | null = null;
  let error: unknown = null;
  try {
    for await (const c of s) {
      text += c.choices[0]?.delta.content ?? "";
      finish = c.choices[0]?.finish_reason ?? finish;
      if (c.usage) completionTokens = c.usage.completion_tokens;
    }
  } catch (e) {
    error = e;
  }
  return { text, finish, completionTokens, error };
}

test("streaming: a seq gap after output ends the stream with provider_disconnected; the cancel names the delivered bytes", async () => {
  const client = await setup({
    "p-gap": async (a) => {
      a.accept();
      a.chunk("Hello ", 1);
      a.chunk("wörld", 1);
      rawChunk(a, 7, "never shown");
      await a.cancelled();
    },
  });
  const { text, error } = await stream(client);
  expect(text).toBe("Hello wörld");
  expect(String((error as Error)?.message ?? error)).toContain("provider");
  const cancel = await providers[0]!.attempt(providers[0]!.lastJob().request_id).cancelled();
  expect(cancel).toMatchObject({ reason: "gateway_timeout", delivered_output_bytes: Buffer.byteLength("Hello wörld") });
});

test("streaming: a chunk past max_tokens mid-stream is not relayed; finish_reason length, usage counts what was relayed", async () => {
  const client = await setup({
    "p-long": async (a) => {
      a.accept();
      a.chunk("ab", 2);
      a.chunk("cd", 2);
      a.chunk("ef", 1);
      await a.cancelled();
    },
  });
  const { text, finish, completionTokens, error } = await stream(client, 4);
  expect(error).toBeNull();
  expect(text).toBe("abcd");
  expect(finish).toBe("length");
  expect(completionTokens).toBe(4);
  const cancel = await providers[0]!.attempt(providers[0]!.lastJob().request_id).cancelled();
  expect(cancel).toMatchObject({ reason: "gateway_timeout", delivered_output_bytes: 4 });
});

test("non-streaming: a seq gap after output discards the body and fails over; the cancel says nothing was delivered", async () => {
  const client = await setup({
    // Routing breaks ties by provider id: the faulty one is tried first.
    "a-gap": async (a) => {
      a.accept();
      a.chunk("partial ", 2);
      rawChunk(a, 5, "gap");
      await a.cancelled();
    },
    "z-good": (a) => {
      a.accept();
      a.chunk("Hello, ", 2);
      a.chunk("world!", 1);
      a.end();
    },
  });
  const res = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 64 });
  expect(res.choices[0]!.message.content).toBe("Hello, world!");
  expect(res.usage?.completion_tokens).toBe(3);
  const gap = providers[0]!;
  expect(await gap.attempt(gap.lastJob().request_id).cancelled()).toMatchObject({ reason: "gateway_timeout", delivered_output_bytes: 0 });
});

test("a stream that goes silent is cut after the stall limit, not before (and well within 1.5 × it)", async () => {
  const STALL_MS = 400;
  let lastChunkAt = 0;
  const client = await setup(
    {
      "p-silent": async (a) => {
        a.accept();
        a.chunk("one ", 1);
        a.chunk("two", 1);
        lastChunkAt = performance.now();
        await a.cancelled(5000);
      },
    },
    { streamIdleTimeoutMs: STALL_MS },
  );
  const { text, error } = await stream(client);
  expect(text).toBe("one two");
  expect(error).not.toBeNull();
  const cancel = await providers[0]!.attempt(providers[0]!.lastJob().request_id).cancelled();
  const silentMs = performance.now() - lastChunkAt;
  expect(cancel).toMatchObject({ reason: "gateway_timeout", delivered_output_bytes: 7 });
  expect(silentMs).toBeGreaterThanOrEqual(STALL_MS - 5);
  // 1.5 × the limit, plus slack for a loaded machine.
  expect(silentMs).toBeLessThan(1.5 * STALL_MS + 1000);
});
