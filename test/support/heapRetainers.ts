// Who holds a string: walks this process's heap snapshot (V8 format) from every string that contains
// `marker` and is longer than `minLength` up through its retainers, and returns the first paths it
// finds, root-most first. A diagnostic for memory tests whose expected release is late: it names the
// holder instead of leaving a wait to hide it.

interface Snapshot {
  snapshot: { meta: { node_fields: string[]; edge_fields: string[]; node_types: [string[]]; edge_types: [string[]] } };
  nodes: number[];
  edges: number[];
  strings: string[];
}

export function retainerPaths(marker: string, options: { minLength?: number; depth?: number; paths?: number } = {}): string[] {
  const { minLength = 1000, depth = 12, paths = 6 } = options;
  Bun.gc(true);
  const snap = JSON.parse(Bun.generateHeapSnapshot("v8")) as Snapshot;
  const { node_fields: nf, edge_fields: ef, node_types, edge_types } = snap.snapshot.meta;
  const [N, E] = [nf.length, ef.length];
  const [nName, nType, nEdges] = [nf.indexOf("name"), nf.indexOf("type"), nf.indexOf("edge_count")];
  const [eType, eName, eTo] = [ef.indexOf("type"), ef.indexOf("name_or_index"), ef.indexOf("to_node")];
  const { nodes, edges, strings } = snap;
  const label = (n: number) => `${node_types[0][nodes[n * N + nType]!]}:${String(strings[nodes[n * N + nName]!]).slice(0, 60)}`;
  const holders = new Map<number, Array<[number, string]>>();
  for (let n = 0, e = 0; n < nodes.length / N; n++) {
    for (let k = 0; k < nodes[n * N + nEdges]!; k++, e += E) {
      const kind = edge_types[0][edges[e + eType]!];
      const name = kind === "element" || kind === "hidden" ? `[${edges[e + eName]}]` : strings[edges[e + eName]!];
      const to = edges[e + eTo]! / N;
      const list = holders.get(to) ?? [];
      list.push([n, `-${kind}:${name}->`]);
      holders.set(to, list);
    }
  }
  const found: string[] = [];
  for (let n = 0; n < nodes.length / N; n++) {
    const text = strings[nodes[n * N + nName]!];
    if (typeof text !== "string" || text.length <= minLength || !text.includes(marker)) continue;
    const seen = new Set([n]);
    let frontier: Array<[number, string]> = [[n, label(n)]];
    for (let d = 0; d < depth && frontier.length > 0; d++) {
      const next: Array<[number, string]> = [];
      for (const [m, path] of frontier) {
        for (const [p, edge] of holders.get(m) ?? []) {
          if (seen.has(p)) continue;
          seen.add(p);
          next.push([p, `${label(p)} ${edge} ${path}`]);
        }
      }
      frontier = next.slice(0, 32);
    }
    found.push(...frontier.slice(0, paths).map(([, path]) => path));
  }
  return found;
}
