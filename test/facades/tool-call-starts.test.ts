// ToolCallStarts (pure): a facade's tool call starts once its name is complete — at its first
// arguments fragment, or when other output follows — with every name fragment concatenated.
import { expect, test } from "bun:test";
import { ToolCallStarts, type StartedToolCall } from "../../src/http/toolCallStarts.ts";
import type { ToolCallDelta } from "../../src/wire/frames.ts";

function run(deltas: (ToolCallDelta | "text" | "end")[]) {
  const log: (StartedToolCall | string)[] = [];
  const calls = new ToolCallStarts((c) => log.push({ ...c }));
  for (const d of deltas) {
    if (d === "text" || d === "end") {
      calls.flush();
      log.push(d);
      continue;
    }
    const partial = calls.take(d);
    if (partial !== undefined) log.push(`args ${d.index}: ${partial}`);
  }
  return log;
}

test.each<[string, (ToolCallDelta | "text" | "end")[], (StartedToolCall | string)[]]>([
  [
    "name whole, then arguments",
    [{ index: 0, id: "c1", name: "get_weather" }, { index: 0, arguments: '{"a":' }, { index: 0, arguments: "1}" }, "end"],
    [{ index: 0, id: "c1", name: "get_weather" }, 'args 0: {"a":', "args 0: 1}", "end"],
  ],
  [
    "name in three fragments, the last with the first arguments",
    [{ index: 0, id: "c1", name: "get_" }, { index: 0, name: "wea" }, { index: 0, name: "ther", arguments: "{}" }, "end"],
    [{ index: 0, id: "c1", name: "get_weather" }, "args 0: {}", "end"],
  ],
  [
    "a call with no arguments starts at the end",
    [{ index: 0, id: "c1", name: "no" }, { index: 0, name: "w" }, "end"],
    [{ index: 0, id: "c1", name: "now" }, "end"],
  ],
  [
    "parallel calls: a delta of another call starts the pending one first",
    [{ index: 0, name: "a" }, { index: 0, name: "b" }, { index: 1, id: "c2", name: "c" }, { index: 1, arguments: "{}" }, "end"],
    [{ index: 0, id: undefined, name: "ab" }, { index: 1, id: "c2", name: "c" }, "args 1: {}", "end"],
  ],
  [
    "text after a pending call starts it before the text",
    [{ index: 0, name: "f" }, "text"],
    [{ index: 0, id: undefined, name: "f" }, "text"],
  ],
  [
    "name fragments after the arguments began are ignored; empty arguments never start a call",
    [{ index: 0, name: "f", arguments: "" }, { index: 0, arguments: "{" }, { index: 0, name: "x", arguments: "}" }, "end"],
    [{ index: 0, id: undefined, name: "f" }, "args 0: {", "args 0: }", "end"],
  ],
])("%s", (_name, deltas, expected) => {
  expect(run(deltas)).toEqual(expected);
});
