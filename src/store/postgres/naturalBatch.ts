// Natural batching (docs/decisions.md, "Settlements in batches"): a call made while none is in flight
// goes alone, at once — no timer, no added latency when idle. Calls made while one is in flight wait
// for it and then go together in one call of `many`, at most `max` at a time. If a batch fails, each
// of its inputs is tried alone, so one bad input fails only its own caller.

export function naturalBatcher<I, O>(one: (input: I) => Promise<O>, many: (inputs: I[]) => Promise<O[]>, max: number): (input: I) => Promise<O> {
  const waiting: { input: I; done: PromiseWithResolvers<O> }[] = [];
  let busy = false;

  const runAlone = async (w: { input: I; done: PromiseWithResolvers<O> }) => {
    try {
      w.done.resolve(await one(w.input));
    } catch (err) {
      w.done.reject(err);
    }
  };

  const drain = async () => {
    busy = true;
    while (waiting.length > 0) {
      const batch = waiting.splice(0, max);
      if (batch.length === 1) {
        await runAlone(batch[0]!);
        continue;
      }
      let outputs: O[] | null = null;
      try {
        outputs = await many(batch.map((w) => w.input));
      } catch {
        // Nothing of a failed batch committed (one transaction): each input alone, with its own outcome.
        for (const w of batch) await runAlone(w);
        continue;
      }
      batch.forEach((w, i) => w.done.resolve(outputs[i]!));
    }
    busy = false;
  };

  return (input: I) => {
    const done = Promise.withResolvers<O>();
    waiting.push({ input, done });
    if (!busy) void drain();
    return done.promise;
  };
}
