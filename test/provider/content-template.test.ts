// The content-delta template (src/provider/openai/contentTemplate.ts): a stream's payloads mapped
// through it give exactly what parsing and mapping each one gives — on every recorded upstream stream
// and on generated streams of awkward texts — and it takes the full path for anything it cannot prove.
import { describe, expect, test } from "bun:test";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { chunkContent, createChunkMapper, createStreamPayloadMapper, type MappedPayload } from "../../src/provider/openai/chunk.ts";
import { ContentDeltaTemplate } from "../../src/provider/openai/contentTemplate.ts";
import { parseJson } from "../../src/provider/openai/errors.ts";
import { FIXTURE_DIR } from "../support/mockUpstream.ts";

/** A payload's mapping without the `plain` mark (which only says whether it may teach the template). */
const bare = (m: MappedPayload) => {
  const { plain: _plain, ...rest } = m as MappedPayload & { plain?: true };
  return rest;
};
/** Each payload parsed and mapped on its own, in order (the reference). */
const reference = (payloads: readonly string[]) => {
  const mapper = createChunkMapper();
  return payloads.map((p) => {
    const parsed = parseJson(p);
    return parsed === undefined ? { kind: "malformed" as const } : bare(mapper.chunk(parsed));
  });
};
const throughTemplate = (payloads: readonly string[]) => {
  const map = createStreamPayloadMapper();
  return payloads.map((p) => bare(map(p)));
};
const contentOf = (data: string) => chunkContent(parseJson(data));

/** The `data:` payloads of a recorded stream (.sse events, or one payload per line in .jsonl/.txt). */
function payloadsOf(file: string): string[] {
  const text = readFileSync(join(FIXTURE_DIR, file), "utf8");
  const lines = file.endsWith(".sse")
    ? text.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim())
    : text.split("\n").map((l) => l.trim());
  return lines.filter((l) => l !== "" && l !== "[DONE]");
}

const recorded = readdirSync(FIXTURE_DIR).filter((f) => /stream/.test(f) && /\.(sse|jsonl|txt)$/.test(f) && payloadsOf(f).length > 0);

/** How many of a stream's payloads the template answers (the rest are parsed). */
function templateHits(payloads: readonly string[]): number {
  const mapper = createChunkMapper();
  const template = new ContentDeltaTemplate();
  let hits = 0;
  for (const p of payloads) {
    if (template.match(p) !== undefined) {
      hits++;
      continue;
    }
    const parsed = parseJson(p);
    const m = parsed === undefined ? null : mapper.chunk(parsed);
    if (m?.kind === "chunk" && m.plain) template.learn(p, m.content!, contentOf);
  }
  return hits;
}

describe("mapped through the template = parsed and mapped one by one", () => {
  test("there are recorded streams to check, and the template answers deltas of several servers", () => {
    expect(recorded.length).toBeGreaterThan(10);
    const served = recorded.filter((f) => templateHits(payloadsOf(f)) > 0);
    expect(served.length).toBeGreaterThanOrEqual(3);
  });

  test.each(recorded)("%s", (file) => {
    const payloads = payloadsOf(file);
    expect(throughTemplate(payloads)).toEqual(reference(payloads));
  });

  const line = (text: string, id = "c1") =>
    `{"id":"${id}","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":${text}},"finish_reason":null}]}`;
  const awkward = [
    JSON.stringify("plain"),
    JSON.stringify('quote " inside'),
    JSON.stringify("back\\slash at the end\\"),
    JSON.stringify("new\nline\ttab"),
    JSON.stringify("é ü 안 🙂"),
    '"\\u00e9\\u0041 escaped"',
    '"\\ud83d\\ude42 escaped pair"',
    '"\\ud800 lone surrogate escape"',
    JSON.stringify("}]},{\"content\":\"x"),
    '"raw\u0001control"', // not JSON: both paths must call it malformed
    '"unterminated\\"', // the escape eats the closing quote: not JSON
    '"a","content":"b"', // two members: JSON.parse keeps the last
    '""',
    JSON.stringify("x".repeat(5000)),
  ];

  test("generated streams of awkward texts, each after a plain first delta", () => {
    for (const text of awkward) {
      const payloads = [line('"first"'), line('"second"'), line(text), line('"after"'), line('"other id"', "c2"), line('"last"')];
      expect({ text, mapped: throughTemplate(payloads) }).toEqual({ text, mapped: reference(payloads) });
    }
  });

  test("the template serves the content deltas after the first (only two parses more, once)", () => {
    const template = new ContentDeltaTemplate();
    template.learn(line('"first"'), "first", contentOf);
    expect(template.match(line('"second"'))).toBe("second");
    expect(template.match(line(JSON.stringify('q"uote')))).toBe('q"uote');
    for (const text of ['"raw\u0001control"', '"unterminated\\"', '"a","content":"b"', '""']) expect(template.match(line(text))).toBeUndefined();
    expect(template.match(line('"x"', "c2"))).toBeUndefined();
  });
});

describe("what the template will not learn", () => {
  const cases: [string, string, string][] = [
    ["two content members (JSON.parse keeps the last)", '{"choices":[{"index":0,"delta":{"content":"a","content":"b"}}]}', "b"],
    ["the relayed text is another choice's", '{"choices":[{"index":1,"delta":{"content":"x"}},{"index":0,"delta":{"content" : "x"}}]}', "x"],
    ["spaces around the member's colon", '{"choices":[{"index":0,"delta":{"content" : "x"}}]}', "x"],
    ["another object's content member holds the same text", '{"choices":[{"index":0,"delta":{"content" :"x"}}],"extra":{"content":"x"}}', "x"],
  ];
  test.each(cases)("%s", (_name, data, content) => {
    expect(contentOf(data)).toBe(content);
    const template = new ContentDeltaTemplate();
    template.learn(data, content, contentOf);
    expect(template.match(data.replace(/"x"|"b"/, '"y"'))).toBeUndefined();
  });

  test("a stream whose deltas differ elsewhere too learns only a few times", () => {
    let probes = 0;
    const counting = (data: string) => {
      probes++;
      return contentOf(data);
    };
    const template = new ContentDeltaTemplate();
    for (let i = 0; i < 50; i++) {
      const data = `{"created":${i},"choices":[{"index":0,"delta":{"content":"t${i}"}}]}`;
      expect(template.match(data)).toBeUndefined();
      template.learn(data, `t${i}`, counting);
    }
    expect(probes).toBe(8);
  });
});
