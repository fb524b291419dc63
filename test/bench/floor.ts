// The required-work floor: the bare relay's two-hop shape (relay.ts) plus only the per-request work
// issue 7 requires of a counted figure — API-key auth, a quota and balance reservation made durable
// before the job leaves, msgpack frames both ways, a receipt signed by the provider side (Ed25519 over
// the output's SHA-256 and usage) and verified by the server side, and a double-entry settlement
// posting — in the leanest code we can write: no actors, schema checks, routing policy, replay cache,
// metrics or logs. Not a product: it answers how much of the gap between the bare relay and the full
// stack is work every figure must pay, and how much is the gateway's own.
//   bun test/bench/floor.ts server DATA_DIR     HTTP + WebSocket server (prints floor_listening)
//   bun test/bench/floor.ts client WS_URL UPSTREAM
// Every SQLite write is one group commit per event-loop turn (BEGIN IMMEDIATE … COMMIT, WAL), as the
// gateway's, with its durability tiers (docs/decisions.md, "Durability tiers"): every COMMIT is a WAL
// append (synchronous=NORMAL, safe against a process crash) and a job leaves only after its
// reservation's; a group that settles is then made power-loss durable by an `fdatasync` of the WAL on
// the thread pool, off the buyer's path. A settlement is applied only after its receipt's signature
// checks out.
import { Database } from "bun:sqlite";
import { createHash, createPublicKey, generateKeyPairSync, sign, verify, type KeyObject } from "node:crypto";
import { join } from "node:path";
import { Packr } from "msgpackr";
import { walSyncer } from "../../src/store/walSync.ts";
import { ClientSessions, listenForClients, RelayedResponses } from "./relay.ts";

export const FLOOR_API_KEY = "floor-bench-key";
const BUYER = "buyer";
const PROVIDER = "provider";
const PLATFORM = "platform";
/** Credits per token (the catalog's default rate, docs/ledger.md) and the provider's share in basis points. */
const PROVIDER_SHARE_BPS = 9000;
const packr = new Packr({ useRecords: false });

/** Frames, both ways: one msgpack map each, `t` its type. */
type Frame =
  | { t: "hello"; key: Uint8Array }
  | { t: "job"; id: number; body: string }
  | { t: "head"; id: number; status: number; type: string }
  | { t: "data"; id: number; bytes: Uint8Array }
  | { t: "end"; id: number }
  | { t: "receipt"; id: number; body: string; sig: Uint8Array };

interface Session {
  ws: import("bun").ServerWebSocket<{ session?: Session }>;
  inFlight: number;
  key: KeyObject | null;
}

interface Admission {
  id: number;
  credits: number;
  digest: string;
  body: string;
  session: Session;
}

interface Settlement {
  id: number;
  tokens: number;
  credits: number;
}

