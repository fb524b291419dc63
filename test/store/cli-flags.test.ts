import { expect, test } from "bun:test";
import { parseFlags } from "../../src/cli/flags.ts";

const spec = {
  port: { kind: "string" },
  json: { kind: "boolean" },
  model: { kind: "string", multiple: true },
  inspect: { kind: "string-or-true" },
} as const;

test("values come as `--name value` or `--name=value`, with positionals kept in order", () => {
  const r = parseFlags(["serve", "--port", "8080", "--json", "extra", "--model=a=sha:1", "--model", "b=c"], spec);
  expect(r).toEqual({
    ok: true,
    flags: { port: "8080", json: true, model: ["a=sha:1", "b=c"], inspect: undefined },
    positionals: ["serve", "extra"],
  });
});

test("absent flags have neutral values", () => {
  expect(parseFlags([], spec)).toEqual({
    ok: true,
    flags: { port: undefined, json: false, model: [], inspect: undefined },
    positionals: [],
  });
});

test.each([
  [["--inspect"], true],
  [["--inspect=ws://127.0.0.1:9000"], "ws://127.0.0.1:9000"],
])("a string-or-true flag %p gives %p", (argv, expected) => {
  const r = parseFlags(argv, spec);
  expect(r.ok && r.flags.inspect).toBe(expected);
});

test("a string-or-true flag never swallows the next argument", () => {
  const r = parseFlags(["--inspect", "serve"], spec);
  expect(r.ok && r.positionals).toEqual(["serve"]);
});

test("booleans accept =true and =false", () => {
  const r = parseFlags(["--json=false"], spec);
  expect(r.ok && r.flags.json).toBe(false);
});

test("`--` ends flags and a lone `-` is a positional", () => {
  const r = parseFlags(["-", "--", "--port", "x"], spec);
  expect(r.ok && r.positionals).toEqual(["-", "--port", "x"]);
  expect(r.ok && r.flags.port).toBeUndefined();
});

test("a value may start with a single dash", () => {
  const r = parseFlags(["--port", "-1"], spec);
  expect(r.ok && r.flags.port).toBe("-1");
});

test.each([
  [["--colour", "red"], "unknown_flag"],
  [["-p", "1"], "unknown_flag"],
  [["--toString"], "unknown_flag"],
  [["--port"], "missing_value"],
  [["--port", "--json"], "missing_value"],
  [["--json=yes"], "unexpected_value"],
  [["--port", "1", "--port=2"], "repeated_flag"],
])("%p is refused as %s", (argv, code) => {
  const r = parseFlags(argv, spec);
  expect(r.ok).toBe(false);
  if (!r.ok) {
    expect(r.code).toBe(code as typeof r.code);
    expect(r.message.length).toBeGreaterThan(0);
  }
});
