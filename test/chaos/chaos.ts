// Crash chaos with real processes (issue 26; issue 27, decision 1): `bun run chaos --runs N [--seed S]`.
// Each run: a gateway process and two provider processes on loopback, paid buyers streaming and not,
// operators granting credits with the CLI; then `kill -9` at a random moment — of the gateway, of a
// provider, or of a CLI in the middle of `credits grant` (the gateway every run, the others on some).
// The gateway is restarted on the same data dir and port, the load resumes, every attempt settles,
// and the run checks:
//   - `gateway ledger audit` is clean;
//   - no acknowledged posting is lost: every grant whose CLI exited 0 is in the ledger, and every
//     `settled` frame a provider logged matches the stored settlement (label and provider credits);
//   - no request is charged twice (at most one charged attempt per request) or beyond what its buyer
//     received (the charged attempt's delivered bytes ≤ the content bytes the buyer read). Buyers act
//     as the official SDKs do: a request whose connection failed before any response is sent once
//     more after the restart, with the same body and `x-stainless-retry-count: 1`; a replayed answer
//     carries the first run's request id, so it counts as that request received (docs/receipts.md,
//     "Crashes");
//   - the time to recover (restart → healthy → a completion served).
// Prints one JSON line per run and a summary; exits 1 if any run broke an invariant.
import { Database } from "bun:sqlite";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { collectJsonLines, MAIN, modelHash, waitFor } from "../support/harness.ts";
import { rng } from "../support/seededRandom.ts";

const MODEL = "chaos-model";

interface Args {
  runs: number;
  seed: number;
  keep: boolean;
}

function parseArgs(argv: string[]): Args {
  const args: Args = { runs: 5, seed: Date.now() % 1_000_000, keep: false };
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "--runs") args.runs = Number(argv[++i]);
    else if (argv[i] === "--seed") args.seed = Number(argv[++i]);
    else if (argv[i] === "--keep") args.keep = true;
  }
  return args;
}

type Proc = ReturnType<typeof Bun.spawn>;

function cli(dataDir: string, args: string[]): { exitCode: number; stdout: string } {
  const r = Bun.spawnSync(["bun", MAIN, ...args, "--data-dir", dataDir], { stdout: "pipe", stderr: "pipe" });
  return { exitCode: r.exitCode ?? -1, stdout: r.stdout.toString() };
}

async function freePort(): Promise<number> {
  const server = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => new Response() });
  const port = server.port!;
  server.stop(true);
  return port;
}

interface Gateway {
  proc: Proc;
  events: Record<string, unknown>[];
}

async function startGatewayProcess(dataDir: string, port: number): Promise<Gateway> {
  const proc = Bun.spawn(
    ["bun", MAIN, "serve", "--data-dir", dataDir, "--port", String(port), "--settlement-mode", "observe", "--pending-deadline-ms", "2000", "--heartbeat-interval-ms", "500"],
    { stdout: "pipe", stderr: "ignore" },
  );
  const events: Record<string, unknown>[] = [];
  collectJsonLines(proc.stdout as ReadableStream<Uint8Array>, events);
  // Generous: on a loaded shared machine a process start has taken 20 s.
  await waitFor(() => events.some((e) => e.event === "gateway_listening") || proc.exitCode !== null, 120_000, "gateway_listening");
  if (proc.exitCode !== null) throw new Error(`gateway exited with ${proc.exitCode}`);
  return { proc, events };
}

function startProvider(dataDir: string, port: number, id: string): { proc: Proc; events: Record<string, unknown>[] } {
  const proc = Bun.spawn(
    [
      "bun", MAIN, "provider", "--gateway", `ws://127.0.0.1:${port}/v1/provider/connect`, "--id", id,
      "--key-file", join(dataDir, `${id}.key`), "--engine", "synthetic", "--backoff-min-ms", "20", "--backoff-max-ms", "200",
      "--max-concurrency", "4", "--synthetic-ttft-ms", "5", "--synthetic-tokens-per-second", "400",
      "--model", `${MODEL}=${modelHash(MODEL)}`, "--advertise-uncatalogued",
    ],
    { stdout: "pipe", stderr: "ignore" },
  );
  const events: Record<string, unknown>[] = [];
  collectJsonLines(proc.stdout as ReadableStream<Uint8Array>, events);
  return { proc, events };
}

