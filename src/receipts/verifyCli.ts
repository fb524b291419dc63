// `gateway verify-receipt FILE|- --catalog-history FILE --provider-key B64` (docs/operator.md).
// Exit codes: 0 valid, 1 invalid, 2 inconclusive, 64 usage error, 65 unreadable input.
import { parseHistoryLine } from "../catalog/history.ts";
import { parseFlags } from "../cli/flags.ts";
import { decodeEd25519PublicKey } from "../cli/operator.ts";
import { VERIFIER_VERSION, verifyStandalone, type HistoryCatalog } from "./standalone.ts";

export const VERIFY_EXIT = { valid: 0, invalid: 1, inconclusive: 2, usage: 64, unreadable: 65 } as const;

const USAGE = [
  "usage: gateway verify-receipt FILE|- --catalog-history FILE --provider-key B64",
  "       gateway verify-receipt --version",
  "FILE holds the receipt envelope (- reads standard input); the history file is what",
  "`gateway catalog history --json` prints; B64 is the provider's raw Ed25519 public key, base64.",
];

export interface VerifyCliIo {
  readFile(path: string): Promise<string>;
  readStdin(): Promise<string>;
  stdout(line: string): void;
  stderr(line: string): void;
}

/** Reads every history line; the first line that is not a signed, self-consistent catalog makes the file unreadable. */
function parseHistory(text: string): { ok: true; history: HistoryCatalog[] } | { ok: false; message: string } {
  const history: HistoryCatalog[] = [];
  const lines = text.split("\n");
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i]!.trim();
    if (line === "") continue;
    const parsed = parseHistoryLine(line);
    if (!parsed.ok) return { ok: false, message: `catalog history line ${i + 1}: ${parsed.message}` };
    const feed = parsed.feed;
    history.push({ catalog_id: feed.body.catalog_id, body_digest: feed.digest, issued_at_ms: feed.issued_at_ms, models: feed.body.models });
  }
  return { ok: true, history };
}

export async function runVerifyReceipt(argv: readonly string[], io: VerifyCliIo): Promise<number> {
  const usage = (message: string) => {
    io.stderr(`error: ${message}`);
    USAGE.forEach((l) => io.stderr(l));
    return VERIFY_EXIT.usage;
  };
  const p = parseFlags(argv, {
    "catalog-history": { kind: "string" },
    "provider-key": { kind: "string" },
    version: { kind: "boolean" },
    help: { kind: "boolean" },
  });
  if (!p.ok) return usage(p.message);
  if (p.flags.version) {
    io.stdout(`gateway verify-receipt ${VERIFIER_VERSION}`);
    return 0;
  }
  if (p.flags.help) {
    USAGE.forEach((l) => io.stdout(l));
    return 0;
  }
  if (p.positionals.length !== 1) return usage(p.positionals.length === 0 ? "missing FILE" : "only one FILE");
  const historyPath = p.flags["catalog-history"];
  const keyText = p.flags["provider-key"];
  if (historyPath === undefined) return usage("--catalog-history is required");
  if (keyText === undefined) return usage("--provider-key is required");
  const key = decodeEd25519PublicKey(keyText);
  if (key === null) return usage("--provider-key must be standard base64 of a 32-byte Ed25519 key");

  const file = p.positionals[0]!;
  let envelope: string;
  let historyText: string;
  try {
    envelope = file === "-" ? await io.readStdin() : await io.readFile(file);
  } catch (error) {
    io.stderr(`error: cannot read ${file === "-" ? "standard input" : file}: ${(error as Error).message}`);
    return VERIFY_EXIT.unreadable;
  }
  try {
    historyText = await io.readFile(historyPath);
  } catch (error) {
    io.stderr(`error: cannot read ${historyPath}: ${(error as Error).message}`);
    return VERIFY_EXIT.unreadable;
  }
  const history = parseHistory(historyText);
  if (!history.ok) {
    io.stderr(`error: ${history.message}`);
    return VERIFY_EXIT.unreadable;
  }
  const result = verifyStandalone({ envelope, providerPublicKey: key, history: history.history });
  io.stdout(JSON.stringify(result));
  return VERIFY_EXIT[result.result];
}

/** The real file system and standard streams. */
export const processIo: VerifyCliIo = {
  readFile: (path) => Bun.file(path).text(),
  readStdin: () => new Response(Bun.stdin.stream()).text(),
  stdout: (line) => console.log(line),
  stderr: (line) => console.error(line),
};
