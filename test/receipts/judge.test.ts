// The gateway's receipt judges (src/receipts/judge.ts): the judging thread answers every receipt of a
// burst with the verifier's verdict, and a thread that cannot start or dies loses no receipt — those
// it held are judged on the calling thread, with the same verdicts; a lone receipt while the gateway
// serves nothing is judged on the calling thread too.
import { afterEach, expect, test } from "bun:test";
import { verifyReceipt, type VerifyReceiptInput } from "../../src/receipts/index.ts";
import { judgedOf, workerJudge, type JudgedReceipt, type ReceiptJudge } from "../../src/receipts/judge.ts";
import { goldenEnvelope, goldenInput } from "./golden-case.ts";

const judges: ReceiptJudge[] = [];
afterEach(() => {
  for (const j of judges.splice(0)) j.stop();
});
const judgeOf = (...args: Parameters<typeof workerJudge>) => {
  const j = workerJudge(...args);
  judges.push(j);
  return j;
};

const forged = goldenInput({ envelope: goldenEnvelope.slice(0, -10) + (goldenEnvelope.at(-10) === "A" ? "B" : "A") + goldenEnvelope.slice(-9) });
/** A burst of receipts judged in one turn: the golden one, a forged one, a late one, alternating. */
const burst: VerifyReceiptInput[] = Array.from({ length: 30 }, (_, i) =>
  [goldenInput(), forged, goldenInput({ pendingDeadlineMs: goldenInput().arrivalMs - 1 })][i % 3]!,
);
const expected = burst.map((input) => judgedOf(verifyReceipt(input)));

/** Judges the burst; every `done` must come after `judge` returned true. */
async function judgeBurst(judge: ReceiptJudge): Promise<JudgedReceipt[]> {
  return Promise.all(
    burst.map((input) => {
      let returned = false;
      return new Promise<JudgedReceipt>((resolve) => {
        returned = judge.judge(input, (result) => {
          expect(returned).toBe(true);
          resolve(result);
        });
      });
    }),
  );
}

test("the judging thread answers a burst with the verifier's verdicts, in a later turn", async () => {
  const failures: string[] = [];
  const judge = judgeOf((e) => failures.push(e));
  expect(await judgeBurst(judge)).toEqual(expected);
  expect(expected.map((r) => r.verdict.label)).toContain("verified");
  expect(expected.map((r) => (r.verdict.label === "quarantined" ? r.verdict.reason : null))).toEqual(
    expect.arrayContaining(["bad_signature", "late"]),
  );
  expect(failures).toEqual([]);
});

test("a thread that cannot start: every receipt is judged inline, the failure reported", async () => {
  const failures: string[] = [];
  const judge = judgeOf((e) => failures.push(e), new URL("./no-such-judge-worker.ts", import.meta.url).href);
  const results = await Promise.all(burst.map((input) => new Promise<JudgedReceipt>((resolve) => void judge.judge(input, resolve))));
  expect(results).toEqual(expected);
  expect(failures.length).toBeGreaterThan(0);
});

test("a thread that dies holding receipts: those are judged inline, and so is everything after the third death", async () => {
  const failures: string[] = [];
  const judge = judgeOf((e) => failures.push(e), new URL("../support/dyingJudgeWorker.ts", import.meta.url).href);
  for (let round = 1; round <= 4; round++) {
    const results = await Promise.all(burst.map((input) => new Promise<JudgedReceipt>((resolve) => void judge.judge(input, resolve))));
    expect(results).toEqual(expected);
    expect(failures.length).toBe(Math.min(round, 3));
  }
});

test("a lone receipt while nothing is served is judged on the calling thread, a turn later; a burst, or a receipt while busy, goes to the thread", async () => {
  let idle = false;
  // The thread never answers: whatever is answered was judged here.
  const judge = judgeOf(() => {}, new URL("../support/silentJudgeWorker.ts", import.meta.url).href, () => idle);
  const nextTurn = () => new Promise<void>((resolve) => setImmediate(resolve));
  let answeredByThread = 0;
  judge.judge(goldenInput(), () => answeredByThread++);
  await nextTurn();
  idle = true;
  for (const input of burst.slice(0, 3)) judge.judge(input, () => answeredByThread++);
  await nextTurn();
  for (const input of [goldenInput(), forged]) {
    let returned = false;
    const result = await new Promise<JudgedReceipt>((resolve) => {
      returned = judge.judge(input, (r) => {
        expect(returned).toBe(true);
        resolve(r);
      });
    });
    expect(result).toEqual(judgedOf(verifyReceipt(input)));
  }
  expect(answeredByThread).toBe(0);
});

test("stop(): receipts still being judged never answer", async () => {
  const judge = workerJudge();
  let answered = 0;
  for (const input of burst) judge.judge(input, () => answered++);
  judge.stop();
  // Another thread's full round trip: time enough for the stopped one's answers, had any been kept.
  expect(await judgeBurst(judgeOf())).toEqual(expected);
  expect(answered).toBe(0);
});
