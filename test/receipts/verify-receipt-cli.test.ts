// `gateway verify-receipt` (docs/operator.md): results and exit codes 0 valid, 1 invalid, 2 inconclusive,
// 64 usage, 65 unreadable input — in process, and through the real `gateway` entry point.
import { describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { catalogBodyDigest, encodeCatalogBody, signCatalogBody } from "../../src/catalog/feed.ts";
import { historyLine } from "../../src/catalog/history.ts";
import { runVerifyReceipt, type VerifyCliIo } from "../../src/receipts/verifyCli.ts";
import { keyFromSeed, rawPublic } from "./independent-signer.ts";
import { FIXTURES, golden, goldenEnvelope, goldenHistoryPath } from "./golden-case.ts";

const ENTRY = join(import.meta.dir, "..", "..", "src", "main.ts");
const envelopePath = join(FIXTURES, "receipt.env");

function io(files: Record<string, string>, stdin = "") {
  const out: string[] = [];
  const err: string[] = [];
  const fake: VerifyCliIo = {
    readFile: async (path) => {
      if (!(path in files)) throw new Error(`ENOENT: ${path}`);
      return files[path]!;
    },
    readStdin: async () => stdin,
    stdout: (l) => out.push(l),
    stderr: (l) => err.push(l),
  };
  return { fake, out, err };
}

const history = readFileSync(goldenHistoryPath, "utf8");
const key = golden.provider_public_key;
const args = (file = "receipt", hist = "history", k = key) => [file, "--catalog-history", hist, "--provider-key", k];

/** A history line for the golden catalog id whose body differs (e.g. a forged or wrong history). */
function forgedHistory(): string {
  const operator = keyFromSeed(new Uint8Array(32).fill(0x44));
  const body = {
    version: 1 as const,
    catalog_id: golden.snapshot.catalog_id,
    issued_at: "2026-01-01T00:00:00.000Z",
    expires_at: "2026-02-01T00:00:00.000Z",
    models: [],
  };
  const bytes = encodeCatalogBody(body);
  const line = historyLine({
    seq: 1,
    catalog_id: body.catalog_id,
    body: bytes,
    signature: signCatalogBody(bytes, operator),
    body_digest: catalogBodyDigest(bytes),
    public_key: rawPublic(operator),
    issued_at_ms: Date.parse(body.issued_at),
    expires_at_ms: Date.parse(body.expires_at),
    accepted_at_ms: Date.parse(body.issued_at),
  });
  return `${JSON.stringify(line)}\n`;
}

describe("results and exit codes", () => {
  test.each<[string, Record<string, string>, string[], number, object | null]>([
    ["valid", { receipt: goldenEnvelope, history }, args(), 0, { result: "valid", reason: null, verifier_version: "1.1.0" }],
    ["signature broken", { receipt: goldenEnvelope.slice(0, -10) + (goldenEnvelope.at(-10) === "A" ? "B" : "A") + goldenEnvelope.slice(-9), history }, args(), 1, { result: "invalid", reason: "bad_signature" }],
    ["another key given by the operator", { receipt: goldenEnvelope, history }, args("receipt", "history", Buffer.from(rawPublic(keyFromSeed(new Uint8Array(32).fill(9)))).toString("base64")), 1, { result: "invalid", reason: "wrong_key" }],
    ["not an envelope", { receipt: "garbage", history }, args(), 1, { result: "invalid", reason: "malformed" }],
    ["catalog with that id but another body", { receipt: goldenEnvelope, history: forgedHistory() }, args(), 1, { result: "invalid", reason: "catalog_digest_mismatch" }],
    ["history lacks the receipt's catalog", { receipt: goldenEnvelope, history: "" }, args(), 2, { result: "inconclusive", reason: "catalog_not_in_history" }],
    ["missing FILE", { history }, ["--catalog-history", "history", "--provider-key", key], 64, null],
    ["missing --provider-key", { receipt: goldenEnvelope, history }, ["receipt", "--catalog-history", "history"], 64, null],
    ["key not 32 bytes of base64", { receipt: goldenEnvelope, history }, args("receipt", "history", "abc"), 64, null],
    ["unknown flag", { receipt: goldenEnvelope, history }, [...args(), "--fast"], 64, null],
    ["receipt file unreadable", { history }, args(), 65, null],
    ["history file unreadable", { receipt: goldenEnvelope }, args(), 65, null],
    ["history line not a signed catalog", { receipt: goldenEnvelope, history: "{}\n" }, args(), 65, null],
  ])("%s → exit %d", async (_name, files, argv, code, printed) => {
    const { fake, out } = io(files);
    expect(await runVerifyReceipt(argv, fake)).toBe(code);
    if (printed === null) expect(out).toEqual([]);
    else expect(JSON.parse(out[0]!)).toMatchObject(printed);
  });

  test("- reads the envelope from standard input", async () => {
    const { fake, out } = io({ history }, `${goldenEnvelope}\n`);
    expect(await runVerifyReceipt(args("-"), fake)).toBe(0);
    expect(JSON.parse(out[0]!).result).toBe("valid");
  });
});

describe("through the gateway entry point", () => {
  test("--version prints the 1.1.x version line", () => {
    const run = Bun.spawnSync(["bun", ENTRY, "verify-receipt", "--version"]);
    expect(run.exitCode).toBe(0);
    expect(run.stdout.toString().trim()).toMatch(/^gateway verify-receipt 1\.1\.\d+$/);
  });

  test("the golden receipt file verifies (exit 0)", () => {
    const run = Bun.spawnSync(["bun", ENTRY, "verify-receipt", envelopePath, "--catalog-history", goldenHistoryPath, "--provider-key", key]);
    expect(run.exitCode).toBe(0);
    expect(JSON.parse(run.stdout.toString())).toEqual({ result: "valid", reason: null, verifier_version: "1.1.0" });
  });

  test("a missing file exits 65", () => {
    const run = Bun.spawnSync(["bun", ENTRY, "verify-receipt", "/nonexistent/receipt", "--catalog-history", goldenHistoryPath, "--provider-key", key]);
    expect(run.exitCode).toBe(65);
  });
});
