// A judging thread that takes every job and never answers (test/receipts/judge.test.ts): a receipt
// answered while it runs was judged on the calling thread.
export {};
declare const self: Worker;

self.addEventListener("message", () => {});
