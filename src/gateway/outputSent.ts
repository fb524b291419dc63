// When the response bytes written so far have left the process. Bun hands a direct stream's writes
// to the socket only after the turn's immediates have run — an immediate queued in the same turn
// still runs before they leave, an immediate queued from an immediate runs after (pinned by
// test/gateway/output-sent.test.ts). A write that records what reached a buyer (an attempt's delivered
// record) waits for this, so a kill -9 never leaves it covering bytes the buyer never got
// (docs/receipts.md, "Crashes").

/**
 * Queues `run` until the bytes written by this turn have been handed to their sockets — all but what
 * a socket with a full send buffer holds back in the process (a responder's `unsent()` tells that).
 */
export type AfterOutputSent = (run: () => void) => void;

/**
 * The runs of a turn share one pair of immediates, in the order they were queued: the first seals
 * the turn's batch, the second (a turn later) runs it; a run queued after the seal starts the next batch.
 */
export function afterOutputSentQueue(): AfterOutputSent {
  let batch: (() => void)[] | null = null;
  return (run) => {
    if (batch !== null) {
      batch.push(run);
      return;
    }
    const sealed = [run];
    batch = sealed;
    setImmediate(() => {
      if (batch === sealed) batch = null;
      setImmediate(() => {
        for (const each of sealed) {
          try {
            each();
          } catch (error) {
            // One run's fault must not hold back the others' writes; it surfaces as any uncaught error.
            queueMicrotask(() => {
              throw error;
            });
          }
        }
      });
    });
  };
}

/**
 * What waits for one stream's output to leave (its attempt's record, then `[DONE]`): run in the order
 * they came once the gate opens, and at once after. Synchronous, so a test's simulated turn sees it.
 */
export class OutputGate {
  private waiting: (() => void)[] | null = [];

  whenOpen(run: () => void): void {
    if (this.waiting === null) run();
    else this.waiting.push(run);
  }

  open(): void {
    const waiting = this.waiting;
    if (waiting === null) return;
    this.waiting = null;
    for (const run of waiting) run();
  }
}
