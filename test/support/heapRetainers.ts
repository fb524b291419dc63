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
  const edgeLabel = (e: number) => {
    const kind = edge_types[0][edges[e + eType]!];
    return `-${kind}:${kind === "element" || kind === "hidden" ? `[${edges[e + eName]}]` : strings[edges[e + eName]!]}->`;
  };
  // One pass over every edge a level, looking only for edges into the frontier: no reverse index of
  // the whole heap (building one took over a minute on a full suite's heap).
  const found: string[] = [];
  for (let n = 0; n < nodes.length / N; n++) {
    const text = strings[nodes[n * N + nName]!];
    if (typeof text !== "string" || text.length <= minLength || !text.includes(marker)) continue;
    const seen = new Set([n]);
    let frontier = new Map<number, string>([[n * N, label(n)]]);
    for (let d = 0; d < depth && frontier.size > 0; d++) {
      const next = new Map<number, string>();
      for (let from = 0, e = 0; from < nodes.length / N && next.size < 32; from++) {
        for (let k = 0; k < nodes[from * N + nEdges]!; k++, e += E) {
          const path = frontier.get(edges[e + eTo]!);
          if (path === undefined || seen.has(from)) continue;
          seen.add(from);
          next.set(from * N, `${label(from)} ${edgeLabel(e)} ${path}`);
        }
      }
      if (next.size === 0) break; // the roots: keep the paths that reached them
      frontier = next;
    }
    found.push(...[...frontier.values()].slice(0, paths));
  }
  return found;
}