async function killHard(proc: Proc): Promise<void> {
  if (proc.exitCode === null && proc.signalCode === null) proc.kill("SIGKILL");
  await proc.exited;
}

/** Content bytes each buyer read, by the gateway's request id. */
type Received = Map<string, number>;

/** A request whose connection failed before any response came: the SDK sends it again. */
interface Unanswered {
  body: string;
  stream: boolean;
}

/** What the buyers' SDK-style retries after the restart got. */
interface Retries {
  unanswered: Unanswered[];
  sent: number;
  replayed: number;
}

async function oneRequest(
  port: number,
  apiKey: string,
  stream: boolean,
  received: Received,
  random: () => number,
  retries: Retries | null,
  again: Unanswered | null = null,
): Promise<boolean> {
  const body = again?.body ?? JSON.stringify({ model: MODEL, messages: [{ role: "user", content: `chaos ${random()}` }], max_tokens: 4 + Math.floor(random() * 30), stream });
  let response: Response;
  try {
    response = await fetch(`http://127.0.0.1:${port}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${apiKey}`, "content-type": "application/json", ...(again ? { "x-stainless-retry-count": "1" } : {}) },
      body,
      signal: AbortSignal.timeout(15_000),
    });
  } catch {
    // The gateway died before answering: an SDK retries such a request (once, here, after the restart).
    if (again === null) retries?.unanswered.push({ body, stream });
    return false;
  }
  if (again !== null && retries !== null) {
    retries.sent++;
    if (response.headers.get("idempotent-replayed") === "true") retries.replayed++;
  }
  try {
    const id = (response.headers.get("x-request-id") ?? "").replace(/^chatcmpl-/, "");
    if (response.status !== 200) {
      await response.text();
      return false;
    }
    const utf8 = new TextEncoder();
    if (!stream) {
      const body = (await response.json()) as { choices: { message: { content: string | null } }[] };
      received.set(id, utf8.encode(body.choices[0]?.message.content ?? "").byteLength);
      return true;
    }
    received.set(id, 0);
    const decoder = new TextDecoder();
    let buffered = "";
    for await (const bytes of response.body as ReadableStream<Uint8Array>) {
      buffered += decoder.decode(bytes, { stream: true });
      let nl: number;
      while ((nl = buffered.indexOf("\n\n")) >= 0) {
        const event = buffered.slice(0, nl);
        buffered = buffered.slice(nl + 2);
        if (!event.startsWith("data: {")) continue;
        const delta = (JSON.parse(event.slice(6)) as { choices?: { delta?: { content?: string } }[] }).choices?.[0]?.delta?.content;
        if (delta) received.set(id, (received.get(id) ?? 0) + utf8.encode(delta).byteLength);
      }
    }
    return true;
  } catch {
    return false; // the gateway died under the response: expected (an SDK does not retry once it has one)
  }
}

interface RunResult {
  run: number;
  seed: number;
  killed: string[];
  killAtMs: number;
  requests: number;
  settlements: number;
  grantsAcknowledged: number;
  /** Restart → listening (the store opened, pending settlements resumed). */
  listeningMs: number;
  /** Restart → a completion served again (providers reconnected). */
  recoverMs: number;
  /** Requests the crash left unanswered, sent again after the restart, and how many were replayed. */
  retried: number;
  replayed: number;
  violations: string[];
}

