// A lean mock OpenAI-compatible upstream for the benchmark (a process of its own, loopback only).
// test/support/mockUpstream.ts is built for fault injection (per-request step lists, recording); the
// benchmark needs the cheapest honest server, so that the mock's own cost stays out of the figures.
//
// The behaviour is chosen by the request's `model`, so the same upstream work happens whether the
// driver calls it directly or through a provider runtime (which always asks for a stream):
//   bench-json[-dMS]          one ~230-byte application/json chat.completion, at once or after MS ms
//   bench-sse[-nN][-iMS]      a role chunk, N content deltas of 16 bytes (default 64; the first at
//                             once, then one every MS ms, default 20, on a fixed schedule so timer
//                             lateness does not accumulate), a finish chunk, `data: [DONE]`
// Each delta's 16 bytes are the wall-clock time it was written, in microseconds (zero-padded), so a
// client on the same machine can measure each chunk's transit time. GET /v1/models lists the names
// given with --models (a provider runtime checks its upstream serves what it advertises). Prints one
// JSON line when ready.
//   bun test/bench/mock.ts [--port N] [--models a,b,…]

const encoder = new TextEncoder();
const CREATED = 1_790_000_000;

/** A ~230-byte non-streaming answer. */
const jsonBody = (model: string) =>
  JSON.stringify({
    id: "chatcmpl-bench0000000000000",
    object: "chat.completion",
    created: CREATED,
    model,
    choices: [{ index: 0, message: { role: "assistant", content: "Hello from the bench mock." }, logprobs: null, finish_reason: "stop" }],
    usage: { prompt_tokens: 70, completion_tokens: 7, total_tokens: 77 },
  });

/** Microseconds since the epoch, as the 16 bytes of one delta (comparable across local processes). */
export const stampNow = (): string => Math.round((performance.timeOrigin + performance.now()) * 1000).toString().padStart(16, "0");

type Behaviour = { kind: "json"; delayMs: number } | { kind: "sse"; deltas: number; intervalMs: number };

const behaviours = new Map<string, Behaviour | null>();

/** Parses (and caches) a model name's behaviour; null when the name is not one of the above. */
export function behaviourOf(model: string): Behaviour | null {
  let found = behaviours.get(model);
  if (found !== undefined) return found;
  let m = /^bench-json(?:-d(\d+))?$/.exec(model);
  if (m) found = { kind: "json", delayMs: Number(m[1] ?? 0) };
  else if ((m = /^bench-sse(?:-n(\d+))?(?:-i(\d+))?$/.exec(model))) found = { kind: "sse", deltas: Number(m[1] ?? 64), intervalMs: Number(m[2] ?? 20) };
  else found = null;
  behaviours.set(model, found);
  return found;
}

function sseStream(model: string, b: Extract<Behaviour, { kind: "sse" }>): ReadableStream {
  const head = `data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":${CREATED},"model":${JSON.stringify(model)},"choices":[{"index":0,"delta":`;
  const role = `${head}{"role":"assistant"},"logprobs":null,"finish_reason":null}]}\n\n`;
  const finish = `${head}{},"logprobs":null,"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n`;
  return new ReadableStream({
    type: "direct",
    async pull(controller: { write(text: string): void; flush(): void; close(): void }) {
      const start = performance.now();
      controller.write(role);
      for (let i = 0; i < b.deltas; i++) {
        if (i > 0 && b.intervalMs > 0) {
          const wait = start + i * b.intervalMs - performance.now();
          if (wait > 0) await Bun.sleep(wait);
        }
        controller.write(`${head}{"content":"${stampNow()}"},"logprobs":null,"finish_reason":null}]}\n\n`);
        controller.flush();
      }
      controller.write(finish);
      controller.flush();
      controller.close();
    },
  } as unknown as ConstructorParameters<typeof ReadableStream>[0]);
}

if (import.meta.main) {
  const i = process.argv.indexOf("--port");
  const m = process.argv.indexOf("--models");
  const models = JSON.stringify({ object: "list", data: (m > 0 ? process.argv[m + 1]!.split(",") : []).map((id) => ({ id, object: "model", created: CREATED, owned_by: "bench-mock" })) });
  const server = Bun.serve({
    port: i > 0 ? Number(process.argv[i + 1]) : 0,
    hostname: "127.0.0.1",
    idleTimeout: 0,
    async fetch(request) {
      if (request.method === "GET" && new URL(request.url).pathname === "/v1/models") return new Response(models, { headers: { "content-type": "application/json" } });
      if (request.method !== "POST") return new Response("not found", { status: 404 });
      const body = (await request.json()) as { model?: string };
      const model = typeof body.model === "string" ? body.model : "";
      const b = behaviourOf(model);
      if (!b) return Response.json({ error: { message: `unknown bench model ${model}`, type: "invalid_request_error" } }, { status: 404 });
      if (b.kind === "json") {
        if (b.delayMs > 0) await Bun.sleep(b.delayMs);
        return new Response(encoder.encode(jsonBody(model)), { headers: { "content-type": "application/json" } });
      }
      return new Response(sseStream(model, b), { headers: { "content-type": "text/event-stream", "cache-control": "no-cache" } });
    },
  });
  console.log(JSON.stringify({ event: "mock_listening", url: `http://127.0.0.1:${server.port}`, pid: process.pid }));
}
