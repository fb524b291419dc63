// The provider's catalog check (docs/catalog.md): the signed feed is fetched from the gateway, verified
// under a pinned operator key (trust on first use, or --catalog-pubkey), refused when older than the
// one in force or signed by another key, and only matching catalog models are advertised — a retired
// model stops being advertised at the next refresh.
import { afterAll, afterEach, describe, expect, test } from "bun:test";
import { mkdtemp, readFile, rm, stat } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { CATALOG_HIGHEST_FILE, catalogUrlsFor, createCatalogWatcher, type CatalogWatcherOptions } from "../../src/provider/catalogFeed.ts";
import { loadOrCreateProviderKey } from "../../src/provider/keys.ts";
import { startProviderRuntime } from "../../src/provider/runtime.ts";
import { createSyntheticEngine } from "../../src/provider/synthetic.ts";
import type { HeartbeatFrame, ModelEntry, ProviderFrame } from "../../src/wire/frames.ts";
import { makeJob, startFakeGateway, withTimeout, type FakeGateway } from "./fake-gateway.ts";
import { catalogModel, newOperatorKey, startCatalogFeed, type CatalogFeedStub } from "./trust-support.ts";

const A = "aa".repeat(32);
const B = "bb".repeat(32);
const C = "cc".repeat(32);
const models: ModelEntry[] = [
  { model_id: "alpha", model_hash: A, max_context_tokens: 4096 },
  { model_id: "beta", model_hash: B, max_context_tokens: 4096 },
  { model_id: "gamma", model_hash: C, max_context_tokens: 4096 },
];
const dir = await mkdtemp(join(tmpdir(), "provider-catalog-"));
afterAll(() => rm(dir, { recursive: true, force: true }));

let cleanups: Array<() => unknown> = [];
afterEach(async () => {
  for (const cleanup of cleanups.reverse()) await cleanup();
  cleanups = [];
});

let dirs = 0;
function setup(overrides: Partial<CatalogWatcherOptions> = {}, stub: CatalogFeedStub = startCatalogFeed()) {
  const gateway = startFakeGateway({ http: (request) => stub.handle(request) });
  const pinFile = join(dir, `pin-${dirs++}`, "catalog-operator.pub");
  const logs: Array<{ event: string } & Record<string, unknown>> = [];
  const watcher = createCatalogWatcher({
    urls: catalogUrlsFor(gateway.url),
    models,
    pinFile,
    log: (event, fields) => logs.push({ event, ...fields }),
    ...overrides,
  });
  cleanups.push(() => watcher.stop(), () => gateway.stop());
  return { stub, gateway, watcher, pinFile, logs };
}

const ids = (list: readonly ModelEntry[]) => list.map((m) => m.model_id);

describe("catalog URLs", () => {
  test.each([
    ["ws://127.0.0.1:8080/v1/provider/connect", undefined, "http://127.0.0.1:8080/v1/catalog"],
    ["wss://gw.example:443/v1/provider/connect", undefined, "https://gw.example/v1/catalog"],
    ["ws://[::1]:9/v1/provider/connect?x=1", undefined, "http://[::1]:9/v1/catalog"],
    ["wss://gw.example/v1/provider/connect", "https://cdn.example/feeds/v1/catalog", "https://cdn.example/feeds/v1/catalog"],
  ])("%s (override %s) → %s", (gateway, override, feed) => {
    expect(catalogUrlsFor(gateway, override)).toEqual({ feed, signature: `${feed}.sig`, pubkey: `${feed}/pubkey` });
  });
});

