// What both crash-chaos variants share (test/chaos/chaos.ts: one embedded gateway; test/chaos/cluster.ts:
// cluster nodes on PostgreSQL and Redis): provider processes, buyers that act as the official SDKs
// do, the invariants checked against the stored ledger, and the summary line.
import { join } from "node:path";
import { collectJsonLines, MAIN, modelHash } from "../support/harness.ts";

export const MODEL = "chaos-model";

export type Proc = ReturnType<typeof Bun.spawn>;

export interface Logged {
  proc: Proc;
  events: Record<string, unknown>[];
}

export async function killHard(proc: Proc): Promise<void> {
  if (proc.exitCode === null && proc.signalCode === null) proc.kill("SIGKILL");
  await proc.exited;
}

/** The last `max` characters a process writes to a stream; `read()` resolves once the stream has ended. */
export function keepTail(stream: ReadableStream<Uint8Array>, max = 2000): { read(): Promise<string> } {
  let tail = "";
  const decoder = new TextDecoder();
  const done = (async () => {
    for await (const chunk of stream) tail = (tail + decoder.decode(chunk, { stream: true })).slice(-max);
  })().catch(() => {});
  return { read: async () => (await done, tail) };
}

/** Why a process that had to stay up exited: its exit code, the end of its stderr and its last log lines. */
export async function exitReason(name: string, proc: Proc, stderr: { read(): Promise<string> }, events: Record<string, unknown>[]): Promise<string> {
  return `${name} exited with ${proc.exitCode}: ${(await stderr.read()).trim().slice(-600)} ${JSON.stringify(events.slice(-3)).slice(0, 600)}`;
}

/** Runs `gateway ARGS…` to completion (operator CLI). */
export function cli(args: string[]): { exitCode: number; stdout: string } {
  const r = Bun.spawnSync(["bun", MAIN, ...args], { stdout: "pipe", stderr: "pipe" });
  return { exitCode: r.exitCode ?? -1, stdout: r.stdout.toString() };
}

/**
 * A synthetic provider runtime; with several gateways it moves to the next after a dropped connection.
 * `model` and `tokensPerSecond`: what it serves and how fast (the chaos model at 400 tokens/s).
 */
export function startProvider(keyDir: string, gateways: string[], id: string, extraArgs: string[] = [], o: { model?: string; tokensPerSecond?: number } = {}): Logged {
  const model = o.model ?? MODEL;
  const proc = Bun.spawn(
    [
      "bun", MAIN, "provider", ...gateways.flatMap((g) => ["--gateway", g]), "--id", id,
      "--key-file", join(keyDir, `${id}.key`), "--engine", "synthetic", "--backoff-min-ms", "20", "--backoff-max-ms", "200",
      "--max-concurrency", "4", "--synthetic-ttft-ms", "5", "--synthetic-tokens-per-second", String(o.tokensPerSecond ?? 400),
      "--model", `${model}=${modelHash(model)}`, ...extraArgs,
    ],
    { stdout: "pipe", stderr: "ignore" },
  );
  const events: Record<string, unknown>[] = [];
  collectJsonLines(proc.stdout as ReadableStream<Uint8Array>, events);
  return { proc, events };
}

/** Content bytes each buyer read, by the gateway's request id. */
export type Received = Map<string, number>;

/** A request whose connection failed before any response came: the SDK sends it again. */
export interface Unanswered {
  body: string;
  stream: boolean;
}

/** What the buyers' SDK-style retries got. */
export interface Retries {
  unanswered: Unanswered[];
  sent: number;
  replayed: number;
  /** Requests that had not ended 15 s after they were sent (a silent hang: never expected). */
  timedOut: number;
  /** When given: the longest a request took, from its send to its end (ms). */
  longestMs?: number;
  /** When given: each refusal (a status other than 200) counted as `STATUS code[ retryable]`. */
  refused?: Map<string, number>;
}

/**
 * One buyer request to the gateway at `base` (http://HOST:PORT). A connection that fails before any
 * response is recorded in `retries.unanswered` (an SDK sends such a request once more); `again` is
 * that retry (same body, `x-stainless-retry-count: 1`). True when a complete answer was read.
 */
