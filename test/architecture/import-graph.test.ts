// The module layering of docs/architecture.md, checked over the import graph of src/ and actors/:
// a file imports only files of its own layer or of layers listed before it, and no import cycle
// exists (type-only imports included). The layer table below is the one docs/architecture.md shows.
import { describe, expect, test } from "bun:test";
import { readdirSync, readFileSync, statSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";

const ROOT = resolve(import.meta.dir, "../..");

/**
 * Layers from the bottom up. A file belongs to the layer with the longest path prefix that matches
 * it; every file must belong to one.
 */
interface Layer {
  name: string;
  paths: readonly string[];
  /** When set, the only layers this one may import (besides being below it). */
  only?: readonly string[];
}

const LAYERS: readonly Layer[] = [
  { name: "wire", paths: ["src/wire/"] },
  {
    name: "domain",
    paths: [
      "src/chat/",
      "src/config/",
      "src/log.ts",
      "src/ledger/money.ts",
      "src/ledger/charges.ts",
      "src/ledger/rateCard.ts",
      "src/receipts/",
      "src/catalog/schema.ts",
      "src/catalog/feed.ts",
      "src/catalog/keys.ts",
      "src/catalog/state.ts",
      "src/catalog/files.ts",
      "src/catalog/weights.ts",
    ],
  },
  { name: "store", paths: ["src/store/"] },
  // Live state shared between cluster nodes (Redis): leases, slots, replays, registry, transport.
  { name: "cluster", paths: ["src/cluster/"] },
  {
    name: "services",
    paths: ["src/catalog/history.ts", "src/catalog/live.ts", "src/catalog/operations.ts", "src/ledger/audit.ts", "src/ledger/index.ts"],
  },
  { name: "actors", paths: ["actors/"] },
  { name: "gateway", paths: ["src/gateway/", "src/metrics.ts"] },
  { name: "http", paths: ["src/http/", "src/catalog/http.ts"] },
  // A separate program: it shares the wire protocol and the pure rules, nothing of the gateway.
  { name: "provider", paths: ["src/provider/"], only: ["wire", "domain", "provider"] },
  {
    name: "entry",
    paths: [
      "src/main.ts",
      "src/compositionRoot.ts",
      "src/serveCommand.ts",
      "src/inspect.ts",
      "src/inspectRelay.ts",
      "src/build.ts",
      "src/build-macho.ts",
      "src/cli/",
      "src/catalog/cli.ts",
      "src/catalog/index.ts",
      "src/ledger/cli.ts",
      "src/receipts/verifyCli.ts",
      // The operator console reads the live gateway the composition root builds (docs/console.md).
      "src/console/",
    ],
  },
];

type ImportGraph = Map<string, Set<string>>;

// `import … from "x"`, `export … from "x"` (type-only too), `import "x"` and `import("x")`.
const IMPORT = /(?:^|\n)\s*(?:import|export)\s[^;]*?\bfrom\s*["']([^"']+)["']|(?:^|\n)\s*import\s*["']([^"']+)["']|\bimport\(\s*["']([^"']+)["']\s*\)/g;

/** The relative imports of every .ts file under `dirs`, as paths relative to `root`. */
function importGraph(root: string, dirs: readonly string[]): ImportGraph {
  const graph: ImportGraph = new Map();
  const walk = (dir: string): string[] =>
    readdirSync(join(root, dir)).flatMap((name) => {
      const path = join(dir, name);
      return statSync(join(root, path)).isDirectory() ? walk(path) : path.endsWith(".ts") ? [path] : [];
    });
  for (const file of dirs.flatMap(walk)) {
    const targets = new Set<string>();
    for (const match of readFileSync(join(root, file), "utf8").matchAll(IMPORT)) {
      const spec = match[1] ?? match[2] ?? match[3]!;
      if (spec.startsWith(".")) targets.add(relative(root, resolve(root, dirname(file), spec)));
    }
    graph.set(file, targets);
  }
  return graph;
}

/** The index in `layers` of the file's layer, or -1 when no layer claims it. */
function layerOf(file: string, layers: typeof LAYERS): number {
  let best = -1;
  let bestLength = -1;
  layers.forEach((layer, index) => {
    for (const path of layer.paths) {
      if (file.startsWith(path) && path.length > bestLength) {
        best = index;
        bestLength = path.length;
      }
    }
  });
  return best;
}

/** Every import of a file into a layer above its own (or outside its `only`), as "file (layer) → target (layer)". */
function upwardImports(graph: ImportGraph, layers: typeof LAYERS): string[] {
  const found: string[] = [];
  for (const [file, targets] of graph) {
    const from = layerOf(file, layers);
    for (const target of targets) {
      if (!graph.has(target)) continue;
      const to = layerOf(target, layers);
      const only = layers[from]?.only;
      if (to > from || (only && !only.includes(layers[to]?.name ?? ""))) found.push(`${file} (${layers[from]?.name}) → ${target} (${layers[to]?.name})`);
    }
  }
  return found.sort();
}

/** One cycle per strongly connected group of files found by a depth-first walk, as "a → b → a". */
function importCycles(graph: ImportGraph): string[] {
  const state = new Map<string, "open" | "done">();
  const stack: string[] = [];
  const cycles: string[] = [];
  const visit = (file: string) => {
    state.set(file, "open");
    stack.push(file);
    for (const target of graph.get(file) ?? []) {
      if (!graph.has(target)) continue;
      if (state.get(target) === "open") cycles.push([...stack.slice(stack.indexOf(target)), target].join(" → "));
      else if (!state.has(target)) visit(target);
    }
    stack.pop();
    state.set(file, "done");
  };
  for (const file of [...graph.keys()].sort()) if (!state.has(file)) visit(file);
  return cycles;
}

const graph = importGraph(ROOT, ["src", "actors"]);

describe("the import graph of src/ and actors/", () => {
  test("every file belongs to a layer", () => {
    expect([...graph.keys()].filter((file) => layerOf(file, LAYERS) < 0)).toEqual([]);
  });

  test("no file imports a layer above its own", () => {
    expect(upwardImports(graph, LAYERS)).toEqual([]);
  });

  test("no import cycle, type-only imports included", () => {
    expect(importCycles(graph)).toEqual([]);
  });

  test("the layer table is the one docs/architecture.md shows", () => {
    const doc = readFileSync(join(ROOT, "docs/architecture.md"), "utf8");
    const order = LAYERS.map((layer) => layer.name).join(" → ");
    expect(doc).toContain(order);
    for (const layer of LAYERS) for (const path of layer.paths) expect(doc).toContain(`\`${path}\``);
  });
});

describe("the checks themselves", () => {
  const layers = [
    { name: "low", paths: ["low/"] },
    { name: "high", paths: ["high/"] },
  ];
  const graphOf = (edges: Record<string, string[]>): ImportGraph => new Map(Object.entries(edges).map(([file, targets]) => [file, new Set(targets)]));

  test("an import of a higher layer is found", () => {
    const g = graphOf({ "low/a.ts": ["high/b.ts"], "high/b.ts": [] });
    expect(upwardImports(g, layers)).toEqual(["low/a.ts (low) → high/b.ts (high)"]);
  });

  test("an import outside a layer's `only` list is found", () => {
    const restricted = [...layers, { name: "program", paths: ["program/"], only: ["low", "program"] }];
    const g = graphOf({ "program/p.ts": ["low/a.ts", "high/b.ts"], "low/a.ts": [], "high/b.ts": [] });
    expect(upwardImports(g, restricted)).toEqual(["program/p.ts (program) → high/b.ts (high)"]);
  });

  test("an import of a lower layer or of its own is not", () => {
    const g = graphOf({ "high/b.ts": ["low/a.ts", "high/c.ts"], "high/c.ts": [], "low/a.ts": [] });
    expect(upwardImports(g, layers)).toEqual([]);
  });

  test("a cycle is found, however long", () => {
    const g = graphOf({ "low/a.ts": ["low/b.ts"], "low/b.ts": ["low/c.ts"], "low/c.ts": ["low/a.ts"] });
    expect(importCycles(g)).toEqual(["low/a.ts → low/b.ts → low/c.ts → low/a.ts"]);
  });

  test("type-only and re-export lines are edges", () => {
    const text = 'import type { A } from "./a.ts";\nexport { B } from "./b.ts";\nexport type {\n  C,\n} from "./c.ts";\nconst d = await import("./d.ts");\n';
    const specs = [...text.matchAll(IMPORT)].map((m) => m[1] ?? m[2] ?? m[3]);
    expect(specs).toEqual(["./a.ts", "./b.ts", "./c.ts", "./d.ts"]);
  });
});
