// loadConfig: defaults < --config FILE < environment < flags (docs/operator.md). The environment is passed in,
// never read from the process; config files are real files in a temp dir.
import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { DEFAULT_INSPECT_URL, loadConfig, settingSpecs, type GatewayConfig } from "../../src/config/index.ts";

const dir = mkdtempSync(join(tmpdir(), "gw-config-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
let files = 0;
const configFile = (content: unknown): string => {
  const path = join(dir, `${files++}.json`);
  writeFileSync(path, typeof content === "string" ? content : JSON.stringify(content));
  return path;
};

const load = (argv: string[], env: Record<string, string | undefined> = {}): GatewayConfig => {
  const r = loadConfig(argv, env);
  if (!r.ok) throw new Error(`expected a config, got: ${r.message}`);
  return r.config;
};
const loadError = (argv: string[], env: Record<string, string | undefined> = {}): string => {
  const r = loadConfig(argv, env);
  if (r.ok) throw new Error("expected an error");
  return r.message;
};

describe("precedence", () => {
  test("defaults with nothing given", () => {
    const c = load([]);
    for (const spec of settingSpecs) expect(c[spec.key as keyof GatewayConfig]).toBe(spec.default as never);
    expect(c).toMatchObject({ port: 8080, host: "127.0.0.1", dataDir: "./data", settlementMode: "enforce", demo: false, inspect: undefined });
  });

  test.each<[string, () => [string[], Record<string, string>], number]>([
    ["default", () => [[], {}], 8080],
    ["config file over default", () => [["--config", configFile({ port: 1111 })], {}], 1111],
    ["env over config file", () => [["--config", configFile({ port: 1111 })], { GATEWAY_PORT: "2222" }], 2222],
    ["flag over env", () => [["--config", configFile({ port: 1111 }), "--port", "3333"], { GATEWAY_PORT: "2222" }], 3333],
    ["flag over config file", () => [["--port=3333", `--config=${configFile({ port: 1111 })}`], {}], 3333],
    ["env over default", () => [[], { GATEWAY_PORT: "2222" }], 2222],
    ["an empty env value does not count", () => [["--config", configFile({ port: 1111 })], { GATEWAY_PORT: "" }], 1111],
    ["GATEWAY_CONFIG names the file", () => [[], { GATEWAY_CONFIG: configFile({ port: 4444 }) }], 4444],
    ["--config wins over GATEWAY_CONFIG", () => [["--config", configFile({ port: 5555 })], { GATEWAY_CONFIG: configFile({ port: 4444 }) }], 5555],
  ])("%s", (_, given, port) => {
    const [argv, env] = given();
    expect(load(argv, env).port).toBe(port);
  });

  test("layers combine per setting", () => {
    const file = configFile({ host: "0.0.0.0", maxAttempts: 5, settlementMode: "observe", demo: true });
    const c = load(["--config", file, "--max-attempts", "2"], { GATEWAY_SETTLEMENT_MODE: "enforce", GATEWAY_DATA_DIR: "/var/gw" });
    expect(c).toMatchObject({ host: "0.0.0.0", maxAttempts: 2, settlementMode: "enforce", dataDir: "/var/gw", demo: true, port: 8080 });
  });

  test("every setting's flag and env name are derived from its key", () => {
    const spec = settingSpecs.find((s) => s.key === "firstByteTimeoutMs")!;
    expect([spec.flag, spec.env]).toEqual(["--first-byte-timeout-ms", "GATEWAY_FIRST_BYTE_TIMEOUT_MS"]);
    expect(load(["--first-byte-timeout-ms", "1234"]).firstByteTimeoutMs).toBe(1234);
    expect(load([], { GATEWAY_FIRST_BYTE_TIMEOUT_MS: "4321" }).firstByteTimeoutMs).toBe(4321);
  });
});

describe("errors", () => {
  test.each<[string, string[], Record<string, string>, RegExp]>([
    ["unknown flag", ["--nope"], {}, /unknown option --nope/],
    ["unknown flag with a value", ["--nope=1"], {}, /unknown option --nope/],
    ["a positional is not a flag", ["serve"], {}, /unknown option serve/],
    ["bad integer flag", ["--port", "eighty"], {}, /--port: expected an integer/],
    ["non-integer number flag", ["--port", "80.5"], {}, /--port: expected an integer/],
    ["bad integer env", [], { GATEWAY_PORT: "x" }, /GATEWAY_PORT: expected an integer/],
    ["integer below its minimum", ["--max-attempts", "0"], {}, /--max-attempts: must be at least 1/],
    ["flag without its value", ["--port"], {}, /--port needs a value/],
    ["bad enum", ["--settlement-mode", "lenient"], {}, /--settlement-mode: expected one of observe, enforce/],
    ["bad boolean", ["--demo=maybe"], {}, /--demo: expected true or false/],
    ["bad boolean env", [], { GATEWAY_DEMO: "yes" }, /GATEWAY_DEMO: expected true or false/],
    ["empty string flag", ["--host="], {}, /--host: expected a non-empty string/],
    ["--config without a file", ["--config"], {}, /--config needs a file/],
  ])("%s", (_, argv, env, message) => {
    expect(loadError(argv, env)).toMatch(message);
  });

  test.each<[string, unknown, RegExp]>([
    ["unknown setting in the file", { port: 1, colour: "blue" }, /unknown setting colour/],
    ["not an object", [1, 2], /expected a JSON object/],
    ["not JSON", "{port:", /\.json: /],
    ["bad integer in the file", { port: 80.5 }, /port: expected an integer/],
    ["bad enum in the file", { logLevel: "loud" }, /logLevel: expected one of debug, info, warn, error/],
  ])("config file: %s", (_, content, message) => {
    expect(loadError(["--config", configFile(content)])).toMatch(message);
  });

  test("an integer written as a string in the config file is coerced like env and flags", () => {
    expect(load(["--config", configFile({ port: "8081" })]).port).toBe(8081);
  });

  test("a missing config file is an error naming it", () => {
    const missing = join(dir, "missing.json");
    expect(loadError(["--config", missing])).toContain(missing);
  });
});

describe("--inspect", () => {
  test.each<[string, string[], Record<string, string>, string | undefined]>([
    ["absent", [], {}, undefined],
    ["without a value → the default URL", ["--inspect"], {}, DEFAULT_INSPECT_URL],
    ["without a value, followed by another flag", ["--inspect", "--port", "9"], {}, DEFAULT_INSPECT_URL],
    ["with =URL", ["--inspect=ws://127.0.0.1:9999"], {}, "ws://127.0.0.1:9999"],
    ["with a separate URL", ["--inspect", "ws://127.0.0.1:9998"], {}, "ws://127.0.0.1:9998"],
    ["from the environment", [], { GATEWAY_INSPECT: "ws://127.0.0.1:7777" }, "ws://127.0.0.1:7777"],
    ["the flag beats the environment", ["--inspect"], { GATEWAY_INSPECT: "ws://127.0.0.1:7777" }, DEFAULT_INSPECT_URL],
  ])("%s", (_, argv, env, expected) => {
    expect(load(argv, env).inspect).toBe(expected);
  });

  test("--inspect without a value does not swallow the next flag", () => {
    expect(load(["--inspect", "--port", "9"]).port).toBe(9);
  });

  test("the default inspector URL is never the gateway's own default port", () => {
    expect(DEFAULT_INSPECT_URL).toBe("ws://127.0.0.1:8090");
  });
});

describe("boolean flags", () => {
  test.each<[string, string[], Record<string, string>, boolean]>([
    ["absent → default false", [], {}, false],
    ["bare flag → true", ["--demo"], {}, true],
    ["=true", ["--demo=true"], {}, true],
    ["=false", ["--demo=false"], {}, false],
    ["=1", ["--demo=1"], {}, true],
    ["=0", ["--demo=0"], {}, false],
    ["env true", [], { GATEWAY_DEMO: "true" }, true],
    ["env 1", [], { GATEWAY_DEMO: "1" }, true],
    ["flag false beats env true", ["--demo=false"], { GATEWAY_DEMO: "true" }, false],
  ])("%s", (_, argv, env, expected) => {
    expect(load(argv, env).demo).toBe(expected);
  });

  test("a bare boolean flag does not take the next argument as its value", () => {
    const c = load(["--messages-facade", "--responses-facade"]);
    expect([c.messagesFacade, c.responsesFacade]).toEqual([true, true]);
    expect(loadError(["--demo", "false"])).toMatch(/unknown option false/);
  });

  test("booleans from the config file", () => {
    const c = load(["--config", configFile({ demo: true, messagesFacade: false })]);
    expect([c.demo, c.messagesFacade]).toEqual([true, false]);
  });
});
