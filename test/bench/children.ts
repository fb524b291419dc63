// What the single-purpose bench scripts share: reading a child's JSON log lines, its RSS and CPU time, percentiles,
// and a `gateway serve` child in enforce mode with the bench models in its signed catalog.
import { readdirSync, readFileSync } from "node:fs";

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

/** CPU seconds (user + system) from a /proc stat file — a process's, or a thread's (/proc/PID/task/TID/stat); 0 once it is gone. */
export function cpuSeconds(pid: number, path = `/proc/${pid}/stat`): number {
  try {
    const fields = readFileSync(path, "utf8").split(") ")[1]!.split(" ");
    return (Number(fields[11]) + Number(fields[12])) / 100; // utime, stime in clock ticks (100 Hz)
  } catch {
    return 0;
  }
}

/**
 * CPU seconds of a PostgreSQL server: the postmaster's own and its reaped children's (autovacuum workers,
 * backends that ended), plus every child alive now. Listed afresh at each call, so that a backend or an
 * autovacuum worker started inside a measured window is counted, which a pid list taken once misses.
 */
export function postgresCpuSeconds(dataDir: string): number {
  const postmaster = Number(readFileSync(`${dataDir}/postmaster.pid`, "utf8").split("\n")[0]);
  let total = 0;
  try {
    const fields = readFileSync(`/proc/${postmaster}/stat`, "utf8").split(") ")[1]!.split(" ");
    total += (Number(fields[11]) + Number(fields[12]) + Number(fields[13]) + Number(fields[14])) / 100; // utime, stime, cutime, cstime
  } catch {
    return 0;
  }
  for (const line of Bun.spawnSync(["ps", "-o", "pid=", "--ppid", String(postmaster)]).stdout.toString().split("\n")) {
    if (line.trim()) total += cpuSeconds(Number(line.trim()));
  }
  return total;
}

/** CPU seconds of each of a process's threads, summed by thread name (threads that end meanwhile are skipped). */
export function threadCpuByName(pid: number): Map<string, number> {
  const byName = new Map<string, number>();
  for (const t of readdirSync(`/proc/${pid}/task`)) {
    let name: string;
    try {
      name = readFileSync(`/proc/${pid}/task/${t}/comm`, "utf8").trim();
    } catch {
      continue;
    }
    byName.set(name, (byName.get(name) ?? 0) + cpuSeconds(pid, `/proc/${pid}/task/${t}/stat`));
  }
  return byName;
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