export async function oneRequest(
  base: string,
  apiKey: string,
  stream: boolean,
  received: Received,
  random: () => number,
  retries: Retries | null,
  again: Unanswered | null = null,
): Promise<boolean> {
  const body = again?.body ?? JSON.stringify({ model: MODEL, messages: [{ role: "user", content: `chaos ${random()}` }], max_tokens: 4 + Math.floor(random() * 30), stream });
  let response: Response;
  const signal = AbortSignal.timeout(15_000);
  const sentAt = performance.now();
  const hung = () => {
    if (signal.aborted && retries) retries.timedOut++;
  };
  const took = () => {
    if (retries?.longestMs !== undefined) retries.longestMs = Math.max(retries.longestMs, Math.round(performance.now() - sentAt));
  };
  try {
    response = await fetch(`${base}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${apiKey}`, "content-type": "application/json", ...(again ? { "x-stainless-retry-count": "1" } : {}) },
      body,
      signal,
    });
  } catch {
    hung();
    took();
    // The gateway died before answering: an SDK retries such a request (once).
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
      const text = await response.text();
      if (retries?.refused) {
        let what = "";
        try {
          const error = (JSON.parse(text) as { error?: { code?: string; retryable?: boolean } }).error;
          what = `${error?.code ?? "?"}${error?.retryable === true ? " retryable" : ""}`;
        } catch {
          what = "(not JSON)";
        }
        const key = `${response.status} ${what}`;
        retries.refused.set(key, (retries.refused.get(key) ?? 0) + 1);
      }
      took();
      return false;
    }
    const utf8 = new TextEncoder();
    if (!stream) {
      const body = (await response.json()) as { choices: { message: { content: string | null } }[] };
      received.set(id, utf8.encode(body.choices[0]?.message.content ?? "").byteLength);
      took();
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
    took();
    return true;
  } catch {
    hung();
    took();
    return false; // the gateway died under the response: expected (an SDK does not retry once it has one)
  }
}

/** A settlement row as both stores keep it (same column names in SQLite and PostgreSQL). */
export interface SettlementRow {
  request_id: string;
  attempt_n: number;
  label: string;
  provider_credits: number;
  debit_credits: number;
  delivered_start_byte: number | null;
  delivered_end_byte: number | null;
}

export const SETTLEMENT_COLUMNS = "request_id, attempt_n, label, provider_credits, debit_credits, delivered_start_byte, delivered_end_byte";

/**
 * The ledger invariants of a run, from what the store holds and what the processes saw: every
 * acknowledged grant is stored; every `settled` frame a provider logged matches its settlement;
 * nothing is pending after its deadline; at most one charged attempt per request, billed at most
 * the bytes its buyer (or its retry's replay) read.
 */
export function ledgerViolations(input: {
  acknowledgedGrants: string[];
  storedGrantMemos: Set<string>;
  settlements: SettlementRow[];
  providerEvents: Record<string, unknown>[];
  received: Received;
}): string[] {
  const violations: string[] = [];
  for (const memo of input.acknowledgedGrants) if (!input.storedGrantMemos.has(memo)) violations.push(`acknowledged grant lost: ${memo}`);
  const byKey = new Map(input.settlements.map((r) => [`${r.request_id}#${r.attempt_n}`, r]));
  for (const e of input.providerEvents) {
    if (e.event !== "settled") continue;
    const row = byKey.get(`${e.request_id}#${e.attempt_n}`);
    if (!row) violations.push(`settled frame without a settlement: ${e.request_id}#${e.attempt_n}`);
    else if (row.label !== e.label || Number(row.provider_credits) !== e.provider_credits) violations.push(`settled frame differs from the ledger: ${e.request_id}#${e.attempt_n}`);
  }
  const charged = new Map<string, number>();
  for (const r of input.settlements) {
    if (r.label === "pending") violations.push(`still pending after its deadline: ${r.request_id}#${r.attempt_n}`);
    if (Number(r.debit_credits) <= 0) continue;
    charged.set(r.request_id, (charged.get(r.request_id) ?? 0) + 1);
    const bytes = Number(r.delivered_end_byte ?? 0) - Number(r.delivered_start_byte ?? 0);
    const got = input.received.get(r.request_id);
    if (got === undefined) violations.push(`charged, but no buyer saw the request: ${r.request_id}`);
    else if (bytes > got) violations.push(`charged for ${bytes} bytes, buyer read ${got}: ${r.request_id}`);
  }
  for (const [id, n] of charged) if (n > 1) violations.push(`charged ${n} times: ${id}`);
  return violations;
}

