// Attributes the memory of live streams from two V8-format heap snapshots of the gateway (written by
// `MEM_HEAP=1 MEM_SNAPSHOT=DIR bun test/bench/memory.ts`): idle, and with N streams live.
//
//   bun test/bench/heapDiff.ts DIR/idle-512.heapsnapshot DIR/live-512.heapsnapshot 512 [min_bytes_per_stream]
//
// Prints (1) the self size and count per node class that grew, per stream, and (2) the live
// snapshot's dominator tree with siblings of one class merged (Chrome's "retainers" the other way
// round): each line is a group of objects, how many per stream, and what they retain per stream, so a
// stream's bytes can be followed down from the object that owns them. Bytes are JSC's self sizes; a
// Map's or a hash's out-of-line storage is not in them (the heap's `extraMemorySize` is).
import { readFileSync } from "node:fs";

interface Snapshot {
  snapshot: { meta: { node_fields: string[]; node_types: [string[]]; edge_fields: string[]; edge_types: [string[]] } };
  nodes: number[];
  edges: number[];
  strings: string[];
}

class Graph {
  readonly n: number;
  readonly type: Uint8Array;
  readonly name: Int32Array;
  readonly size: Float64Array;
  readonly firstEdge: Int32Array;
  readonly edgeTo: Int32Array;
  readonly edgeType: Uint8Array;
  readonly edgeName: Int32Array;
  readonly strings: string[];
  readonly types: string[];
  readonly edgeTypes: string[];

  constructor(s: Snapshot) {
    const nf = s.snapshot.meta.node_fields.length;
    const ef = s.snapshot.meta.edge_fields.length;
    this.n = s.nodes.length / nf;
    this.types = s.snapshot.meta.node_types[0];
    this.edgeTypes = s.snapshot.meta.edge_types[0];
    this.strings = s.strings;
    this.type = new Uint8Array(this.n);
    this.name = new Int32Array(this.n);
    this.size = new Float64Array(this.n);
    this.firstEdge = new Int32Array(this.n + 1);
    let e = 0;
    for (let i = 0; i < this.n; i++) {
      this.type[i] = s.nodes[i * nf]!;
      this.name[i] = s.nodes[i * nf + 1]!;
      this.size[i] = s.nodes[i * nf + 3]!;
      this.firstEdge[i] = e;
      e += s.nodes[i * nf + 4]!;
    }
    this.firstEdge[this.n] = e;
    this.edgeTo = new Int32Array(e);
    this.edgeType = new Uint8Array(e);
    this.edgeName = new Int32Array(e);
    for (let k = 0; k < e; k++) {
      this.edgeType[k] = s.edges[k * ef]!;
      this.edgeName[k] = s.edges[k * ef + 1]!;
      this.edgeTo[k] = s.edges[k * ef + 2]! / nf;
    }
  }

  cls(i: number): string {
    const t = this.types[this.type[i]!]!;
    if (t === "string" || t === "concatenated string" || t === "sliced string") return t;
    return `${t}:${this.strings[this.name[i]!]}`;
  }

  edgeLabel(k: number): string {
    const t = this.edgeTypes[this.edgeType[k]!]!;
    if (t === "element" || t === "hidden") return `[${t === "hidden" ? "h" : ""}]`;
    return this.strings[this.edgeName[k]!] ?? "?";
  }

  weak(k: number): boolean {
    return this.edgeTypes[this.edgeType[k]!] === "weak";
  }

