// Soak: `bun run soak --minutes N`. A gateway process under mixed load for N minutes: paid buyers
// streaming and not, hostile clients (bodies that never finish, buyers that never read, bad JSON,
// lone surrogates, receipt floods are covered by the fuzz and defect tests), and provider churn (a
// provider killed and restarted every 20 s). Every 10 s it samples the gateway's RSS and open file
// descriptors (/proc) and the event-loop delay as the extra latency of GET /healthz. After the first
// third (warm-up) it fails when the last third's RSS or fds exceed the warm-up's by more than 10 %.
import { readdirSync, readFileSync, mkdtempSync, rmSync } from "node:fs";
import { connect } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { collectJsonLines, MAIN, modelHash, waitFor } from "../support/harness.ts";

const MODEL = "soak-model";
const minutes = Number(process.argv[process.argv.indexOf("--minutes") + 1] ?? 3) || 3;

const cli = (dataDir: string, args: string[]) => Bun.spawnSync(["bun", MAIN, ...args, "--data-dir", dataDir], { stdout: "pipe" }).stdout.toString();

const dataDir = mkdtempSync(join(tmpdir(), "gw-soak-"));
const account = JSON.parse(cli(dataDir, ["accounts", "create", "--tier", "paid", "--name", "soak"])) as { account_id: string; api_key: string };
cli(dataDir, ["credits", "grant", "--account", account.account_id, "--credits", "1000000000"]);
const probe = Bun.serve({ port: 0, fetch: () => new Response() });
const port = probe.port!;
probe.stop(true);
const gateway = Bun.spawn(
  ["bun", MAIN, "serve", "--data-dir", dataDir, "--port", String(port), "--settlement-mode", "observe", "--request-body-timeout-ms", "2000", "--stream-stall-ms", "2000", "--log-level", "warn",
   // Room for the 8 buyers and the hostile never-reading one: at the default 2 a paid account gets
   // mostly 429s, and the soak would measure refusals instead of served load.
   "--paid-concurrent-requests", "16"],
  { stdout: "pipe", stderr: "ignore" },
);
const events: Record<string, unknown>[] = [];
collectJsonLines(gateway.stdout as ReadableStream<Uint8Array>, events);
await Bun.sleep(1500);

const providerArgs = (id: string) => [
  "bun", MAIN, "provider", "--gateway", `ws://127.0.0.1:${port}/v1/provider/connect`, "--id", id, "--key-file", join(dataDir, `${id}.key`),
  "--engine", "synthetic", "--max-concurrency", "8", "--synthetic-ttft-ms", "5", "--synthetic-tokens-per-second", "300",
  "--model", `${MODEL}=${modelHash(MODEL)}`, "--advertise-uncatalogued", "--backoff-min-ms", "20", "--backoff-max-ms", "200",
];
const providers = ["soak-a", "soak-b", "soak-c"].map((id) => ({ id, proc: Bun.spawn(providerArgs(id), { stdout: "ignore", stderr: "ignore" }) }));
await waitFor(() => true, 1);
await Bun.sleep(2000);

let running = true;
let completed = 0;
let failed = 0;
/** Buyers' answers other than 200, by status (0: no answer). */
const refusals: Record<string, number> = {};
const body = (stream: boolean, extra = "") => JSON.stringify({ model: MODEL, messages: [{ role: "user", content: `soak${extra}` }], max_tokens: 16, stream });
const buyers = Array.from({ length: 8 }, async (_, i) => {
  while (running) {
    try {
      const r = await fetch(`http://127.0.0.1:${port}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${account.api_key}`, "content-type": "application/json" },
        body: body(i % 2 === 0),
        signal: AbortSignal.timeout(20_000),
      });
      await r.text();
      if (r.status === 200) completed++;
      else {
        failed++;
        refusals[r.status] = (refusals[r.status] ?? 0) + 1;
      }
    } catch {
      failed++;
      refusals[0] = (refusals[0] ?? 0) + 1;
    }
  }
});