/** What every run reports (cluster runs add the `cluster` figures). */
export interface RunResult {
  run: number;
  seed: number;
  killed: string[];
  killAtMs: number;
  requests: number;
  settlements: number;
  grantsAcknowledged: number;
  /** Restart → listening (the store opened, pending settlements resumed; a cluster node: joined). */
  listeningMs: number;
  /** Restart → a completion served again (by the restarted gateway or node). */
  recoverMs: number;
  /** Requests a crash left unanswered, sent again (after the restart, or to another node), and how many were replayed. */
  retried: number;
  replayed: number;
  cluster?: ClusterFigures;
  /** Wall time of the run, start to checks. */
  durationMs?: number;
  violations: string[];
}

export interface ClusterFigures {
  /** The run's fault (test/chaos/cluster.ts) and how many nodes the cluster had. */
  mode: string;
  nodes: number;
  /** Refusals the buyers got, by `STATUS code[ retryable]`. */
  refused: Record<string, number>;
  /** Split runs: how long the node was cut off, what the survivor answered the free account's next streams, how its held ones ended. */
  split?: { cutMs: number; probeStatuses: number[]; heldEnded: (string | null)[] };
  /** The killed (or split) node, and whether it held provider sockets or buyers' requests when it died. */
  victim: string;
  heldProviders: number;
  /** How long the node stayed down before its restart (0: restarted at once, as systemd does). */
  downMs: number;
  /** Kill → every provider the node held connected to a survivor and a completion served by a survivor (null: it held none). */
  providersBackMs: number | null;
  /** Kill → no slot taken before the kill still counted by Redis (released by survivors, expired for the dead node). */
  slotsFreedMs: number | null;
  /** The longest a buyer's request took, send to end (ms). */
  longestMs?: number;
}

export function failedRun(run: number, seed: number, error: unknown): RunResult {
  // The harness itself failed (a process did not start in time): reported, not counted as a pass.
  return { run, seed, killed: [], killAtMs: 0, requests: 0, settlements: 0, grantsAcknowledged: 0, listeningMs: -1, recoverMs: -1, retried: 0, replayed: 0, violations: [`harness: ${String(error)}`] };
}

const percentiles = (values: number[]) => {
  const sorted = [...values].sort((a, b) => a - b);
  return { p50: sorted[Math.floor(sorted.length / 2)] ?? null, max: sorted.at(-1) ?? null };
};

export const realViolations = (r: RunResult) => r.violations.filter((v) => !v.startsWith("data dir kept"));

/** The summary line of an invocation. */
export function summary(results: RunResult[]): Record<string, unknown> {
  const count = (what: string) => results.reduce((n, r) => n + r.killed.filter((k) => k === what || k.startsWith(`${what}:`)).length, 0);
  const clusterRuns = results.flatMap((r) => (r.cluster ? [r.cluster] : []));
  return {
    runs: results.length,
    failed: results.filter((r) => realViolations(r).length > 0).length,
    gateway_kills: count("gateway"),
    node_kills: count("node"),
    provider_kills: count("provider"),
    cli_kills: count("cli"),
    requests: results.reduce((n, r) => n + r.requests, 0),
    settlements: results.reduce((n, r) => n + r.settlements, 0),
    retried: results.reduce((n, r) => n + r.retried, 0),
    replayed: results.reduce((n, r) => n + r.replayed, 0),
    recover_ms: percentiles(results.map((r) => r.recoverMs).filter((n) => n >= 0)),
    listening_ms: { max: Math.max(...results.map((r) => r.listeningMs)) },
    ...(clusterRuns.length > 0
      ? {
          modes: clusterRuns.reduce<Record<string, number>>((m, c) => ({ ...m, [c.mode]: (m[c.mode] ?? 0) + 1 }), {}),
          refused: clusterRuns.reduce<Record<string, number>>((m, c) => {
            for (const [k, n] of Object.entries(c.refused)) m[k] = (m[k] ?? 0) + n;
            return m;
          }, {}),
          kills_of_provider_nodes: clusterRuns.filter((c) => c.heldProviders > 0).length,
          providers_back_ms: percentiles(clusterRuns.flatMap((c) => (c.providersBackMs === null ? [] : [c.providersBackMs]))),
          slots_freed_ms: percentiles(clusterRuns.flatMap((c) => (c.slotsFreedMs === null ? [] : [c.slotsFreedMs]))),
        }
      : {}),
  };
}
