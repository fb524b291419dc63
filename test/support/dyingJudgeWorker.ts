// A judging thread that dies at its first message (test/receipts/judge.test.ts).
declare const self: Worker;
self.addEventListener("message", () => process.exit(3));
