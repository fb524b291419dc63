// Natural batching (docs/decisions.md, "Settlements in batches"): a call made while none of its key is
// in flight goes alone, at once — no timer, no added latency when idle. Calls made while one is in
// flight wait for it and then go together in one call of `many`, at most `max` at a time. If a batch
// fails, each of its inputs is tried alone, so one bad input fails only its own caller; `onBatchFailed`
// hears of it (a batch should not fail: one that does is a bug or an engine in trouble worth a log line).

interface Waiting<I, O> {
  input: I;
  done: PromiseWithResolvers<O>;
}

/** One queue per key (one in flight per key); a key's queue exists only while it is busy. */
export function keyedBatcher<I, O>(
  one: (input: I) => Promise<O>,
  many: (inputs: I[]) => Promise<O[]>,
  max: number,
  onBatchFailed: (size: number, error: unknown) => void = () => {},
): (key: string, input: I) => Promise<O> {
  const busy = new Map<string, Waiting<I, O>[]>();

  const runAlone = async (w: Waiting<I, O>) => {
    try {
      w.done.resolve(await one(w.input));
    } catch (err) {
      w.done.reject(err);
    }
  };

  const drain = async (key: string, waiting: Waiting<I, O>[]) => {
    while (waiting.length > 0) {
      const batch = waiting.splice(0, max);
      if (batch.length === 1) {
        await runAlone(batch[0]!);
        continue;
      }
      let outputs: O[];
      try {
        outputs = await many(batch.map((w) => w.input));
      } catch (error) {
        // A failed batch committed nothing (one transaction): each input alone, with its own outcome.
        onBatchFailed(batch.length, error);
        for (const w of batch) await runAlone(w);
        continue;
      }
      batch.forEach((w, i) => w.done.resolve(outputs[i]!));
    }
    busy.delete(key);
  };

  return (key: string, input: I) => {
    const done = Promise.withResolvers<O>();
    const waiting = busy.get(key);
    if (waiting !== undefined) {
      waiting.push({ input, done });
    } else {
      const fresh = [{ input, done }];
      busy.set(key, fresh);
      void drain(key, fresh);
    }
    return done.promise;
  };
}

/** keyedBatcher with one key: one call in flight at a time. */
export function naturalBatcher<I, O>(
  one: (input: I) => Promise<O>,
  many: (inputs: I[]) => Promise<O[]>,
  max: number,
  onBatchFailed?: (size: number, error: unknown) => void,
): (input: I) => Promise<O> {
  const run = keyedBatcher(one, many, max, onBatchFailed);
  return (input: I) => run("", input);
}
