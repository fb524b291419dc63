// A TCP proxy on loopback that a test can sever and restore: a network split between one process and
// an engine (PostgreSQL, Redis) while both stay alive. `cut("reset")` closes every connection and
// refuses new ones (the peer sees the failure at once); `cut("blackhole")` keeps every connection open
// but moves no byte either way (with `holdCloses`, a close neither: it reaches the other side only once
// restored, as on a dropped path; without, at once, which frees what the closed connection held) and
// holds new ones unanswered (packets dropped: the peer sees only timeouts); `cut("replies")` is a
// one-way blackhole: what the peer sends arrives, what comes back is held (a command runs, its answer
// is lost on the way). `cut("dialer-silent")` and `cut("listener-silent")` hold one direction only, as a
// one-way packet loss or a half-broken NAT does: what the dialing side (resp. the listening side) sends
// is held, the other way flows; a new connection forms only once restored (one of its handshake's
// packets is lost), and with `holdCloses` a close sent the silent way is held too. `restore()` lets
// bytes flow again, on the held connections too (TCP resends what waited). A cut given `{ open: true }`
// acts on the connections open now only, as a NAT that lost one mapping: new ones form and flow.
// Started with `tagHeader`, it reads each connection's first HTTP request head before it connects
// upstream and tags the connection with that header's value (a node link's `x-gateway-node`): a cut
// or restore given `sources` then acts on those connections only (a partition between two nodes).
// It runs in a child process of its own (this file as a script): a test process that blocks on a
// spawnSync would otherwise stall every byte through it, a split nobody asked for.
import { createServer, connect, type Server, type Socket } from "node:net";

export type CutStyle = "reset" | "blackhole" | "replies" | "dialer-silent" | "listener-silent";

export interface TcpProxy {
  port: number;
  /**
   * Cuts every connection, or (with `sources`, given `tagHeader`) those tagged with one of them; with
   * `open`, only those open now (new ones form and flow), until restored.
   */
  cut(style: CutStyle, sources?: string[], options?: { open?: boolean }): Promise<void>;
  /** Restores every connection, or those of `sources` only. */
  restore(sources?: string[]): Promise<void>;
  stop(): Promise<void>;
}

/** Starts a proxy to 127.0.0.1:`targetPort` in a child process; commands go over its stdin, each acknowledged on its stdout. */
export async function startTcpProxy(targetPort: number, options: { tagHeader?: string; holdCloses?: boolean } = {}): Promise<TcpProxy> {
  const args = [String(targetPort), options.tagHeader ?? "", options.holdCloses ? "hold-closes" : ""];
  const proc = Bun.spawn(["bun", import.meta.path, ...args], { stdin: "pipe", stdout: "pipe", stderr: "inherit" });
  const reader = (proc.stdout as ReadableStream<Uint8Array>).getReader();
  const decoder = new TextDecoder();
  let buffered = "";
  const line = async (): Promise<string> => {
    for (;;) {
      const nl = buffered.indexOf("\n");
      if (nl >= 0) {
        const text = buffered.slice(0, nl);
        buffered = buffered.slice(nl + 1);
        return text;
      }
      const { value, done } = await reader.read();
      if (done) throw new Error("tcp proxy exited");
      buffered += decoder.decode(value, { stream: true });
    }
  };
  const command = async (text: string) => {
    proc.stdin.write(`${text}\n`);
    await proc.stdin.flush();
    await line();
  };
  const port = Number(await line());
  return {
    port,
    cut: (style, sources, options) => command(`cut ${style} ${sources?.join(",") ?? ""} ${options?.open ? "open" : ""}`),
    restore: (sources) => command(`restore ${sources?.join(",") ?? ""}`),
    async stop() {
      proc.kill("SIGKILL");
      await proc.exited;
    },
  };
}

interface Pair {
  client: Socket;
  upstream: Socket | null;
  /** With a tag header: the header's value once the first request head is read (null before). */
  tag: string | null;
  /** What the client sent before the pair was placed (its request head): written upstream first. */
  head: Buffer | null;
  /** One side closed while the pair was held silent (with holdCloses): the other learns it on restore. */
  closedWhileHeld: boolean;
  /** A cut of this connection alone (`open`), which new connections do not inherit. */
  cut: CutStyle | null;
}

