// Who judges receipts: the same pure rules (verify.ts) either on the calling thread, the signature
// checked with WebCrypto, or on a worker thread of their own. The main thread limits the gateway's
// throughput and a settlement is not on the buyer's path, so judging runs off it (docs/benchmarks.md) —
// except a lone receipt while no request is in flight, which two thread hops would only delay onto the
// next request's path.
import type { ReceiptJudgement, ReceiptVerdict, VerifyReceiptInput } from "./verify.ts";
import { checkReceipt, verdictWithSignature, verifyReceipt } from "./verify.ts";
import { verifySignatureAsync } from "./envelope.ts";

/** A receipt's verdict, and the billable usage its body claims (null when no body could be read). */
export interface JudgedReceipt {
  verdict: ReceiptVerdict;
  billable: { prompt_tokens: number; completion_tokens: number } | null;
}

export interface ReceiptJudge {
  /**
   * Judges one receipt. `done` runs once with the result: synchronously, and then this returns false,
   * or in a later turn, and then this returns true (the caller's settlement waits for it).
   */
  judge(input: VerifyReceiptInput, done: (result: JudgedReceipt) => void): boolean;
  /** Drops every judgement still running (their `done` never runs) and frees the thread, if any. */
  stop(): void;
}

/** The part of a verdict a settlement keeps (small: no receipt body). */
export function judgedOf(verdict: ReceiptJudgement): JudgedReceipt {
  const usage = verdict.receipt?.usage;
  return {
    verdict: verdict.label === "verified" ? { label: "verified" } : { label: "quarantined", reason: verdict.reason },
    billable: usage ? { prompt_tokens: usage.billable_input_tokens, completion_tokens: usage.billable_output_tokens } : null,
  };
}

/** Judges on the calling thread; only the signature runs elsewhere (WebCrypto). */
export const inlineJudge: ReceiptJudge = {
  judge(input, done) {
    const check = checkReceipt(input);
    const signature = check.signature;
    if (signature === null) {
      done(judgedOf(check.verdict));
      return false;
    }
    void verifySignatureAsync(signature.envelope, signature.publicKey).then((valid) => done(judgedOf(verdictWithSignature(check, valid))));
    return true;
  },
  stop() {},
};

/**
 * One message each way between the gateway and its judging thread, each a JSON text of an array
 * (structured clone of the input objects cost the main thread twice as much). The session key goes as
 * base64.
 */
export interface JudgeJob {
  id: number;
  input: Omit<VerifyReceiptInput, "sessionPublicKey"> & { sessionPublicKey: string };
}
/** `result` null: the rules threw on this input (a bug); the gateway judges it itself. */
export interface JudgeAnswer {
  id: number;
  result: JudgedReceipt | null;
}

/** A judging thread that crashed this often is not started again: judging goes on inline. */
const MAX_WORKER_FAILURES = 3;

// In the single binary (src/build.ts) this module is bundled into one file at the root of Bun's
// embedded file system, and the worker's entry keeps its path under src/.
const JUDGE_WORKER_URL = new URL(import.meta.url.startsWith("file:///$bunfs/") ? "./receipts/judgeWorker.ts" : "./judgeWorker.ts", import.meta.url).href;

/**
 * Judges on a worker thread (src/receipts/judgeWorker.ts; `workerUrl` for tests), started at the
 * first receipt. The jobs of one event-loop turn go as one message. If the thread cannot start or
 * dies, the receipts it held are judged inline (no receipt is lost: each is in memory until its answer
 * comes), and so is everything after the third failure. `onFailure` hears of each failure (logging).
 */
export function workerJudge(onFailure: (error: string) => void = () => {}, workerUrl = JUDGE_WORKER_URL, idle: () => boolean = () => false): ReceiptJudge {
  let worker: Worker | null = null;
  let failures = 0;
  let nextId = 0;
  let queued: JudgeJob[] = [];
  let flushScheduled = false;
  const waiting = new Map<number, { input: VerifyReceiptInput; done: (result: JudgedReceipt) => void }>();

  // A session's key is the same array for each of its receipts: encoded once.
  const keyTexts = new WeakMap<Uint8Array, string>();
  const keyText = (key: Uint8Array): string => {
    let text = keyTexts.get(key);
    if (text === undefined) keyTexts.set(key, (text = Buffer.from(key).toString("base64")));
    return text;
  };
  const judgeInline = (input: VerifyReceiptInput, done: (result: JudgedReceipt) => void) => void inlineJudge.judge(input, done);
  /** Judges a waiting receipt here, synchronously, as the thread would (node:crypto's signature check). */
  const judgeHere = (id: number) => {
    const job = waiting.get(id);
    if (job === undefined) return;
    waiting.delete(id);
    let result: JudgedReceipt;
    try {
      result = judgedOf(verifyReceipt(job.input));
    } catch {
      // As the thread's null answer: the rules threw on this input (a bug); WebCrypto's path decides.
      return judgeInline(job.input, job.done);
    }
    job.done(result);
  };
  /** Judges these waiting receipts inline instead (no thread to answer them). */
  const judgeWaitingInline = (ids: Iterable<number>) => {
    for (const id of ids) {
      const job = waiting.get(id);
      if (job === undefined) continue;
      waiting.delete(id);
      judgeInline(job.input, job.done);
    }
  };

  const fail = (error: string) => {
    failures++;
    onFailure(error);
    worker?.terminate();
    worker = null;
    queued = [];
    judgeWaitingInline([...waiting.keys()]);
  };

  const start = (): Worker | null => {
    if (worker !== null || failures >= MAX_WORKER_FAILURES) return worker;
    try {
      const w = new Worker(workerUrl);
      w.addEventListener("message", (event: MessageEvent<string>) => {
        for (const { id, result } of JSON.parse(event.data) as JudgeAnswer[]) {
          const job = waiting.get(id);
          if (job === undefined) continue;
          waiting.delete(id);
          if (result === null) judgeInline(job.input, job.done);
          else job.done(result);
        }
      });
      w.addEventListener("error", (event) => {
        event.preventDefault();
        if (worker === w) fail(String((event as ErrorEvent).message ?? "worker error"));
      });
      w.addEventListener("close", () => {
        if (worker === w) fail("worker exited");
      });
      // A judging thread alone must not keep the process alive.
      w.unref();
      worker = w;
    } catch (error) {
      failures++;
      onFailure(String(error));
    }
    return worker;
  };

  const flush = () => {
    flushScheduled = false;
    const jobs = queued;
    queued = [];
    if (jobs.length === 0) return;
    if (worker === null) judgeWaitingInline(jobs.map((job) => job.id));
    // A lone receipt while no request is being served (one request at a time): judged here, in the turn
    // after its response went out, rather than by two thread hops whose answer lands on the next
    // request's path (docs/benchmarks.md, "Concurrency 1 pass").
    else if (jobs.length === 1 && idle()) judgeHere(jobs[0]!.id);
    else worker.postMessage(JSON.stringify(jobs));
  };

  return {
    judge(input, done) {
      if (start() === null) return inlineJudge.judge(input, done);
      const id = nextId++;
      waiting.set(id, { input, done });
      queued.push({ id, input: { ...input, sessionPublicKey: keyText(input.sessionPublicKey) } });
      if (!flushScheduled) {
        flushScheduled = true;
        setImmediate(flush);
      }
      return true;
    },
    stop() {
      waiting.clear();
      queued = [];
      const w = worker;
      worker = null;
      w?.terminate();
    },
  };
}
