// What the single-purpose bench scripts share: reading a child's JSON log lines, its RSS, percentiles,
// and a `gateway serve` child in enforce mode with the bench models in its signed catalog.
import { readFileSync } from "node:fs";

/** Resolves with the child's first JSON stdout line matching `predicate`, then keeps draining stdout. */
export async function firstJsonLine(proc: ReturnType<typeof Bun.spawn>, predicate: (o: Record<string, unknown>) => boolean) {
  const decoder = new TextDecoder();
  let buffered = "";
  const reader = (proc.stdout as ReadableStream<Uint8Array>).getReader();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) throw new Error("process ended before the expected line");
    buffered += decoder.decode(value, { stream: true });
    for (const line of buffered.split("\n")) {
      try {
        const o = JSON.parse(line);
        if (predicate(o)) {
          // Keep draining: a child whose stdout pipe fills holds its unsent log lines in memory
          // (inflating the RSS these scripts measure) and retries the write on every turn.
          void (async () => {
            while (!(await reader.read()).done);
          })();
          return o;
        }
      } catch {}
    }
  }
}

export const rssKb = (pid: number) => Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, "utf8"))![1]);

/** The p-th percentile of ascending samples. */
export const pct = (sorted: number[], p: number) => sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]!;

/**
 * `gateway serve` on a random port in enforce mode (the default), `models` signed into its catalog;
 * limits are raised by configuration only. Resolves with the child and its port once it listens.
 */
export async function spawnBenchGateway(main: string, dataDir: string, models: Record<string, string>) {
  Bun.spawnSync(["bun", main, "catalog", "init", "--data-dir", dataDir]);
  for (const [model, hash] of Object.entries(models)) {
    const added = Bun.spawnSync(["bun", main, "catalog", "add", "--model-id", model, "--model-hash", hash, "--data-dir", dataDir]);
    if (added.exitCode !== 0) throw new Error(`catalog add ${model}: ${added.stderr.toString()}`);
  }
  const gateway = Bun.spawn(
    ["bun", main, "serve", "--port", "0", "--data-dir", dataDir, "--log-level", "info",
      "--free-concurrent-requests", "4096", "--free-daily-tokens", "1000000000"],
    { stdout: "pipe", stderr: "inherit" },
  );
  const listening = await firstJsonLine(gateway, (o) => o.event === "gateway_listening");
  return { gateway, port: listening.port as number };
}
