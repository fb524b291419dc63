// The four actor machines as diagrams: each statechart's definition (actors/*.ts) turned into a graph of
// states and transitions for ELK (elkjs, layered), which lays it out in the console's page — nothing is
// placed by hand.
import type { AnyStateMachine } from "xstate";
import { gatewayMachine } from "../../actors/gateway.ts";
import { providerSessionMachine } from "../../actors/providerSession.ts";
import { requestMachine } from "../../actors/request.ts";
import { settlementMachine } from "../../actors/settlement.ts";

export const MACHINES = {
  gateway: gatewayMachine,
  providerSession: providerSessionMachine,
  request: requestMachine,
  settlement: settlementMachine,
} as const satisfies Record<string, AnyStateMachine>;
export type MachineName = keyof typeof MACHINES;

type StateNode = AnyStateMachine["root"];

export interface ChartNode {
  /** The state's id (`request.awaitingFirstByte`); the pseudo-nodes end in `#initial` / `#any`. */
  id: string;
  label: string;
  kind: "atomic" | "compound" | "final" | "transient" | "initial" | "any";
  /** Lines shown inside the node: entry actions, invoked children, exit actions, targetless transitions. */
  notes: string[];
}

const CHAR_W = 7;
const LINE_H = 14;
const NOTE_H = 12;

/** `xstate.after.firstByteTimeout.request.awaitingFirstByte` → `after firstByteTimeout`. */
function eventLabel(eventType: string): string {
  const after = /^xstate\.after\.([^.]+)\./.exec(eventType);
  if (after) return `after ${after[1]}`;
  const done = /^xstate\.done\.actor\.(.+)$/.exec(eventType);
  if (done) return `done ${done[1]}`;
  const error = /^xstate\.error\.actor\.(.+)$/.exec(eventType);
  if (error) return `error ${error[1]}`;
  return eventType === "" ? "always" : eventType;
}

function guardName(guard: unknown): string | null {
  if (!guard) return null;
  if (typeof guard === "string") return guard;
  if (typeof guard === "object" && "type" in (guard as object)) return String((guard as { type: unknown }).type);
  return "guard";
}

function actionNames(actions: readonly unknown[] | undefined): string[] {
  return (actions ?? [])
    .map((a) => (typeof a === "string" ? a : typeof a === "object" && a && "type" in a ? String((a as { type: unknown }).type) : null))
    .filter((a): a is string => a !== null && !a.startsWith("xstate."));
}

interface Graph {
  nodes: Map<string, ChartNode & { parent: string | null }>;
  edges: { id: string; source: string; target: string; label: string }[];
}

/** The machine's states and transitions as a graph (pure). */
export function graphOf(machine: AnyStateMachine): Graph {
  const nodes: Graph["nodes"] = new Map();
  const edges: Graph["edges"] = [];
  const root = machine.root;
  const ANY = `${root.id}#any`;
  const addEdges = (node: StateNode, source: string) => {
    const all: [string, { target?: readonly StateNode[]; guard?: unknown; reenter?: boolean }[]][] = [...node.transitions.entries()];
    if (node.always?.length) all.push(["", node.always]);
    for (const [eventType, list] of all) {
      list.forEach((t, i) => {
        const guard = guardName(t.guard);
        const label = eventLabel(eventType) + (guard ? ` [${guard}]` : "");
        if (!t.target?.length) {
          // Targetless: the state handles the event without leaving (listed inside the node).
          nodes.get(source)?.notes.push(`↺ ${label}`);
          return;
        }
        for (const target of t.target) edges.push({ id: `${source}|${eventType}|${i}|${target.id}`, source, target: target.id, label });
      });
    }
  };
  const visit = (node: StateNode, parent: string | null) => {
    const kind: ChartNode["kind"] =
      node.type === "final" ? "final" : node.type === "compound" || node.type === "parallel" ? "compound" : node.always?.length ? "transient" : "atomic";
    const notes = [
      ...actionNames(node.entry as unknown[]).map((a) => `entry / ${a}`),
      ...node.invoke.map((inv) => `invoke ${typeof inv.src === "string" ? inv.src : inv.id}`),
      ...actionNames(node.exit as unknown[]).map((a) => `exit / ${a}`),
    ];
    nodes.set(node.id, { id: node.id, label: node.key, kind, notes, parent });
    if (node.type === "compound" && node.initial?.target?.length) {
      const init = `${node.id}#initial`;
      nodes.set(init, { id: init, label: "", kind: "initial", notes: [], parent: node.id });
      edges.push({ id: `${init}|${node.initial.target[0]!.id}`, source: init, target: node.initial.target[0]!.id, label: "" });
    }
    for (const child of Object.values(node.states)) visit(child, node.id);
  };
  // The root itself is the canvas: its initial state gets a start dot, its own transitions start at "any state".
  for (const child of Object.values(root.states)) visit(child, null);
  const init = `${root.id}#initial`;
  nodes.set(init, { id: init, label: "", kind: "initial", notes: [], parent: null });
  if (root.initial?.target?.length) edges.push({ id: `${init}|start`, source: init, target: root.initial.target[0]!.id, label: "" });
  for (const child of nodes.values()) {
    const state = child.kind === "initial" ? null : machine.getStateNodeById(child.id);
    if (state) addEdges(state, child.id);
  }
  const rootNotes = actionNames(root.entry as unknown[]).map((a) => `entry / ${a}`);
  const hasRootTransitions = root.transitions.size > 0;
  if (hasRootTransitions) {
    nodes.set(ANY, { id: ANY, label: "any state", kind: "any", notes: rootNotes, parent: null });
    addEdges(root, ANY);
  }
  return { nodes, edges };
}

