// The gateway's receipt-judging thread (src/receipts/judge.ts): every rule of DESIGN §4, signature
// included (node:crypto, synchronous here), for each job of a message; one answer message per message.
import { judgedOf, type JudgeAnswer, type JudgeJob } from "./judge.ts";
import { verifyReceipt } from "./verify.ts";

declare const self: Worker;

self.addEventListener("message", (event: MessageEvent<JudgeJob[]>) => {
  const answers: JudgeAnswer[] = event.data.map(({ id, input }) => {
    try {
      return { id, result: judgedOf(verifyReceipt(input)) };
    } catch {
      return { id, result: null };
    }
  });
  postMessage(answers);
});
