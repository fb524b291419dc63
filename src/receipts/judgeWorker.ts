// The gateway's receipt-judging thread (src/receipts/judge.ts): every rule of docs/receipts.md, signature
// included (node:crypto, synchronous here), for each job of a message; one answer message per message.
import { judgedOf, type JudgeAnswer, type JudgeJob } from "./judge.ts";
import { verifyReceipt } from "./verify.ts";

declare const self: Worker;

/** Session keys by their base64 text (few: one per provider session; bounded anyway). */
const keys = new Map<string, Uint8Array>();
const keyOf = (text: string): Uint8Array => {
  let key = keys.get(text);
  if (key === undefined) {
    if (keys.size >= 1024) keys.clear();
    keys.set(text, (key = new Uint8Array(Buffer.from(text, "base64"))));
  }
  return key;
};

self.addEventListener("message", (event: MessageEvent<string>) => {
  const answers: JudgeAnswer[] = (JSON.parse(event.data) as JudgeJob[]).map(({ id, input }) => {
    try {
      return { id, result: judgedOf(verifyReceipt({ ...input, sessionPublicKey: keyOf(input.sessionPublicKey) })) };
    } catch {
      return { id, result: null };
    }
  });
  postMessage(JSON.stringify(answers));
});
