// The Dockerfile builds and runs: the container's gateway answers, serves a chat completion in demo mode
// and keeps its data folder private. deploy/compose.yaml is checked by `docker compose config` where
// the compose plugin exists, and its shape always. Skipped visibly where Docker cannot build here (no
// daemon, or no way to get the base images).
import { afterAll, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import OpenAI from "openai";

const root = join(import.meta.dir, "../..");
const BASE_IMAGES = ["oven/bun:1.4", "debian:bookworm-slim"];

function run(args: string[], timeoutMs = 60_000) {
  const result = Bun.spawnSync(args, { cwd: root, timeout: timeoutMs });
  return { code: result.exitCode, out: result.stdout.toString(), err: result.stderr.toString() };
}

/** Why Docker cannot build the image here, or null when it can. */
function dockerProblem(): string | null {
  if (Bun.which("docker") === null) return "no docker CLI";
  if (run(["docker", "info"], 20_000).code !== 0) return "no Docker daemon answers";
  for (const image of BASE_IMAGES) {
    if (run(["docker", "image", "inspect", image]).code === 0) continue;
    const pulled = run(["docker", "pull", image], 120_000);
    if (pulled.code !== 0) return `base image ${image} is not present and cannot be pulled (${pulled.err.trim().split("\n").at(-1)})`;
  }
  return null;
}

const problem = dockerProblem();
if (problem) console.warn(`SKIPPED: Docker build-and-run test of the Dockerfile — ${problem}`);

const tag = `gateway-test:${process.pid}`;
const containers: string[] = [];
afterAll(() => {
  for (const id of containers) run(["docker", "rm", "-f", id]);
  if (!problem) run(["docker", "rmi", "-f", tag]);
});

test.skipIf(problem !== null)("the image builds, and its gateway serves a chat completion in demo mode", async () => {
  const built = run(["docker", "build", "-t", tag, "."], 15 * 60_000);
  expect({ code: built.code, err: built.code === 0 ? "" : built.err.slice(-3000) }).toEqual({ code: 0, err: "" });

  const started = run(["docker", "run", "-d", "-p", "127.0.0.1::8080", tag, "serve", "--demo"]);
  expect(started.code).toBe(0);
  const id = started.out.trim();
  containers.push(id);
  const port = Number(/:(\d+)\s*$/.exec(run(["docker", "port", id, "8080/tcp"]).out.trim().split("\n")[0]!)![1]);

  // The dev key is in the banner (stderr, which docker logs keeps).
  let key = "";
  const deadline = performance.now() + 60_000;
  while (!key) {
    key = /Dev API key: (\S+)/.exec(run(["docker", "logs", id]).err)?.[1] ?? "";
    if (!key && performance.now() > deadline) throw new Error(`no banner:\n${run(["docker", "logs", id]).err}`);
    if (!key) await Bun.sleep(200);
  }
  const base = `http://127.0.0.1:${port}`;
  expect((await fetch(`${base}/healthz`)).status).toBe(200);
  const client = new OpenAI({ apiKey: key, baseURL: `${base}/v1`, maxRetries: 3 });
  let content = "";
  for (let i = 0; i < 50 && !content; i++) {
    const res = await client.chat.completions.create({ model: "demo-chat", messages: [{ role: "user", content: "Hello!" }], max_tokens: 5 }).catch(() => null);
    content = res?.choices[0]?.message.content ?? "";
    if (!content) await Bun.sleep(100);
  }
  expect(content.length).toBeGreaterThan(0);
  expect(run(["docker", "exec", id, "stat", "-c", "%a %U", "/var/lib/gateway"]).out.trim()).toBe("700 gateway");
  expect(run(["docker", "exec", id, "stat", "-c", "%a", "/var/lib/gateway/gateway.db"]).out.trim()).toBe("600");
  // SIGTERM drains and exits 0.
  expect(run(["docker", "stop", id], 90_000).code).toBe(0);
  expect(run(["docker", "inspect", "-f", "{{.State.ExitCode}}", id]).out.trim()).toBe("0");
}, 20 * 60_000);

test("deploy/compose.yaml: the gateway, and PostgreSQL and Redis behind the cluster profile", () => {
  const compose = Bun.YAML.parse(readFileSync(join(root, "deploy/compose.yaml"), "utf8")) as {
    services: Record<string, { build?: { context: string; dockerfile: string }; profiles?: string[]; environment?: Record<string, string>; volumes?: string[] }>;
  };
  expect(Object.keys(compose.services).sort()).toEqual(["gateway", "postgres", "redis"]);
  const gateway = compose.services.gateway!;
  expect(gateway.build).toEqual({ context: "..", dockerfile: "Dockerfile" });
  expect(gateway.profiles).toBeUndefined();
  expect(Object.keys(gateway.environment!)).toEqual(expect.arrayContaining(["GATEWAY_DATABASE_URL", "GATEWAY_REDIS_URL"]));
  expect(gateway.volumes).toEqual(["gateway-data:/var/lib/gateway"]);
  expect(compose.services.postgres!.profiles).toEqual(["cluster"]);
  expect(compose.services.redis!.profiles).toEqual(["cluster"]);
  // Compose's own check: the plugin (`docker compose`), or the standalone `docker-compose`.
  const compose_ = run(["docker", "compose", "version"]).code === 0 ? ["docker", "compose"] : Bun.which("docker-compose") ? ["docker-compose"] : null;
  if (compose_) {
    const checked = run([...compose_, "-f", "deploy/compose.yaml", "--profile", "cluster", "config", "-q"]);
    expect({ code: checked.code, err: checked.err }).toEqual({ code: 0, err: "" });
  } else {
    console.warn("SKIPPED: `docker compose config` of deploy/compose.yaml — neither the docker compose plugin nor docker-compose is installed here");
  }
});
