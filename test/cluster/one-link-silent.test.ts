// Two nodes hold two links between them (docs/scale-out.md, "Node links"): each dials the other's link
// server, and a link carries messages from its dialer only (jobs and cancels one way, the provider's
// frames the other), with the dialer's pings and the listener's pongs. Here ONE of the two
// connections goes silent one way while the other flows — a NAT that lost one mapping: no FIN, no RST,
// and a new connection forms at once. Each of the four cases (either connection, either direction)
// runs under load: buyers on n1, providers on n2. Every request must complete or fail in-band within a
// bound far below the first-byte timeout (30 s), nothing may be billed twice or beyond what its buyer
// read, no attempt may stay pending, and the silent link must be noticed and made again.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { SQL } from "bun";
import { ledgerViolations, SETTLEMENT_COLUMNS, type Received, type SettlementRow } from "../chaos/common.ts";
import { clusterMissing, startCluster, type TestCluster } from "../support/cluster.ts";
import { waitFor } from "../support/harness.ts";
import { freePort } from "../support/ports.ts";
import { startTcpProxy, type CutStyle, type TcpProxy } from "../support/tcpProxy.ts";

const MODEL = "one-link-model";
const LEASE_MS = 2000;
/** A request across a silent link waits at most for its silence to be noticed (1–1.2 leases) and a failover: 4 leases is generous. */
const BOUND_MS = 4 * LEASE_MS;
const BUYERS = 4;

type Node = TestCluster["nodes"][0];

/** How one buyer request ended. */
interface Outcome {
  id: string;
  stream: boolean;
  ms: number;
  /** `done` (a whole answer), `in-band CODE` (a stream's error frame), or `STATUS CODE[ retryable]`. */
  end: string;
}

/** One chat completion on `node`, read to its end; content bytes read go in `received`. */
async function ask(node: Node, apiKey: string, stream: boolean, n: number, received: Received): Promise<Outcome> {
  const sentAt = performance.now();
  const body = JSON.stringify({ model: MODEL, stream, max_tokens: 8 + (n % 24), messages: [{ role: "user", content: `one link ${n}` }] });
  const outcome = (id: string, end: string): Outcome => ({ id, stream, ms: Math.round(performance.now() - sentAt), end });
  // Far above the bound: a request that waits for the first-byte timeout is seen as one, not cut short.
  const response = await fetch(`${node.baseURL}/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${apiKey}`, "content-type": "application/json" },
    body,
    signal: AbortSignal.timeout(60_000),
  });
  const id = (response.headers.get("x-request-id") ?? "").replace(/^chatcmpl-/, "");
  const bytes = (text: string) => new TextEncoder().encode(text).byteLength;
  if (response.status !== 200) {
    const error = ((await response.json()) as { error: { code: string; retryable: boolean } }).error;
    return outcome(id, `${response.status} ${error.code}${error.retryable ? " retryable" : ""}`);
  }
  if (!stream) {
    const answer = (await response.json()) as { choices: { message: { content: string | null } }[] };
    received.set(id, bytes(answer.choices[0]?.message.content ?? ""));
    return outcome(id, "done");
  }
  received.set(id, 0);
  const text = await response.text();
  for (const event of text.split("\n\n")) {
    if (event === "data: [DONE]") return outcome(id, "done");
    if (!event.startsWith("data: {")) continue;
    const data = JSON.parse(event.slice(6)) as { error?: { code: string }; choices?: { delta?: { content?: string } }[] };
    if (data.error) return outcome(id, `in-band ${data.error.code}`);
    received.set(id, received.get(id)! + bytes(data.choices?.[0]?.delta?.content ?? ""));
  }
  return outcome(id, "cut short");
}