/** The proxy itself (in the child process). */
async function serve(targetPort: number, tagHeader: string, holdCloses: boolean): Promise<void> {
  const pairs = new Set<Pair>();
  let state: "open" | CutStyle = "open";
  const bySource = new Map<string, CutStyle>();
  const styleOf = (pair: Pair): "open" | CutStyle => pair.cut ?? (pair.tag !== null ? bySource.get(pair.tag) : undefined) ?? state;
  /** A close from `side` waits for the restore: it travels a way held silent. */
  const held = (pair: Pair, side: "client" | "upstream") => {
    const style = styleOf(pair);
    return holdCloses && (style === "blackhole" || style === (side === "client" ? "dialer-silent" : "listener-silent"));
  };

  const close = (pair: Pair) => {
    pairs.delete(pair);
    pair.client.destroy();
    pair.upstream?.destroy();
  };
  const join = (pair: Pair) => {
    if (pair.closedWhileHeld) return close(pair);
    if (!pair.upstream) {
      const upstream = connect(targetPort, "127.0.0.1");
      upstream.on("error", () => {});
      upstream.on("close", () => (held(pair, "upstream") ? (pair.closedWhileHeld = true) : close(pair)));
      pair.upstream = upstream;
      if (pair.head) upstream.write(pair.head);
      pair.head = null;
    }
    pair.client.pipe(pair.upstream);
    pair.upstream.pipe(pair.client);
    pair.client.resume();
    pair.upstream.resume();
  };
  const holdReplies = (pair: Pair) => {
    pair.upstream?.unpipe();
    pair.upstream?.pause();
  };
  const holdRequests = (pair: Pair) => {
    pair.client.unpipe();
    pair.client.pause();
  };
  const hold = (pair: Pair) => {
    pair.client.unpipe();
    pair.upstream?.unpipe();
    pair.client.pause();
    pair.upstream?.pause();
  };
  /** A new connection (its head read, given a tag header), as the cut in force for it says. */
  const place = (pair: Pair) => {
    const style = styleOf(pair);
    if (style === "reset") return close(pair);
    if (style === "blackhole" || style === "dialer-silent" || style === "listener-silent") return pair.client.pause();
    join(pair);
    if (style === "replies") holdReplies(pair);
  };

  const server: Server = createServer((client) => {
    client.on("error", () => {});
    if (state === "reset") {
      client.destroy();
      return;
    }
    const pair: Pair = { client, upstream: null, tag: null, head: null, closedWhileHeld: false, cut: null };
    pairs.add(pair);
    client.on("close", () => (held(pair, "client") ? (pair.closedWhileHeld = true) : close(pair)));
    if (!tagHeader) return place(pair);
    let head = Buffer.alloc(0);
    const reading = (bytes: Buffer) => {
      head = Buffer.concat([head, bytes]);
      const end = head.indexOf("\r\n\r\n");
      if (end < 0 && head.length < 64 * 1024) return;
      client.off("data", reading);
      client.pause();
      const text = head.subarray(0, end < 0 ? head.length : end).toString("latin1");
      const line = text.split("\r\n").find((l) => l.toLowerCase().startsWith(`${tagHeader.toLowerCase()}:`));
      pair.tag = line ? line.slice(tagHeader.length + 1).trim() : "";
      pair.head = head;
      place(pair);
    };
    client.on("data", reading);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  console.log((server.address() as { port: number }).port);

  const cut = (style: CutStyle, sources: string[], openOnly: boolean) => {
    // A cut of the open connections only is not inherited by new ones.
    if (!openOnly) {
      if (sources.length > 0) for (const source of sources) bySource.set(source, style);
      else state = style;
    }
    for (const pair of [...pairs]) {
      // Not yet tagged: placed as the cut says once its head is read.
      if (sources.length > 0 && (pair.tag === null || !sources.includes(pair.tag))) continue;
      if (tagHeader && pair.tag === null) continue;
      if (openOnly) pair.cut = style;
      if (style === "reset") close(pair);
      else if (style === "replies" || style === "listener-silent") holdReplies(pair);
      else if (style === "dialer-silent") holdRequests(pair);
      else hold(pair);
    }
  };
  const restore = (sources: string[]) => {
    if (sources.length > 0) for (const source of sources) bySource.delete(source);
    else {
      state = "open";
      bySource.clear();
    }
    for (const pair of [...pairs]) {
      if (tagHeader && pair.tag === null) continue;
      if (sources.length === 0 || (pair.tag !== null && sources.includes(pair.tag))) pair.cut = null;
      if (styleOf(pair) !== "open") continue;
      // Unpiped first: a one-way cut left the other way piped, and a second pipe would copy each byte twice.
      pair.client.unpipe();
      pair.upstream?.unpipe();
      join(pair);
    }
  };
  let pending = "";
  process.stdin.on("data", (bytes: Buffer) => {
    pending += bytes.toString();
    let nl: number;
    while ((nl = pending.indexOf("\n")) >= 0) {
      const [verb, arg, list, scope] = pending.slice(0, nl).split(" ");
      pending = pending.slice(nl + 1);
      const sources = (verb === "cut" ? list : arg)?.split(",").filter(Boolean) ?? [];
      if (verb === "cut") cut(arg as CutStyle, sources, scope === "open");
      else if (verb === "restore") restore(sources);
      console.log("ok");
    }
  });
  // The test process gone (stdin closed): so is the proxy.
  process.stdin.on("end", () => process.exit(0));
}

if (import.meta.main) await serve(Number(process.argv[2]), process.argv[3] ?? "", process.argv[4] === "hold-closes");
