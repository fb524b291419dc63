// `gateway catalog …` end to end: real processes on a real data dir, as an operator runs them.
import { expect, test } from "bun:test";
import { createPrivateKey } from "node:crypto";
import { mkdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { verifyCatalogFeed } from "../../src/catalog/feed.ts";
import { parseHistoryLine } from "../../src/catalog/history.ts";
import { tempDir } from "./support.ts";

const MAIN = join(import.meta.dir, "../../src/main.ts");
const root = tempDir("gw-catalog-cli-");
const dataDir = join(root, "data");

/** Every byte any command printed, to prove the private key never appears in it. */
const transcript: string[] = [];

function cli(args: string[], dir = dataDir) {
  const r = Bun.spawnSync(["bun", MAIN, "catalog", ...args, "--data-dir", dir], { env: { ...process.env, GATEWAY_DATA_DIR: "" } });
  const out = r.stdout.toString();
  const err = r.stderr.toString();
  transcript.push(out, err);
  return { code: r.exitCode, out: out.trim(), err, json: () => JSON.parse(out) as Record<string, any> };
}

const sha256sum = (file: string) => Bun.spawnSync(["sha256sum", file]).stdout.toString().slice(0, 64);
const sha256text = (text: string) => Bun.spawnSync(["sha256sum"], { stdin: Buffer.from(text) }).stdout.toString().slice(0, 64);
const lines = (text: string) => text.split("\n").filter((l) => l !== "").map((l) => JSON.parse(l) as Record<string, any>);

let publicKey = "";

test("init creates a 0600 PKCS#8 Ed25519 key and an empty signed catalog, and is idempotent", () => {
  const r = cli(["init"]);
  expect(r.code).toBe(0);
  const out = r.json();
  expect(out).toMatchObject({ key_created: true, catalog_created: true, model_count: 0, seq: 1 });
  publicKey = out.public_key;
  expect(publicKey).toMatch(/^[A-Za-z0-9+/]{43}=$/);

  const keyFile = join(dataDir, "catalog-operator.key");
  expect(statSync(keyFile).mode & 0o777).toBe(0o600);
  const pem = readFileSync(keyFile, "utf8");
  expect(pem).toStartWith("-----BEGIN PRIVATE KEY-----");
  const key = createPrivateKey(pem);
  expect(key.asymmetricKeyType).toBe("ed25519");
  expect(key.export({ format: "jwk" }).x).toBe(Buffer.from(publicKey, "base64").toString("base64url"));

  // The published files verify under the printed key.
  const body = readFileSync(join(dataDir, "catalog.json"));
  const sig = readFileSync(join(dataDir, "catalog.json.sig"), "utf8");
  const verified = verifyCatalogFeed(body, sig, Buffer.from(publicKey, "base64"));
  expect(verified.ok && verified.feed.body.catalog_id).toBe(out.catalog_id);

  const again = cli(["init"]);
  expect(again.code).toBe(0);
  expect(again.json()).toMatchObject({ key_created: false, catalog_created: false, catalog_id: out.catalog_id, public_key: publicKey });
});

test("add by --model-hash, by --weights DIR and by --weights FILE; each change re-signs", () => {
  const hex = "AB".repeat(32);
  const a = cli(["add", "--model-id", "llama3.2:1b", "--model-hash", hex, "--tools", "--min-ram-gb", "8", "--rate-card-row", "small"]);
  expect(a.code).toBe(0);
  expect(a.json()).toMatchObject({
    action: "added",
    seq: 2,
    model: { model_id: "llama3.2:1b", model_hash: "ab".repeat(32), hash_scope: "gguf-file-v1", min_ram_gb: 8, rate_card_row: "small", capabilities: { tools: true, structured_output: false } },
  });

  const weights = join(root, "weights");
  mkdirSync(join(weights, "sub"), { recursive: true });
  writeFileSync(join(weights, "model.safetensors"), "tensor-bytes");
  writeFileSync(join(weights, "sub", "tokenizer.json"), "{}");
  writeFileSync(join(weights, ".gitattributes"), "ignored");
  const manifest =
    `model.safetensors\n12\n${sha256sum(join(weights, "model.safetensors"))}\n` +
    `sub/tokenizer.json\n2\n${sha256sum(join(weights, "sub", "tokenizer.json"))}\n`;
  const d = cli(["add", "--model-id", "dir-model", "--weights", weights, "--structured-output"]);
  expect(d.code).toBe(0);
  expect(d.json().model).toMatchObject({ model_hash: sha256text(manifest), hash_scope: "snapshot-manifest-v1", capabilities: { tools: false, structured_output: true } });

  const gguf = join(root, "tiny.gguf");
  writeFileSync(gguf, Buffer.concat([Buffer.from("GGUF"), Buffer.from([3, 0, 0, 0]), Buffer.from("weights")]));
  const g = cli(["add", "--model-id", "gguf-model", "--weights", gguf, "--hash-scope", "gguf-file-v1"]);
  expect(g.code).toBe(0);
  expect(g.json()).toMatchObject({ seq: 4, model_count: 3, model: { model_hash: sha256sum(gguf), hash_scope: "gguf-file-v1" } });

  // The scope of a weights path is what its shape says; a contradicting --hash-scope is a usage error.
  expect(cli(["add", "--model-id", "x", "--weights", gguf, "--hash-scope", "snapshot-manifest-v1"]).code).toBe(64);
});

test("show --json prints one object with the catalog in force", () => {
  const r = cli(["show", "--json"]);
  expect(r.code).toBe(0);
  const shown = lines(r.out);
  expect(shown).toHaveLength(1);
  expect(shown[0]).toMatchObject({ seq: 4, public_key: publicKey, expired: false });
  expect(shown[0]!.models.map((m: { model_id: string }) => m.model_id)).toEqual(["dir-model", "gguf-model", "llama3.2:1b"]);
  expect(cli(["show"]).out).toContain("llama3.2:1b");
});

test("re-adding differently needs --replace; an identical add changes nothing", () => {
  const same = cli(["add", "--model-id", "llama3.2:1b", "--model-hash", "ab".repeat(32), "--tools", "--min-ram-gb", "8", "--rate-card-row", "small"]);
  expect(same.code).toBe(0);
  expect(same.json()).toMatchObject({ action: "unchanged", seq: 4 });
  const differing = cli(["add", "--model-id", "llama3.2:1b", "--model-hash", "cd".repeat(32)]);
  expect(differing.code).toBe(1);
  expect(differing.err).toContain("--replace");
  const replaced = cli(["add", "--model-id", "llama3.2:1b", "--model-hash", "cd".repeat(32), "--replace"]);
  expect(replaced.code).toBe(0);
  expect(replaced.json()).toMatchObject({ action: "added", seq: 5, model: { model_hash: "cd".repeat(32) } });
});

test("remove retires a model from the feed; history keeps every feed, and the retired hash stays in it", () => {
  const r = cli(["remove", "--model-id", "gguf-model"]);
  expect(r.code).toBe(0);
  expect(r.json()).toMatchObject({ action: "removed", model_id: "gguf-model", seq: 6, model_count: 2 });
  expect(cli(["remove", "--model-id", "gguf-model"]).code).toBe(1);
  expect(lines(cli(["show", "--json"]).out)[0]!.models.map((m: { model_id: string }) => m.model_id)).toEqual(["dir-model", "llama3.2:1b"]);

  const history = cli(["history", "--json"]);
  expect(history.code).toBe(0);
  const rows = lines(history.out);
  expect(rows.map((row) => row.seq)).toEqual([1, 2, 3, 4, 5, 6]);
  const trusted = [new Uint8Array(Buffer.from(publicKey, "base64"))];
  const feeds = history.out.split("\n").map((line) => parseHistoryLine(line, trusted));
  expect(feeds.every((f) => f.ok)).toBe(true);
  const gguf = feeds.flatMap((f) => (f.ok ? f.feed.body.models : [])).find((m) => m.model_id === "gguf-model");
  expect(gguf?.model_hash).toBe(sha256sum(join(root, "tiny.gguf")));
  // Both hashes llama3.2:1b ever had are in the history (for receipts issued under either).
  const llamaHashes = new Set(feeds.flatMap((f) => (f.ok ? f.feed.body.models : [])).filter((m) => m.model_id === "llama3.2:1b").map((m) => m.model_hash));
  expect([...llamaHashes].sort()).toEqual(["ab".repeat(32), "cd".repeat(32)]);

  // The published files are the latest history entry, byte for byte.
  expect(readFileSync(join(dataDir, "catalog.json"), "utf8")).toBe(rows[5]!.body);
  expect(readFileSync(join(dataDir, "catalog.json.sig"), "utf8")).toBe(rows[5]!.signature);
});

test("sign re-signs the same models under a new catalog id and validity window", () => {
  const before = lines(cli(["show", "--json"]).out)[0]!;
  const r = cli(["sign", "--valid-days", "7"]);
  expect(r.code).toBe(0);
  const after = lines(cli(["show", "--json"]).out)[0]!;
  expect(after.catalog_id).not.toBe(before.catalog_id);
  expect(after.seq).toBe(before.seq + 1);
  expect(after.models).toEqual(before.models);
  expect(Date.parse(after.expires_at) - Date.parse(after.issued_at)).toBe(7 * 24 * 60 * 60 * 1000);
});

test("concurrent adds from several processes all land (none overwrites another)", async () => {
  const ids = ["c1", "c2", "c3", "c4"];
  const procs = ids.map((id, i) =>
    Bun.spawn(["bun", MAIN, "catalog", "add", "--model-id", id, "--model-hash", String(i).repeat(64), "--data-dir", dataDir], { stdout: "pipe", stderr: "pipe" }),
  );
  const codes = await Promise.all(procs.map((p) => p.exited));
  for (const p of procs) transcript.push(await new Response(p.stdout).text(), await new Response(p.stderr).text());
  expect(codes).toEqual([0, 0, 0, 0]);
  const models = lines(cli(["show", "--json"]).out)[0]!.models.map((m: { model_id: string }) => m.model_id);
  expect(models).toEqual(expect.arrayContaining(ids));
});

test.each([
  [["add", "--model-id", "x"], 64],
  [["add", "--model-id", "x", "--model-hash", "ab".repeat(32), "--weights", "/tmp"], 64],
  [["add", "--model-id", "x", "--model-hash", "abc"], 64],
  [["add", "--model-id", "has space", "--model-hash", "ab".repeat(32)], 64],
  [["add", "--model-id", "x", "--model-hash", "ab".repeat(32), "--hash-scope", "md5"], 64],
  [["add", "--model-id", "x", "--model-hash", "ab".repeat(32), "--rate-card-row", "Not A Slug"], 64],
  [["add", "--model-id", "x", "--weights", "/definitely/not/here"], 1],
  [["remove"], 64],
  [["sign", "--valid-days", "0"], 64],
  [["show", "--bogus"], 64],
  [["frobnicate"], 64],
])("usage errors exit 64, failed operations exit 1: %j", (args, code) => {
  expect(cli(args as string[]).code).toBe(code);
});

test("commands that need the key fail cleanly on an uninitialised data dir", () => {
  const empty = join(root, "empty");
  const r = cli(["add", "--model-id", "x", "--model-hash", "ab".repeat(32)], empty);
  expect(r.code).toBe(1);
  expect(r.err).toContain("catalog init");
  expect(cli(["show"], empty).code).toBe(1);
  expect(cli(["history", "--json"], empty)).toMatchObject({ code: 0, out: "" });
});

test("the private key never appears in anything a command printed", () => {
  const pem = readFileSync(join(dataDir, "catalog-operator.key"), "utf8");
  const d = createPrivateKey(pem).export({ format: "jwk" }).d!;
  const secretForms = [
    ...pem.split("\n").filter((l) => l.length > 0 && !l.startsWith("-----")),
    d,
    Buffer.from(d, "base64url").toString("base64").replace(/=+$/, ""),
    Buffer.from(d, "base64url").toString("hex"),
  ];
  const everything = transcript.join("\n");
  expect(transcript.length).toBeGreaterThan(20);
  for (const secret of secretForms) expect(everything).not.toContain(secret);
  expect(everything).not.toContain("PRIVATE KEY");
});