async function oneRun(run: number, seed: number, keep: boolean): Promise<RunResult> {
  const random = rng(seed).next;
  const dataDir = mkdtempSync(join(tmpdir(), "gw-chaos-"));
  const violations: string[] = [];
  const killed: string[] = [];
  const port = await freePort();
  const created = JSON.parse(cli(dataDir, ["accounts", "create", "--tier", "paid", "--name", "chaos"]).stdout) as { account_id: string; api_key: string };
  const acknowledged: string[] = [];
  const grant = (memo: string) => {
    if (cli(dataDir, ["credits", "grant", "--account", created.account_id, "--credits", "1000000", "--memo", memo]).exitCode === 0) acknowledged.push(memo);
  };
  grant(`chaos-${run}-initial`);

  let gateway = await startGatewayProcess(dataDir, port);
  const providers = [startProvider(dataDir, port, "chaos-a"), startProvider(dataDir, port, "chaos-b")];
  const providerEvents = () => providers.flatMap((p) => p.events);
  const healthy = async () => {
    try {
      const r = await fetch(`http://127.0.0.1:${port}/healthz`);
      return r.status === 200 && ((await r.json()) as { providers_admitted: number }).providers_admitted >= 1;
    } catch {
      return false;
    }
  };
  for (let i = 0; i < 600 && !(await healthy()); i++) await Bun.sleep(50);

  const received: Received = new Map();
  const retries: Retries = { unanswered: [], sent: 0, replayed: 0 };
  let load = true;
  let requests = 0;
  const loops = Array.from({ length: 6 }, async (_, i) => {
    while (load) {
      requests++;
      const unanswered = retries.unanswered.length;
      await oneRequest(port, created.api_key, i % 2 === 0, received, random, retries);
      // A buyer whose request went unanswered waits for its retry (after the restart) before the next.
      if (retries.unanswered.length > unanswered) break;
    }
  });

  // The crash: the gateway every run; on some runs also a provider, or a CLI in the middle of a grant.
  const killAtMs = 200 + Math.floor(random() * 1500);
  await Bun.sleep(killAtMs);
  const extra = random();
  let grantDuringKill: Promise<void> | null = null;
  if (extra < 0.3) {
    const memo = `chaos-${run}-killed-cli`;
    const proc = Bun.spawn(["bun", MAIN, "credits", "grant", "--account", created.account_id, "--credits", "5", "--memo", memo, "--data-dir", dataDir], { stdout: "ignore", stderr: "ignore" });
    grantDuringKill = (async () => {
      await Bun.sleep(Math.floor(random() * 300));
      await killHard(proc);
      if (proc.exitCode === 0) acknowledged.push(memo);
      killed.push("cli");
    })();
  } else if (extra < 0.55) {
    const victim = providers[Math.floor(random() * providers.length)]!;
    await killHard(victim.proc);
    killed.push("provider");
    providers[providers.indexOf(victim)] = startProvider(dataDir, port, victim === providers[0] ? "chaos-a" : "chaos-b");
    // keep the old events: their `settled` lines were acknowledgements too
    providers.push({ proc: victim.proc, events: victim.events });
  }
  await killHard(gateway.proc);
  killed.push("gateway");
  await grantDuringKill;
  load = false;
  await Promise.all(loops);

  // Restart and measure the time until a completion is served again.
  const restartedAt = performance.now();
  gateway = await startGatewayProcess(dataDir, port);
  const listeningMs = Math.round(performance.now() - restartedAt);
  let recoverMs = -1;
  for (let i = 0; i < 2400; i++) {
    if ((await healthy()) && (await oneRequest(port, created.api_key, false, received, random, null))) {
      recoverMs = Math.round(performance.now() - restartedAt);
      break;
    }
    await Bun.sleep(50);
  }
  if (recoverMs < 0) violations.push("did not recover within 120 s");
  // The SDKs' retries of what the crash left unanswered (a replay, or a new run if none was kept).
  for (const u of retries.unanswered) await oneRequest(port, created.api_key, u.stream, received, random, retries, u);
  grant(`chaos-${run}-after`);
  // A little load after the restart, then let every pending attempt reach its deadline (2 s).
  load = true;
  const after = Array.from({ length: 3 }, async (_, i) => {
    while (load) {
      requests++;
      await oneRequest(port, created.api_key, i % 2 === 0, received, random, retries);
    }
  });
  await Bun.sleep(500);
  load = false;
  await Promise.all(after);
  await Bun.sleep(3000);
  gateway.proc.kill("SIGTERM");
  await gateway.proc.exited;
  for (const p of providers) await killHard(p.proc);

  // Invariants.
  const audit = cli(dataDir, ["ledger", "audit"]);
  if (audit.exitCode !== 0) violations.push(`ledger audit: exit ${audit.exitCode} ${audit.stdout.slice(0, 300)}`);
  const db = new Database(join(dataDir, "gateway.db"), { readonly: true });
  let settlementCount = 0;
  try {
    const memos = new Set((db.query("SELECT memo FROM ledger_postings WHERE kind = 'grant'").all() as { memo: string }[]).map((r) => r.memo));
    for (const memo of acknowledged) if (!memos.has(memo)) violations.push(`acknowledged grant lost: ${memo}`);
    const rows = db.query("SELECT request_id, attempt_n, label, provider_credits, debit_credits, delivered_start_byte, delivered_end_byte FROM settlements").all() as {
      request_id: string;
      attempt_n: number;
      label: string;
      provider_credits: number;
      debit_credits: number;
      delivered_start_byte: number | null;
      delivered_end_byte: number | null;
    }[];
    settlementCount = rows.length;
    const byKey = new Map(rows.map((r) => [`${r.request_id}#${r.attempt_n}`, r]));
    for (const e of providerEvents()) {
      if (e.event !== "settled") continue;
      const row = byKey.get(`${e.request_id}#${e.attempt_n}`);
      if (!row) violations.push(`settled frame without a settlement: ${e.request_id}#${e.attempt_n}`);
      else if (row.label !== e.label || row.provider_credits !== e.provider_credits) violations.push(`settled frame differs from the ledger: ${e.request_id}#${e.attempt_n}`);
    }
    const charged = new Map<string, number>();
    for (const r of rows) {
      if (r.label === "pending") violations.push(`still pending after its deadline: ${r.request_id}#${r.attempt_n}`);
      if (r.debit_credits <= 0) continue;
      charged.set(r.request_id, (charged.get(r.request_id) ?? 0) + 1);
      const bytes = (r.delivered_end_byte ?? 0) - (r.delivered_start_byte ?? 0);
      const got = received.get(r.request_id);
      if (got === undefined) violations.push(`charged, but no buyer saw the request: ${r.request_id}`);
      else if (bytes > got) violations.push(`charged for ${bytes} bytes, buyer read ${got}: ${r.request_id}`);
    }
    for (const [id, n] of charged) if (n > 1) violations.push(`charged ${n} times: ${id}`);
  } finally {
    db.close();
  }
  if (!keep && violations.length === 0) rmSync(dataDir, { recursive: true, force: true });
  else violations.push(`data dir kept: ${dataDir}`);
  return { run, seed, killed, killAtMs, requests, settlements: settlementCount, grantsAcknowledged: acknowledged.length, listeningMs, recoverMs, retried: retries.sent, replayed: retries.replayed, violations };
}

