// `gateway provider --gateway wss://…`: the runtime speaks the protocol over TLS. The fake gateway
// serves a self-signed certificate made with openssl for this test; the provider process trusts it via
// NODE_EXTRA_CA_CERTS (how an operator adds a private CA, docs/provider-machines.md).
import { afterAll, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { MAIN, modelHash } from "../support/harness.ts";
import { startFakeGateway, withTimeout } from "./fake-gateway.ts";

const dir = mkdtempSync(join(tmpdir(), "provider-wss-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const openssl = Bun.which("openssl");
let tls: { cert: string; key: string } | null = null;
if (openssl) {
  const made = Bun.spawnSync([
    openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
    "-keyout", join(dir, "key.pem"), "-out", join(dir, "cert.pem"), "-days", "1",
    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
  ], { stdout: "ignore", stderr: "pipe" });
  if (made.exitCode === 0) tls = { cert: readFileSync(join(dir, "cert.pem"), "utf8"), key: readFileSync(join(dir, "key.pem"), "utf8") };
}
if (!tls) console.warn("skipping the wss:// tests: openssl is needed to make a self-signed certificate");

function spawnProvider(url: string, env: Record<string, string>) {
  const args = ["bun", MAIN, "provider", "--gateway", url, "--id", "prov-wss", "--key-file", join(dir, "provider.key"),
    "--engine", "synthetic", "--model", `m=${modelHash("m")}`, "--backoff-min-ms", "20", "--backoff-max-ms", "50"];
  const clean = Object.fromEntries(Object.entries(process.env).filter(([k]) => k !== "NODE_EXTRA_CA_CERTS"));
  return Bun.spawn(args, { env: { ...clean, ...env }, stdout: "pipe", stderr: "pipe" });
}

test.skipIf(!tls)("a provider connects, authenticates and sends heartbeats over wss://", async () => {
  const gateway = startFakeGateway({ heartbeatIntervalMs: 50, tls: tls! });
  expect(gateway.url).toStartWith("wss://");
  const proc = spawnProvider(gateway.url, { NODE_EXTRA_CA_CERTS: join(dir, "cert.pem") });
  try {
    const session = await gateway.session(0, 5000);
    await withTimeout(session.welcomed, 5000, "welcome");
    expect(session.authOk).toBe(true);
    expect(session.hello).toMatchObject({ provider_id: "prov-wss" });
    expect(await session.take((f) => f.type === "heartbeat", 2000)).toMatchObject({ type: "heartbeat", state: "ready" });
    proc.kill("SIGTERM");
    expect(await proc.exited).toBe(0);
    expect(await session.closed).toEqual({ code: 1000, reason: "provider stopping" });
  } finally {
    proc.kill("SIGKILL");
    await gateway.stop();
  }
});

test.skipIf(!tls)("an untrusted certificate is refused: no session, the runtime keeps retrying", async () => {
  const gateway = startFakeGateway({ tls: tls! });
  const proc = spawnProvider(gateway.url, {});
  try {
    let out = "";
    const decoder = new TextDecoder();
    const reader = (proc.stdout as ReadableStream<Uint8Array>).getReader();
    await withTimeout((async () => {
      while ((out.match(/"event":"reconnect_scheduled"/g) ?? []).length < 2) {
        // A stream that ended must end the loop: a read after the end resolves at once, forever.
        const { value, done } = await reader.read();
        if (done) throw new Error(`the provider exited before two reconnects: ${out}`);
        out += decoder.decode(value, { stream: true });
      }
    })(), 5000, "two reconnects");
    expect(gateway.sessions.every((s) => s.hello === null)).toBe(true);
    expect(proc.exitCode).toBeNull();
  } finally {
    proc.kill("SIGKILL");
    await proc.exited;
    await gateway.stop();
  }
});