describe.skipIf(clusterMissing !== null)("one of two links between two nodes silent one way, the other flowing", () => {
  let cluster: TestCluster;
  let sql: SQL;
  let apiKey: string;
  let n1: Node;
  let n2: Node;
  /** The proxy in front of each node's link server: proxies[0] carries n2's link to n1, proxies[1] n1's link to n2. */
  let proxies: TcpProxy[];
  const providerEvents: Record<string, unknown>[][] = [];
  /** Content bytes each buyer read, by request id, over every case (the checks read the whole store). */
  const received: Received = new Map();
  beforeAll(async () => {
    cluster = await startCluster({ nodes: 0, models: [MODEL], leaseMs: LEASE_MS, extraArgs: ["--pending-deadline-ms", "3000", "--paid-concurrent-requests", "16"] });
    sql = new SQL(cluster.databaseUrl, { max: 1 });
    const linkPorts = [await freePort(), await freePort()];
    proxies = await Promise.all(linkPorts.map((port) => startTcpProxy(port, { holdCloses: true })));
    const linkArgs = (i: number) => ["--cluster-link-port", String(linkPorts[i]), "--cluster-link-announce", `127.0.0.1:${proxies[i]!.port}`];
    n1 = await cluster.startNode("n1", linkArgs(0));
    n2 = await cluster.startNode("n2", linkArgs(1));
    for (const i of [0, 1]) providerEvents.push(cluster.provider({ id: `one-link-${i}`, gateways: [n2], tokensPerSecond: 40 }).events);
    await cluster.waitRoutable(n1, 2);
    apiKey = cluster.paidBuyer("one-link-buyer").api_key;
  }, 180_000);
  afterAll(async () => {
    await sql?.close();
    for (const p of proxies ?? []) await p.stop();
    await cluster?.close();
  });

  /** `from`'s link to `to` is open: the last of its events about that link (not the one `to` dialed) is an open. */
  const linkOpen = (from: Node, to: Node) =>
    from.events
      .filter((e) => e.peer === to.name && (["cluster_link_open", "cluster_link_closed", "cluster_link_unreachable"].includes(String(e.event)) || (e.event === "cluster_link_silent" && e.outbound === true)))
      .at(-1)?.event === "cluster_link_open";
  const count = (node: Node, event: string) => node.events.filter((e) => e.event === event).length;

  test.each([
    ["n1's link to n2 (jobs, cancels): n1's bytes lost", "n1", "dialer-silent"],
    ["n1's link to n2: n2's bytes (its pongs) lost", "n1", "listener-silent"],
    ["n2's link to n1 (the provider's frames): n2's bytes lost", "n2", "dialer-silent"],
    ["n2's link to n1: n1's bytes (its pongs) lost", "n2", "listener-silent"],
  ] as [string, "n1" | "n2", CutStyle][])("%s", async (_name, dialerName, style) => {
    const [dialer, listener] = dialerName === "n1" ? [n1, n2] : [n2, n1];
    // The link dialed by n1 goes through n2's proxy, and the other way round.
    const proxy = proxies[dialer === n1 ? 1 : 0]!;
    await waitFor(() => linkOpen(n1, n2) && linkOpen(n2, n1), 15_000, "both links open");
    const opened = count(dialer, "cluster_link_open");
    const silent = [count(n1, "cluster_link_silent"), count(n2, "cluster_link_silent")];

    // Buyers on n1, streaming and not, all answered by n2's providers, across the two links.
    const outcomes: Outcome[] = [];
    let asking = true;
    let n = 0;
    const buyers = Array.from({ length: BUYERS }, async (_, b) => {
      while (asking) outcomes.push(await ask(n1, apiKey, (n + b) % 2 === 0, n++, received));
    });
    await waitFor(() => outcomes.length >= BUYERS * 2, 15_000, "requests served across the links");

    // That one connection goes silent one way; the next one the dialer makes flows.
    await proxy.cut(style, undefined, { open: true });
    const cutAt = performance.now();
    // Noticed: either end drops the silent link (its own check, or its peer's marker)...
    await waitFor(() => count(n1, "cluster_link_silent") > silent[0]! || count(n2, "cluster_link_silent") > silent[1]!, 3 * LEASE_MS, "the silence noticed");
    const noticedMs = performance.now() - cutAt;
    // ... and the dialer makes it again.
    await waitFor(() => count(dialer, "cluster_link_open") > opened && linkOpen(dialer, listener), 10_000, "the link made again");
    const before = outcomes.length;
    await waitFor(() => outcomes.length >= before + BUYERS * 2, 15_000, "requests served over the new link");
    asking = false;
    await Promise.all(buyers);
    await proxy.restore();

    // Every request ended well within the first-byte timeout: served, or failed in-band (a stream cut
    // mid-answer) or with a retryable refusal.
    const slowest = Math.max(...outcomes.map((o) => o.ms));
    const ends = new Map<string, number>();
    for (const o of outcomes) ends.set(o.end, (ends.get(o.end) ?? 0) + 1);
    console.log(JSON.stringify({ case: `${dialerName} ${style}`, noticedMs: Math.round(noticedMs), requests: outcomes.length, slowest, ends: Object.fromEntries(ends) }));
    expect(slowest).toBeLessThan(BOUND_MS);
    for (const end of ends.keys()) expect(["done", "in-band provider_disconnected"].includes(end) || end.endsWith(" retryable")).toBe(true);
    expect(noticedMs).toBeLessThan(2 * LEASE_MS);

    // No attempt stays pending; nothing billed twice, nor beyond what its buyer read; the audit is clean.
    await waitFor(async () => ((await sql`SELECT count(*)::int AS n FROM settlements WHERE label = 'pending'`)[0] as { n: number }).n === 0, 10_000, "every attempt settled");
    const settlements = (await sql.unsafe(`SELECT ${SETTLEMENT_COLUMNS} FROM settlements`)) as SettlementRow[];
    expect(ledgerViolations({ acknowledgedGrants: [], storedGrantMemos: new Set(), settlements, providerEvents: providerEvents.flat(), received })).toEqual([]);
    expect(cluster.cli(["ledger", "audit"]).exitCode).toBe(0);
  }, 90_000);
});
