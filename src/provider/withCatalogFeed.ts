// A provider runtime behind the signed catalog feed (docs/catalog.md): the feed is fetched and verified before
// `hello`, only the models it allows are advertised, and a change is told to the gateway at once. One
// composition for `gateway provider` and the `--demo` providers, so the demo shows the real flow.
import {
  catalogHighestPathFor,
  catalogPinPathFor,
  catalogUrlsFor,
  createCatalogWatcher,
  DEFAULT_CATALOG_REFRESH_MS,
  type CatalogWatcher,
} from "./catalogFeed.ts";
import { startProviderRuntime, type ProviderRuntime, type ProviderRuntimeOptions } from "./runtime.ts";

export interface CatalogFeedOptions {
  /** The provider key file: the trust pin and the highest accepted feed are kept beside it. */
  keyFile: string;
  /** `--catalog-url`; default: the gateway's own `/v1/catalog`. */
  catalogUrl?: string;
  /** `--catalog-pubkey`: trusted as given; otherwise the key first served is pinned (trust on first use). */
  publicKey?: Uint8Array;
  /** `--advertise-uncatalogued` (observe-mode gateways). */
  allowUncatalogued?: boolean;
  refreshMs?: number;
}

export interface CatalogProvider {
  runtime: ProviderRuntime;
  catalog: CatalogWatcher;
  stop(): Promise<void>;
}

/** Checks the feed once, starts the runtime advertising what it allows, then refreshes it periodically. */
export async function startProviderWithCatalogFeed(
  runtimeOptions: Omit<ProviderRuntimeOptions, "advertisedModels">,
  feed: CatalogFeedOptions,
): Promise<CatalogProvider> {
  const catalog = createCatalogWatcher({
    urls: catalogUrlsFor(runtimeOptions.gatewayUrl, feed.catalogUrl),
    models: runtimeOptions.models,
    ...(feed.publicKey !== undefined ? { publicKey: feed.publicKey } : { pinFile: catalogPinPathFor(feed.keyFile) }),
    highestFile: catalogHighestPathFor(feed.keyFile),
    allowUncatalogued: feed.allowUncatalogued === true,
    ...(runtimeOptions.log !== undefined ? { log: runtimeOptions.log } : {}),
  });
  await catalog.refresh(); // before hello: advertise from the start only what the catalog allows
  const runtime = startProviderRuntime({ ...runtimeOptions, advertisedModels: () => catalog.advertised() });
  catalog.onChange(() => runtime.modelsChanged());
  catalog.start(feed.refreshMs ?? DEFAULT_CATALOG_REFRESH_MS);
  return {
    runtime,
    catalog,
    async stop() {
      catalog.stop();
      await runtime.stop();
    },
  };
}