describe("catalog watcher", () => {
  test("first use: the served key is pinned (0600) once a feed verifies; only listed models with the same hash are advertised", async () => {
    const { stub, watcher, pinFile, logs } = setup();
    stub.publish([catalogModel("alpha", A), catalogModel("beta", "99".repeat(32))]);
    expect(await watcher.refresh()).toBe("accepted");
    expect(watcher.status).toBe("verified");
    expect(ids(watcher.advertised())).toEqual(["alpha"]);
    expect((await readFile(pinFile, "utf8")).trim()).toBe(stub.publicKeyBase64);
    expect((await stat(pinFile)).mode & 0o777).toBe(0o600);
    const why = logs.filter((l) => l.event === "model_not_advertised").map((l) => [l.model_id, l.why]);
    expect(why).toEqual([["beta", "hash_mismatch"], ["gamma", "not_in_catalog"]]);
    expect(logs.find((l) => l.why === "hash_mismatch")).toMatchObject({ local_hash: B, catalog_hash: "99".repeat(32) });

    // Unchanged feed: nothing new is logged (the reasons are said once).
    expect(await watcher.refresh()).toBe("unchanged");
    expect(logs.filter((l) => l.event === "model_not_advertised")).toHaveLength(2);
  });

  test("a retired model stops being advertised at the next refresh", async () => {
    const { stub, watcher } = setup();
    stub.publish([catalogModel("alpha", A), catalogModel("beta", B)]);
    await watcher.refresh();
    const changes: string[][] = [];
    watcher.onChange(() => changes.push(ids(watcher.advertised())));
    stub.publish([catalogModel("beta", B)]);
    expect(ids(watcher.advertised())).toEqual(["alpha", "beta"]); // until the refresh
    expect(await watcher.refresh()).toBe("accepted");
    expect(changes).toEqual([["beta"]]);
  });

  test("a feed older than the one in force is refused (rollback)", async () => {
    const { stub, watcher, logs } = setup();
    const old = stub.publish([catalogModel("alpha", A), catalogModel("beta", B)]);
    await watcher.refresh();
    stub.publish([catalogModel("beta", B)]);
    await watcher.refresh();
    const inForce = watcher.state!.catalog_id;
    stub.serve(old); // validly signed, but it would bring the retired model back
    expect(await watcher.refresh()).toBe("rollback");
    expect(await watcher.refresh()).toBe("rollback");
    expect(watcher.state!.catalog_id).toBe(inForce);
    expect(ids(watcher.advertised())).toEqual(["beta"]);
    expect(logs.filter((l) => l.event === "catalog_rollback_refused")).toHaveLength(1);
  });

  test("after a restart an older feed is still refused: the highest accepted feed is persisted beside the key", async () => {
    const first = setup();
    const highestFile = join(first.pinFile, "..", CATALOG_HIGHEST_FILE);
    const stopped = createCatalogWatcher({ urls: catalogUrlsFor(first.gateway.url), models, pinFile: first.pinFile, highestFile });
    const old = first.stub.publish([catalogModel("alpha", A), catalogModel("beta", B)]);
    expect(await stopped.refresh()).toBe("accepted");
    const newer = first.stub.publish([catalogModel("beta", B)]);
    expect(await stopped.refresh()).toBe("accepted");
    const inForce = stopped.state!;
    expect(JSON.parse(await readFile(highestFile, "utf8"))).toMatchObject({ catalog_id: inForce.catalog_id, body_digest: inForce.body_digest });
    expect((await stat(highestFile)).mode & 0o777).toBe(0o600);

    // A new process (nothing in memory) is offered the old, validly signed feed.
    first.stub.serve(old);
    const logs: Array<{ event: string } & Record<string, unknown>> = [];
    const restarted = createCatalogWatcher({
      urls: catalogUrlsFor(first.gateway.url),
      models,
      pinFile: first.pinFile,
      highestFile,
      log: (event, fields) => logs.push({ event, ...fields }),
    });
    cleanups.push(() => restarted.stop());
    expect(await restarted.refresh()).toBe("rollback");
    expect(restarted.state).toBeNull();
    expect(restarted.status).toBe("refused");
    expect(ids(restarted.advertised())).toEqual([]); // never the retired "alpha"
    expect(logs.find((l) => l.event === "catalog_rollback_refused")).toMatchObject({
      highest_accepted_catalog_id: inForce.catalog_id,
      highest_accepted_issued_at: inForce.body.issued_at,
      highest_from: highestFile,
    });
    // The feed it had accepted before the restart is accepted again, and so is a newer one.
    first.stub.serve(newer);
    expect(await restarted.refresh()).toBe("accepted");
    expect(ids(restarted.advertised())).toEqual(["beta"]);
    first.stub.publish([catalogModel("beta", B), catalogModel("gamma", C)]);
    expect(await restarted.refresh()).toBe("accepted");
    expect(JSON.parse(await readFile(highestFile, "utf8")).catalog_id).toBe(restarted.state!.catalog_id);
  });

  test("a feed under another key than the pinned one is refused with a clear log line; the pin stays", async () => {
    const first = setup();
    first.stub.publish([catalogModel("alpha", A)]);
    await first.watcher.refresh();

    // The same pin file, a gateway whose operator key changed.
    const impostor = startCatalogFeed();
    impostor.publish([catalogModel("alpha", A), catalogModel("beta", B)]);
    const second = setup({ pinFile: first.pinFile }, impostor);
    expect(await second.watcher.refresh()).toBe("key_mismatch");
    expect(second.watcher.status).toBe("refused");
    expect(second.watcher.advertised()).toEqual([]); // no feed in force and the only one offered is refused
    expect(second.logs.find((l) => l.event === "catalog_key_mismatch")).toMatchObject({
      trusted_key: first.stub.publicKeyBase64,
      served_key: impostor.publicKeyBase64,
    });
    expect((await readFile(first.pinFile, "utf8")).trim()).toBe(first.stub.publicKeyBase64);

    // With a feed in force, a refused one changes nothing.
    first.stub.publish([catalogModel("alpha", A)], { signer: newOperatorKey().privateKey });
    expect(await first.watcher.refresh()).toBe("invalid");
    expect(ids(first.watcher.advertised())).toEqual(["alpha"]);
  });

  test("--catalog-pubkey: used as given, never fetched from the gateway or pinned", async () => {
    const stub = startCatalogFeed();
    const { watcher, pinFile } = setup({ publicKey: stub.publicKeyRaw }, stub);
    stub.servePublicKey(newOperatorKey().raw); // what the gateway says does not matter
    stub.publish([catalogModel("gamma", C)]);
    expect(await watcher.refresh()).toBe("accepted");
    expect(ids(watcher.advertised())).toEqual(["gamma"]);
    expect(stub.requests.filter((p) => p === "/v1/catalog/pubkey")).toHaveLength(0);
    expect(await Bun.file(pinFile).exists()).toBe(false);

    const other = startCatalogFeed();
    other.publish([catalogModel("alpha", A)]);
    const wrong = setup({ publicKey: stub.publicKeyRaw }, other);
    expect(await wrong.watcher.refresh()).toBe("key_mismatch"); // the gateway serves another key than the flag's
    expect(wrong.watcher.advertised()).toEqual([]);
  });

  test("a tampered body does not verify", async () => {
    const stub = startCatalogFeed();
    const { watcher } = setup({}, stub);
    const feed = stub.publish([catalogModel("alpha", A)]);
    const text = new TextDecoder().decode(feed.bytes).replace(A, B);
    stub.serve({ bytes: new TextEncoder().encode(text), signature: feed.signature });
    expect(await watcher.refresh()).toBe("invalid");
  });

  test("no catalog (404) or no answer: the configured models are advertised, with a warning", async () => {
    const { stub, watcher, logs } = setup();
    stub.unpublish();
    expect(await watcher.refresh()).toBe("missing");
    expect(ids(watcher.advertised())).toEqual(["alpha", "beta", "gamma"]);
    expect(logs.find((l) => l.event === "catalog_missing")).toBeDefined();

    const down = createCatalogWatcher({ urls: catalogUrlsFor("ws://127.0.0.1:1/v1/provider/connect"), models, fetchTimeoutMs: 500 });
    expect(await down.refresh()).toBe("unreachable");
    expect(ids(down.advertised())).toEqual(["alpha", "beta", "gamma"]);
  });

  test("--advertise-uncatalogued keeps models no feed listed, but never a retired or mismatched one", async () => {
    const { stub, watcher } = setup({ allowUncatalogued: true });
    stub.publish([catalogModel("alpha", A), catalogModel("beta", "99".repeat(32))]);
    await watcher.refresh();
    expect(ids(watcher.advertised())).toEqual(["alpha", "gamma"]);
    stub.publish([catalogModel("beta", "99".repeat(32))]);
    await watcher.refresh();
    expect(ids(watcher.advertised())).toEqual(["gamma"]);
  });

  test("a pin file that is not a key is reported and replaced by nothing (first use again)", async () => {
    const { stub, watcher, pinFile, logs } = setup();
    await rm(join(pinFile, ".."), { recursive: true, force: true });
    await Bun.write(pinFile, "not a key\n");
    stub.publish([catalogModel("alpha", A)]);
    expect(await watcher.refresh()).toBe("accepted");
    expect(logs.map((l) => l.event)).toContain("catalog_pin_unreadable");
    // The bad file is not overwritten ("wx"): the owner sees and fixes it.
    expect(await readFile(pinFile, "utf8")).toBe("not a key\n");
  });
});