  /** Immediate dominators from node 0 (Cooper, Harvey & Kennedy), and retained sizes. */
  dominators(): { idom: Int32Array; retained: Float64Array } {
    const n = this.n;
    const order = new Int32Array(n).fill(-1); // postorder number
    const post: number[] = [];
    const stack: number[] = [0];
    const next = new Int32Array(n);
    const seen = new Uint8Array(n);
    seen[0] = 1;
    for (let i = 0; i < n; i++) next[i] = this.firstEdge[i]!;
    while (stack.length) {
      const v = stack[stack.length - 1]!;
      if (next[v]! < this.firstEdge[v + 1]!) {
        const k = next[v]!++;
        if (this.weak(k)) continue;
        const w = this.edgeTo[k]!;
        if (!seen[w]) {
          seen[w] = 1;
          stack.push(w);
        }
      } else {
        order[v] = post.length;
        post.push(v);
        stack.pop();
      }
    }
    const preds: number[][] = Array.from({ length: n }, () => []);
    for (let v = 0; v < n; v++) {
      if (!seen[v]) continue;
      for (let k = this.firstEdge[v]!; k < this.firstEdge[v + 1]!; k++) if (!this.weak(k)) preds[this.edgeTo[k]!]!.push(v);
    }
    const idom = new Int32Array(n).fill(-1);
    idom[0] = 0;
    const intersect = (a: number, b: number) => {
      while (a !== b) {
        while (order[a]! < order[b]!) a = idom[a]!;
        while (order[b]! < order[a]!) b = idom[b]!;
      }
      return a;
    };
    for (let changed = true; changed; ) {
      changed = false;
      for (let p = post.length - 1; p >= 0; p--) {
        const v = post[p]!;
        if (v === 0) continue;
        let d = -1;
        for (const u of preds[v]!) if (idom[u] !== -1) d = d === -1 ? u : intersect(u, d);
        if (d !== idom[v]) {
          idom[v] = d;
          changed = true;
        }
      }
    }
    const retained = new Float64Array(n);
    for (const v of post) {
      retained[v]! += this.size[v]!;
      if (v !== 0 && idom[v] !== -1) retained[idom[v]!]! += retained[v]!;
    }
    return { idom, retained };
  }
}

const [idleFile, liveFile, nArg, minArg] = process.argv.slice(2);
if (!idleFile || !liveFile || !nArg) {
  console.error("usage: bun test/bench/heapDiff.ts IDLE.heapsnapshot LIVE.heapsnapshot N [min_bytes_per_stream]");
  process.exit(64);
}
const N = Number(nArg);
const MIN = Number(minArg ?? 64) * N;
const load = (f: string) => new Graph(JSON.parse(readFileSync(f, "utf8")) as Snapshot);
const idle = load(idleFile);
const live = load(liveFile);

const byClass = (g: Graph) => {
  const m = new Map<string, { count: number; bytes: number }>();
  for (let i = 0; i < g.n; i++) {
    const k = g.cls(i);
    const v = m.get(k) ?? { count: 0, bytes: 0 };
    v.count++;
    v.bytes += g.size[i]!;
    m.set(k, v);
  }
  return m;
};
const a = byClass(idle);
const b = byClass(live);
const rows: [string, number, number][] = [];
let total = 0;
for (const [k, v] of b) {
  const was = a.get(k) ?? { count: 0, bytes: 0 };
  total += v.bytes - was.bytes;
  rows.push([k, (v.count - was.count) / N, (v.bytes - was.bytes) / N]);
}
for (const [k, v] of a) if (!b.has(k)) rows.push([k, -v.count / N, -v.bytes / N]);
rows.sort((x, y) => y[2] - x[2]);
console.log(`self size per stream: ${(total / N).toFixed(0)} B (${(total / N / 1024).toFixed(1)} KB)\n`);
console.log("class | count/stream | bytes/stream");
for (const [k, c, bytes] of rows.slice(0, 40)) console.log(`${k.slice(0, 70)} | ${c.toFixed(1)} | ${bytes.toFixed(0)}`);

// The dominator tree with same-class siblings merged.
const { idom, retained } = live.dominators();
const children: number[][] = Array.from({ length: live.n }, () => []);
for (let v = 1; v < live.n; v++) if (idom[v]! >= 0) children[idom[v]!]!.push(v);
const label = (v: number) => {
  const d = idom[v]!;
  for (let k = live.firstEdge[d]!; k < live.firstEdge[d + 1]!; k++) if (live.edgeTo[k] === v) return `${live.edgeLabel(k)} → ${live.cls(v)}`;
  return `~ → ${live.cls(v)}`;
};
console.log(`\ndominator tree (groups retaining ≥ ${MIN / N} B per stream); per stream: count, retained bytes`);
const walk = (group: number[], depth: number) => {
  const groups = new Map<string, number[]>();
  for (const v of group) for (const c of children[v]!) {
    const k = label(c);
    const list = groups.get(k) ?? [];
    list.push(c);
    groups.set(k, list);
  }
  const sorted = [...groups].map(([k, vs]) => [k, vs, vs.reduce((s, v) => s + retained[v]!, 0)] as const).sort((x, y) => y[2] - x[2]);
  for (const [k, vs, r] of sorted) {
    if (r < MIN) break;
    console.log(`${"  ".repeat(depth)}${k.slice(0, 90)}  ×${(vs.length / N).toFixed(2)}  ${(r / N).toFixed(0)} B`);
    if (depth < 30) walk(vs, depth + 1);
  }
};
walk([0], 0);
