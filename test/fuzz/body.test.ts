// Buyer body validation under random input, through a real gateway on loopback: random bytes, random
// JSON, and valid chat, messages and responses bodies with fields replaced by hostile values. Every
// answer is below 500 with the error envelope (no provider is connected, so a valid body is refused
// with 404/503, never a 5xx of the gateway's own), and the process keeps serving.
import { afterAll, beforeAll, describe, test } from "bun:test";
import fc from "fast-check";
import { startTestGateway, type TestGateway } from "../support/harness.ts";
import { runs } from "./runs.ts";

let gw: TestGateway;
beforeAll(async () => {
  gw = await startTestGateway({ messagesFacade: true, responsesFacade: true });
});
afterAll(async () => {
  await gw.close();
});

const valid = {
  "/v1/chat/completions": { model: "m", messages: [{ role: "user", content: "hi", name: "n" }], max_tokens: 4, stream: false, stop: ["x"], temperature: 0.5, tools: [{ type: "function", function: { name: "f", parameters: { type: "object" } } }] },
  "/v1/messages": { model: "m", max_tokens: 4, messages: [{ role: "user", content: [{ type: "text", text: "hi" }] }], system: "s", stop_sequences: ["x"] },
  "/v1/responses": { model: "m", input: [{ role: "user", content: "hi" }], max_output_tokens: 4, instructions: "i" },
} as const;
type Route = keyof typeof valid;
const routes = Object.keys(valid) as Route[];

const hostile = fc.oneof(
  fc.jsonValue({ maxDepth: 3 }),
  fc.string({ unit: "binary", maxLength: 40 }),
  fc.constantFrom(-1, 0, 2 ** 53, 1e308, -0, "", null, [], {}, "\ud800", "a\udfff", [null], [{}], { role: "tool" }, 4.5, "user"),
);

/** Paths into a body: each object member or array element, to any depth. */
function paths(value: unknown, prefix: (string | number)[] = []): (string | number)[][] {
  if (value === null || typeof value !== "object") return [prefix];
  const children = Array.isArray(value) ? value.map((_, i) => i) : Object.keys(value);
  return [prefix, ...children.flatMap((k) => paths((value as Record<string | number, unknown>)[k], [...prefix, k]))];
}

function setAt(body: unknown, path: (string | number)[], v: unknown): unknown {
  if (path.length === 0) return v;
  const copy: Record<string | number, unknown> = structuredClone(body) as Record<string | number, unknown>;
  let at = copy;
  for (const key of path.slice(0, -1)) at = at[key] as Record<string | number, unknown>;
  at[path.at(-1)!] = v;
  return copy;
}

async function send(route: Route, body: string | Uint8Array): Promise<void> {
  const response = await fetch(`${gw.url}${route}`, {
    method: "POST",
    headers: { authorization: `Bearer ${gw.apiKey}`, "x-api-key": gw.apiKey, "content-type": "application/json", "anthropic-version": "2023-06-01" },
    body,
  });
  const text = await response.text();
  if (response.status >= 500 && response.status !== 503) throw new Error(`${response.status} on ${route}: ${text} for ${typeof body === "string" ? body : "bytes"}`);
  if (response.status >= 400 && !text.includes('"error"')) throw new Error(`no error envelope: ${text}`);
}

describe("buyer body validation (fuzzed, real HTTP)", () => {
  test("valid bodies with one or two fields replaced by hostile values", async () => {
    const arb = fc.constantFrom(...routes).chain((route) => {
      const all = paths(valid[route]);
      return fc.tuple(fc.constant(route), fc.array(fc.tuple(fc.constantFrom(...all), hostile), { minLength: 1, maxLength: 2 }));
    });
    await fc.assert(
      fc.asyncProperty(arb, async ([route, edits]) => {
        let body: unknown = valid[route];
        for (const [path, v] of edits) {
          try {
            body = setAt(body, path, v);
          } catch {
            return; // the path went away with an earlier edit
          }
        }
        await send(route, JSON.stringify(body));
      }),
      runs(100),
    );
  }, 3_600_000);

  test("random JSON and random bytes", async () => {
    await fc.assert(
      fc.asyncProperty(fc.constantFrom(...routes), fc.oneof(fc.jsonValue({ maxDepth: 4 }).map((v) => JSON.stringify(v) ?? "null"), fc.uint8Array({ maxLength: 200 }), fc.string({ unit: "binary" })), async (route, body) => {
        await send(route, body);
      }),
      runs(100),
    );
  }, 3_600_000);
});