function server(dataDir: string) {
  const db = new Database(join(dataDir, "floor.db"), { create: true });
  db.exec("PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;");
  db.exec(`
    CREATE TABLE IF NOT EXISTS accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL, held INTEGER NOT NULL);
    CREATE TABLE IF NOT EXISTS reservations (request_id INTEGER PRIMARY KEY, account_id TEXT NOT NULL,
      credits INTEGER NOT NULL, snapshot_digest TEXT NOT NULL, state TEXT NOT NULL);
    CREATE TABLE IF NOT EXISTS entries (id INTEGER PRIMARY KEY, request_id INTEGER NOT NULL,
      account_id TEXT NOT NULL, amount INTEGER NOT NULL);
    INSERT OR IGNORE INTO accounts VALUES ('${BUYER}', 1000000000000000, 0), ('${PROVIDER}', 0, 0), ('${PLATFORM}', 0, 0);`);
  const q = {
    begin: db.prepare("BEGIN IMMEDIATE"),
    commit: db.prepare("COMMIT"),
    available: db.prepare("SELECT balance - held AS a FROM accounts WHERE id = ?"),
    reserve: db.prepare("INSERT INTO reservations VALUES (?, ?, ?, ?, 'held')"),
    hold: db.prepare("UPDATE accounts SET held = held + ? WHERE id = ?"),
    resolve: db.prepare("UPDATE reservations SET state = 'settled' WHERE request_id = ? AND state = 'held'"),
    entry: db.prepare("INSERT INTO entries (request_id, account_id, amount) VALUES (?, ?, ?)"),
    credit: db.prepare("UPDATE accounts SET balance = balance + ? WHERE id = ?"),
  };
  // Cached key lookups, as the gateway's (a revocation would delete the entry).
  const apiKeys = new Map([[`Bearer ${FLOOR_API_KEY}`, BUYER]]);
  const sessions = new ClientSessions<Session>();
  const responses = new RelayedResponses();
  /** Reserved credits by request, until its receipt settles it (a second receipt finds nothing). */
  const reserved = new Map<number, number>();
  let admissions: Admission[] = [];
  let settlements: Settlement[] = [];
  let flushScheduled = false;
  let nextId = 1;
  const wal = walSyncer(join(dataDir, "floor.db-wal"));

  const schedule = () => {
    if (flushScheduled) return;
    flushScheduled = true;
    setImmediate(flush);
  };

  /** One transaction for the turn's reservations and settlements; jobs leave after its COMMIT. */
  const flush = () => {
    flushScheduled = false;
    const admitted = admissions;
    const settled = settlements;
    admissions = [];
    settlements = [];
    const refused = new Set<Admission>();
    q.begin.run();
    for (const a of admitted) {
      if ((q.available.get(BUYER) as { a: number }).a < a.credits) {
        refused.add(a);
        continue;
      }
      q.reserve.run(a.id, BUYER, a.credits, a.digest);
      q.hold.run(a.credits, BUYER);
    }
    for (const s of settled) {
      if (q.resolve.run(s.id).changes !== 1) continue;
      q.hold.run(-s.credits, BUYER);
      const debit = s.tokens;
      const providerCredits = Math.floor((debit * PROVIDER_SHARE_BPS) / 10_000);
      // Double entry: the three amounts sum to zero.
      for (const [account, amount] of [[BUYER, -debit], [PROVIDER, providerCredits], [PLATFORM, debit - providerCredits]] as const) {
        q.entry.run(s.id, account, amount);
        q.credit.run(amount, account);
      }
    }
    q.commit.run();
    // Postings need power-loss durability; nothing waits on it here (no effect follows a settlement).
    if (settled.length > 0) wal.sync(() => {});
    for (const a of refused) {
      reserved.delete(a.id);
      responses.settle(a.id, Response.json({ error: { message: "insufficient balance", type: "insufficient_balance" } }, { status: 402 }));
    }
    for (const a of admitted) if (responses.has(a.id) && !refused.has(a)) a.session.ws.send(packr.pack({ t: "job", id: a.id, body: a.body }));
  };

  listenForClients({
    name: "floor",
    sessions,
    newSession: (ws) => ({ ws, inFlight: 0, key: null }),
    async post(request) {
      const account = apiKeys.get(request.headers.get("authorization") ?? "");
      if (account === undefined) return Response.json({ error: { message: "invalid api key", type: "authentication_error" } }, { status: 401 });
      const body = await request.text();
      let parsed: { model?: unknown; max_tokens?: unknown };
      try {
        parsed = JSON.parse(body);
      } catch {
        return Response.json({ error: { message: "malformed JSON", type: "invalid_request_error" } }, { status: 400 });
      }
      const session = sessions.withRoom((x) => x.key !== null);
      if (!session) return new Response("no capacity", { status: 503 });
      // The reservation: a prompt bound (bytes / 4) plus max_tokens, at one credit a token.
      const credits = Math.ceil(body.length / 4) + (typeof parsed.max_tokens === "number" ? parsed.max_tokens : 4096);
      const id = nextId++;
      // The route snapshot's digest, persisted with the reservation (what a receipt echoes).
      const digest = createHash("sha256").update(`{"model":${JSON.stringify(parsed.model)},"provider":"floor","request_id":${id}}`).digest("hex");
      const response = responses.open(id, session);
      reserved.set(id, credits);
      admissions.push({ id, credits, digest, body, session });
      schedule();
      return response;
    },
    message(ws, message) {
      const frame = packr.unpack(message) as Frame;
      if (frame.t === "hello") {
        ws.data.session!.key = createPublicKey({ key: Buffer.from(frame.key), format: "der", type: "spki" });
        return;
      }
      if (frame.t === "receipt") {
        const credits = reserved.get(frame.id);
        if (credits === undefined || !verify(null, Buffer.from(frame.body), ws.data.session!.key!, frame.sig)) return;
        const receipt = JSON.parse(frame.body) as { request_id: number; output_tokens: number; input_tokens: number };
        if (receipt.request_id !== frame.id) return;
        reserved.delete(frame.id);
        settlements.push({ id: frame.id, tokens: receipt.input_tokens + receipt.output_tokens, credits });
        schedule();
        return;
      }
      if (frame.t === "head") responses.head(frame.id, frame.status, frame.type);
      else if (frame.t === "data") responses.data(frame.id, frame.bytes);
      else if (frame.t === "end") responses.end(frame.id);
    },
  });
}

const CONTENT_KEY = Buffer.from('"content":');

/** Occurrences of `"content":` in a chunk (a token each: one per delta, one in a whole answer). */
function contentKeys(bytes: Uint8Array): number {
  const buf = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  let n = 0;
  for (let i = buf.indexOf(CONTENT_KEY); i >= 0; i = buf.indexOf(CONTENT_KEY, i + CONTENT_KEY.length)) n++;
  return n;
}

function client(wsUrl: string, upstream: string) {
  const target = `${upstream}/v1/chat/completions`;
  const { privateKey, publicKey } = generateKeyPairSync("ed25519");
  const ws = new WebSocket(wsUrl);
  ws.binaryType = "nodebuffer";
  const send = (frame: Frame) => ws.send(packr.pack(frame));
  ws.onopen = () => {
    send({ t: "hello", key: publicKey.export({ format: "der", type: "spki" }) });
    console.log(JSON.stringify({ event: "floor_client_connected" }));
  };
  ws.onmessage = async (event) => {
    const job = packr.unpack(event.data as Uint8Array) as Extract<Frame, { t: "job" }>;
    const hash = createHash("sha256");
    let tokens = 0;
    try {
      const res = await fetch(target, { method: "POST", headers: { "content-type": "application/json" }, body: job.body });
      send({ t: "head", id: job.id, status: res.status, type: res.headers.get("content-type") ?? "application/octet-stream" });
      for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
        hash.update(chunk);
        tokens += contentKeys(chunk);
        send({ t: "data", id: job.id, bytes: chunk });
      }
    } catch {}
    send({ t: "end", id: job.id });
    // The receipt: canonical JSON (keys in order) of the output's hash and usage, signed.
    const body = JSON.stringify({ input_tokens: Math.ceil(job.body.length / 4), output_hash: hash.digest("hex"), output_tokens: tokens, request_id: job.id });
    send({ t: "receipt", id: job.id, body, sig: sign(null, Buffer.from(body), privateKey) });
  };
}

if (import.meta.main) {
  const [role, a, b] = process.argv.slice(2);
  if (role === "server") server(a!);
  else if (role === "client") client(a!, b!);
  else throw new Error("usage: floor.ts server DATA_DIR | client WS_URL UPSTREAM");
}
