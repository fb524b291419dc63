// `bun test/bench/profile-split.ts FILE.cpuprofile`: where a process's CPU samples go, by owner — each
// sample is counted once, under the first rule (below) that matches a frame of its stack, leaf first.
// Counts samples, not the profiler's time column (which over-weights samples after idle gaps).
import { readFileSync } from "node:fs";

interface Node {
  id: number;
  callFrame: { functionName: string; url: string };
  children?: number[];
}
const profile = JSON.parse(readFileSync(process.argv[2]!, "utf8")) as { nodes: Node[]; samples: number[] };
const parent = new Map<number, number>();
const byId = new Map<number, Node>();
for (const n of profile.nodes) {
  byId.set(n.id, n);
  for (const c of n.children ?? []) parent.set(c, n.id);
}

// Leaf-first: the innermost frame that names an owner wins.
const rules: [string, (f: Node["callFrame"]) => boolean][] = [
  ["sqlite", (f) => f.url.includes("bun:sqlite")],
  ["xstate", (f) => f.url.includes("/xstate/")],
  ["msgpackr", (f) => f.url.includes("/msgpackr/")],
  ["typebox", (f) => f.url.includes("/typebox/")],
  ["elysia", (f) => f.url.includes("/elysia/")],
  ["prom-client", (f) => f.url.includes("/prom-client/")],
  ["receipts", (f) => f.url.includes("/src/receipts/")],
  ["store", (f) => f.url.includes("/src/store/")],
  ["settlements", (f) => f.url.includes("/src/gateway/settlements")],
  ["ledger", (f) => f.url.includes("/src/ledger/")],
  ["wire", (f) => f.url.includes("/src/wire/")],
  ["gateway", (f) => f.url.includes("/src/gateway/") || f.url.includes("/actors/")],
  ["http", (f) => f.url.includes("/src/http/")],
  ["provider", (f) => f.url.includes("/src/provider/")],
  ["log/metrics", (f) => f.url.includes("/src/log") || f.url.includes("/src/metrics")],
  ["other src", (f) => f.url.includes("/src/")],
];
const counts = new Map<string, number>();
let total = 0;
for (const sample of profile.samples) {
  const leaf = byId.get(sample)!;
  if (leaf.callFrame.functionName === "(idle)" || leaf.callFrame.functionName === "(program)") continue;
  total++;
  let owner = "native/runtime (no JS owner)";
  let first = true;
  for (let id: number | undefined = sample; id !== undefined; id = parent.get(id)) {
    const f = byId.get(id)!.callFrame;
    const hit = rules.find(([, match]) => match(f));
    if (hit) {
      owner = first ? hit[0] : `${hit[0]}`;
      break;
    }
    first = false;
  }
  counts.set(owner, (counts.get(owner) ?? 0) + 1);
}
for (const [owner, n] of [...counts].sort((a, b) => b[1] - a[1])) console.log(`${owner.padEnd(30)} ${((100 * n) / total).toFixed(1).padStart(5)} %  (${n})`);
console.log(`${"samples".padEnd(30)} ${total}`);