describe("runtime with the catalog", () => {
  async function runtimeWith(stub: CatalogFeedStub) {
    const gateway: FakeGateway = startFakeGateway({ heartbeatIntervalMs: 10_000, http: (r) => stub.handle(r) });
    const watcher = createCatalogWatcher({ urls: catalogUrlsFor(gateway.url), models, publicKey: stub.publicKeyRaw });
    await watcher.refresh();
    const keyDir = await mkdtemp(join(dir, "key-"));
    const runtime = startProviderRuntime({
      gatewayUrl: gateway.url,
      providerId: "prov-catalog",
      key: await loadOrCreateProviderKey(join(keyDir, "p.pem")),
      engine: createSyntheticEngine({ tokensPerSecond: 0 }),
      models,
      advertisedModels: () => watcher.advertised(),
      backoff: { minMs: 5, maxMs: 20 },
    });
    watcher.onChange(() => runtime.modelsChanged());
    cleanups.push(() => gateway.stop(), () => runtime.stop());
    const session = await gateway.session(0);
    await session.welcomed;
    return { gateway, watcher, runtime, session };
  }

  test("hello lists only catalog models; after a retirement the next heartbeat drops it and its jobs are declined", async () => {
    const stub = startCatalogFeed();
    stub.publish([catalogModel("alpha", A), catalogModel("beta", B)]);
    const { watcher, session } = await runtimeWith(stub);
    expect(ids(session.hello!.models)).toEqual(["alpha", "beta"]);

    stub.publish([catalogModel("beta", B)]);
    await watcher.refresh();
    const beat = await session.take<HeartbeatFrame>((f: ProviderFrame) => f.type === "heartbeat");
    expect(ids(beat.models)).toEqual(["beta"]);
    session.send(makeJob({ request_id: "req-retired", model_id: "alpha" }));
    expect(await session.take((f) => f.type === "declined")).toMatchObject({ request_id: "req-retired", code: "model_not_loaded" });
  });

  test("the CLI fetches at start, pins beside the key file and refreshes every --catalog-refresh-ms", async () => {
    const stub = startCatalogFeed();
    stub.publish([catalogModel("alpha", A), catalogModel("beta", B)]);
    const gateway = startFakeGateway({ heartbeatIntervalMs: 60_000, http: (r) => stub.handle(r) });
    cleanups.push(() => gateway.stop());
    const keyDir = await mkdtemp(join(dir, "cli-"));
    const { runProviderCommand } = await import("../../src/provider/cli.ts");
    let finish!: () => void;
    const out: string[] = [];
    const exit = runProviderCommand(
      ["--gateway", gateway.url, "--id", "prov-cli-catalog", "--key-file", join(keyDir, "provider.pem"), "--engine", "synthetic",
        "--model", `alpha=${A}`, "--model", `beta=${B}`, "--model", `gamma=${C}`, "--catalog-refresh-ms", "30"],
      { stdout: (l) => out.push(l), stderr: () => {}, until: new Promise<void>((r) => (finish = r)) },
    );
    try {
      const session = await gateway.session(0);
      await session.welcomed;
      expect(ids(session.hello!.models)).toEqual(["alpha", "beta"]);
      expect((await readFile(join(keyDir, "catalog-operator.pub"), "utf8")).trim()).toBe(stub.publicKeyBase64);
      stub.publish([catalogModel("alpha", A)]);
      const beat = await session.take<HeartbeatFrame>((f) => f.type === "heartbeat", 2000);
      expect(ids(beat.models)).toEqual(["alpha"]);
    } finally {
      finish();
    }
    expect(await withTimeout(exit, 3000, "exit")).toBe(0);
    const events = out.map((l) => JSON.parse(l) as { event: string; model_id?: string; why?: string });
    expect(events.find((e) => e.event === "model_not_advertised")).toMatchObject({ model_id: "gamma", why: "not_in_catalog" });
    expect(events.filter((e) => e.event === "catalog_accepted")).toHaveLength(2);
  });
});