/** Hostile clients, one of each kind per second. */
const hostile = (async () => {
  while (running) {
    const raw = (text: string, holdMs: number) =>
      new Promise<void>((resolve) => {
        const s = connect(port, "127.0.0.1", () => s.write(text));
        s.on("error", () => {});
        setTimeout(() => {
          s.destroy();
          resolve();
        }, holdMs);
      });
    const auth = `Authorization: Bearer ${account.api_key}\r\nContent-Type: application/json\r\n`;
    await Promise.all([
      raw(`POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\n${auth}Content-Length: 900\r\n\r\n{"model":`, 3000), // body never finishes
      raw(`POST /v1/chat/completions HTTP/1.1\r\nHost: x.y\r\n${auth}Content-Length: 12\r\n\r\n{"model":"x"`, 200), // bad JSON, leaves
      raw(`POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n${auth}Content-Length: ${body(true, "\\ud800").length}\r\n\r\n${body(true, "\\ud800")}`, 200),
      (async () => {
        // A buyer that never reads its stream.
        const s = connect(port, "127.0.0.1");
        s.pause();
        s.on("error", () => {});
        const b = body(true);
        s.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n${auth}Content-Length: ${b.length}\r\n\r\n${b}`);
        await Bun.sleep(2500);
        s.destroy();
      })(),
    ]);
  }
})();

/** Provider churn: one provider killed and restarted every 20 s. */
const churn = (async () => {
  let n = 0;
  while (running) {
    await Bun.sleep(20_000);
    if (!running) break;
    const p = providers[n++ % providers.length]!;
    p.proc.kill("SIGKILL");
    await p.proc.exited;
    p.proc = Bun.spawn(providerArgs(p.id), { stdout: "ignore", stderr: "ignore" });
  }
})();

interface Sample {
  t_s: number;
  rss_mb: number;
  fds: number;
  loop_delay_ms: number;
  completed: number;
  failed: number;
}
const samples: Sample[] = [];
const started = performance.now();
const endAt = started + minutes * 60_000;
while (performance.now() < endAt) {
  await Bun.sleep(10_000);
  const status = readFileSync(`/proc/${gateway.pid}/status`, "utf8");
  const rss = Number(/VmRSS:\s+(\d+)/.exec(status)?.[1] ?? 0) / 1024;
  const fds = readdirSync(`/proc/${gateway.pid}/fd`).length;
  const t0 = performance.now();
  await fetch(`http://127.0.0.1:${port}/healthz`).then((r) => r.text());
  const sample = { t_s: Math.round((performance.now() - started) / 1000), rss_mb: Math.round(rss * 10) / 10, fds, loop_delay_ms: Math.round((performance.now() - t0) * 10) / 10, completed, failed };
  samples.push(sample);
  console.log(JSON.stringify(sample));
}
running = false;
await Promise.all([...buyers, hostile, churn]);
gateway.kill("SIGTERM");
await gateway.exited;
for (const p of providers) p.proc.kill("SIGKILL");

const third = Math.max(1, Math.floor(samples.length / 3));
const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
const warm = samples.slice(third, 2 * third);
const last = samples.slice(-third);
const growth = {
  rss: mean(last.map((s) => s.rss_mb)) / mean(warm.map((s) => s.rss_mb)) - 1,
  fds: mean(last.map((s) => s.fds)) / mean(warm.map((s) => s.fds)) - 1,
};
const audit = Bun.spawnSync(["bun", MAIN, "ledger", "audit", "--data-dir", dataDir]).exitCode;
const ok = growth.rss <= 0.1 && growth.fds <= 0.1 && audit === 0;
console.log(JSON.stringify({ minutes, samples: samples.length, completed, failed, refusals, rss_growth: Math.round(growth.rss * 1000) / 10, fds_growth: Math.round(growth.fds * 1000) / 10, audit_exit: audit, ok }));
rmSync(dataDir, { recursive: true, force: true });
process.exit(ok ? 0 : 1);
