// `serve --demo` starts its demo providers through the same catalog-feed path as `gateway provider`:
// they fetch the signed feed from the gateway, verify it under the operator key they pin on first use,
// persist the highest feed they accepted beside their keys, and advertise only what it lists.
import { expect, test } from "bun:test";
import { readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { collectJsonLines, tempDir, waitFor } from "../support/harness.ts";

const root = join(import.meta.dir, "../..");

test("demo providers fetch, verify and pin the gateway's signed catalog before advertising", async () => {
  const dataDir = tempDir("gw-demo-feed-");
  const proc = Bun.spawn(["bun", "src/main.ts", "serve", "--demo"], {
    cwd: root,
    env: { ...process.env, GATEWAY_PORT: "0", GATEWAY_DATA_DIR: dataDir, GATEWAY_LOG_LEVEL: "debug" },
    stdout: "pipe",
    stderr: "pipe",
  });
  const lines: Record<string, unknown>[] = [];
  collectJsonLines(proc.stdout as ReadableStream<Uint8Array>, lines);
  try {
    let banner = "";
    const decoder = new TextDecoder();
    for await (const bytes of proc.stderr as ReadableStream<Uint8Array>) {
      banner += decoder.decode(bytes, { stream: true });
      if (banner.includes("Dev API key:")) break;
    }
    const base = /ready on (http:\/\/\S+)/.exec(banner)![1]!;
    const accepted = () => lines.filter((l) => l.event === "demo_provider.catalog_accepted");
    await waitFor(() => accepted().length >= 2, 5000, "both demo providers accepting the feed");

    const catalog = (await (await fetch(`${base}/v1/catalog`)).json()) as { catalog_id: string; issued_at: string };
    const operatorKey = (await (await fetch(`${base}/v1/catalog/pubkey`)).text()).trim();
    expect(accepted().map((l) => l.catalog_id)).toEqual([catalog.catalog_id, catalog.catalog_id]);
    const folder = join(dataDir, "demo-providers");
    expect(readFileSync(join(folder, "catalog-operator.pub"), "utf8").trim()).toBe(operatorKey);
    expect(JSON.parse(readFileSync(join(folder, "catalog-highest.json"), "utf8"))).toMatchObject({
      catalog_id: catalog.catalog_id,
      issued_at: catalog.issued_at,
    });
  } finally {
    proc.kill("SIGTERM");
    expect(await proc.exited).toBe(0);
    rmSync(dataDir, { recursive: true, force: true });
  }
}, 20_000);