function sizeOf(node: { label: string; notes: string[]; kind: ChartNode["kind"] }): { width: number; height: number } {
  if (node.kind === "initial") return { width: 12, height: 12 };
  const longest = Math.max(node.label.length * (CHAR_W + 1), ...node.notes.map((n) => n.length * (CHAR_W - 1)));
  // Room for the live count badge on the right.
  return { width: Math.max(90, longest + 56), height: 30 + node.notes.length * NOTE_H };
}

/** One machine as ELK's input graph (sizes and layout options set, no positions) and what each node is. */
export interface ChartInput {
  name: MachineName;
  graph: { id: string; layoutOptions: Record<string, string>; children: unknown[]; edges: unknown[] };
  nodes: Record<string, { label: string; kind: ChartNode["kind"]; notes: string[] }>;
  edges: Record<string, { source: string; target: string; label: string }>;
}

/** ELK's layered algorithm, left to right, compound states as nested graphs. */
const LAYOUT = {
  "elk.algorithm": "layered",
  "elk.direction": "RIGHT",
  "elk.hierarchyHandling": "INCLUDE_CHILDREN",
  "elk.edgeRouting": "ORTHOGONAL",
  "elk.layered.spacing.nodeNodeBetweenLayers": "24",
  "elk.layered.spacing.edgeNodeBetweenLayers": "8",
  "elk.layered.spacing.edgeEdgeBetweenLayers": "6",
  "elk.spacing.edgeEdge": "6",
  "elk.spacing.nodeNode": "20",
  "elk.spacing.edgeLabel": "1",
  "elk.edgeLabels.placement": "CENTER",
};

/**
 * The machine as ELK's input. The browser runs the layout (elkjs, served with the console): ELK's
 * runtime keeps a process awake once loaded, which the gateway itself must not be.
 */
export function chartInput(name: MachineName): ChartInput {
  const { nodes, edges } = graphOf(MACHINES[name]);
  const elkNode = (id: string): Record<string, unknown> => {
    const n = nodes.get(id)!;
    const children = [...nodes.values()].filter((c) => c.parent === id).map((c) => elkNode(c.id));
    if (children.length === 0) return { id, ...sizeOf(n) };
    return { id, children, layoutOptions: { "elk.padding": `[top=${34 + n.notes.length * NOTE_H},left=14,bottom=14,right=14]` } };
  };
  return {
    name,
    graph: {
      id: "root",
      layoutOptions: LAYOUT,
      children: [...nodes.values()].filter((n) => n.parent === null).map((n) => elkNode(n.id)),
      edges: edges.map((e) => ({
        id: e.id,
        sources: [e.source],
        targets: [e.target],
        labels: e.label ? [{ text: e.label, width: e.label.length * 6 + 6, height: 13 }] : [],
      })),
    },
    nodes: Object.fromEntries([...nodes.values()].map((n) => [n.id, { label: n.label, kind: n.kind, notes: n.notes }])),
    edges: Object.fromEntries(edges.map((e) => [e.id, { source: e.source, target: e.target, label: e.label }])),
  };
}

/** The four machines' layout inputs. */
export const machineCharts = (): ChartInput[] => (Object.keys(MACHINES) as MachineName[]).map(chartInput);
