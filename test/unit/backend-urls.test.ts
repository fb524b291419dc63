// --database-url and --redis-url: neither is the embedded node, both a cluster node, one alone a
// startup error that names the missing one (`gateway serve` exits 64).
import { expect, test } from "bun:test";
import { loadConfig } from "../../src/config/index.ts";
import { MAIN } from "../support/harness.ts";

const PG = "postgres://gw@127.0.0.1:5432/gw";
const REDIS = "redis://127.0.0.1:6379";

test("neither URL: the embedded node; both: a cluster node", () => {
  const embedded = loadConfig([], {});
  expect(embedded.ok && [embedded.config.databaseUrl, embedded.config.redisUrl]).toEqual([undefined, undefined]);
  const cluster = loadConfig(["--database-url", PG], { GATEWAY_REDIS_URL: REDIS });
  expect(cluster.ok && [cluster.config.databaseUrl, cluster.config.redisUrl]).toEqual([PG, REDIS]);
});

test.each([
  [["--database-url", PG], {}, "--redis-url"],
  [[], { GATEWAY_REDIS_URL: REDIS }, "--database-url"],
  [["--database-url", "mysql://x"], { GATEWAY_REDIS_URL: REDIS }, "postgres://"],
])("one URL alone, or a wrong scheme, is refused and named: %j %j", (argv, env, named) => {
  const loaded = loadConfig(argv as string[], env as Record<string, string>);
  expect(loaded.ok).toBe(false);
  if (!loaded.ok) expect(loaded.message).toContain(named);
});

test("gateway serve with only --database-url exits 64 with the reason", () => {
  const r = Bun.spawnSync(["bun", MAIN, "serve", "--port", "0", "--database-url", PG], { stdout: "pipe", stderr: "pipe", timeout: 60_000 });
  expect(r.exitCode).toBe(64);
  expect(r.stderr.toString()).toContain("a cluster node needs both");
}, 60_000);