if (import.meta.main) {
  const args = parseArgs(process.argv.slice(2));
  const results: RunResult[] = [];
  for (let run = 0; run < args.runs; run++) {
    let result: RunResult;
    try {
      result = await oneRun(run, args.seed + run, args.keep);
    } catch (error) {
      // The harness itself failed (a process did not start in time): reported, not counted as a pass.
      result = { run, seed: args.seed + run, killed: [], killAtMs: 0, requests: 0, settlements: 0, grantsAcknowledged: 0, listeningMs: -1, recoverMs: -1, retried: 0, replayed: 0, violations: [`harness: ${String(error)}`] };
    }
    results.push(result);
    console.log(JSON.stringify(result));
  }
  const recover = results.map((r) => r.recoverMs).filter((n) => n >= 0).sort((a, b) => a - b);
  const failed = results.filter((r) => r.violations.some((v) => !v.startsWith("data dir kept")));
  console.log(
    JSON.stringify({
      runs: results.length,
      failed: failed.length,
      gateway_kills: results.filter((r) => r.killed.includes("gateway")).length,
      provider_kills: results.filter((r) => r.killed.includes("provider")).length,
      cli_kills: results.filter((r) => r.killed.includes("cli")).length,
      requests: results.reduce((n, r) => n + r.requests, 0),
      settlements: results.reduce((n, r) => n + r.settlements, 0),
      retried: results.reduce((n, r) => n + r.retried, 0),
      replayed: results.reduce((n, r) => n + r.replayed, 0),
      recover_ms: { p50: recover[Math.floor(recover.length / 2)] ?? null, max: recover.at(-1) ?? null },
      listening_ms: { max: Math.max(...results.map((r) => r.listeningMs)) },
    }),
  );
  process.exit(failed.length === 0 ? 0 : 1);
}

export { oneRun };
