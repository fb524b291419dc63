// `bun test/bench/session-events.ts`: µs per attempt.started + attempt.finished pair on an admitted provider-session actor.
import { createActor } from "xstate";
import { providerSessionMachine } from "../../actors/providerSession.ts";
const m = providerSessionMachine.provide({ actors: { admitProvider: (await import("xstate")).fromPromise(async () => ({ admitted: true, tier: "pinned" })) as any } });
const a = createActor(m, { input: { sessionId: "s", nonce: new Uint8Array(32), heartbeatIntervalMs: 600000 } as any });
a.start();
a.send({ type: "provider.hello", frame: { type: "hello", protocol: 1, provider_id: "p", receipt_public_key: new Uint8Array(32), runtime: { name: "x", version: "1" }, hardware: { ram_gb: 1 }, max_concurrency: 1024, models: [] } as any });
a.send({ type: "provider.auth", signature: new Uint8Array(64) });
await Bun.sleep(10);
console.log(JSON.stringify(a.getSnapshot().value));
const N = 100000;
for (let i = 0; i < 10000; i++) { a.send({ type: "attempt.started" }); a.send({ type: "attempt.finished" }); }
const t = performance.now();
for (let i = 0; i < N; i++) { a.send({ type: "attempt.started" }); a.send({ type: "attempt.finished" }); }
console.log(((performance.now() - t) / N * 1000).toFixed(2), "µs per started+finished");
process.exit(0);
