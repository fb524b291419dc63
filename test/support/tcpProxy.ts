// A TCP proxy on loopback that a test can sever and restore: a network split between one process and
// an engine (PostgreSQL, Redis) while both stay alive. `cut("reset")` closes every connection and
// refuses new ones (the peer sees the failure at once); `cut("blackhole")` keeps every connection open
// but moves no byte either way and holds new ones unanswered (packets dropped: the peer sees only
// timeouts); `cut("replies")` is a one-way blackhole: what the peer sends arrives, what comes back is
// held (a command runs, its answer is lost on the way). `restore()` lets bytes flow again, on the held
// connections too (TCP resends what waited).
// It runs in a child process of its own (this file as a script): a test process that blocks on a
// spawnSync would otherwise stall every byte through it, a split nobody asked for.
import { createServer, connect, type Server, type Socket } from "node:net";

export type CutStyle = "reset" | "blackhole" | "replies";

export interface TcpProxy {
  port: number;
  cut(style: CutStyle): Promise<void>;
  restore(): Promise<void>;
  stop(): Promise<void>;
}

/** Starts a proxy to 127.0.0.1:`targetPort` in a child process; commands go over its stdin, each acknowledged on its stdout. */
export async function startTcpProxy(targetPort: number): Promise<TcpProxy> {
  const proc = Bun.spawn(["bun", import.meta.path, String(targetPort)], { stdin: "pipe", stdout: "pipe", stderr: "inherit" });
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
    cut: (style) => command(`cut ${style}`),
    restore: () => command("restore"),
    async stop() {
      proc.kill("SIGKILL");
      await proc.exited;
    },
  };
}

interface Pair {
  client: Socket;
  upstream: Socket | null;
}

/** The proxy itself (in the child process). */
async function serve(targetPort: number): Promise<void> {
  const pairs = new Set<Pair>();
  let state: "open" | CutStyle = "open";

  const join = (pair: Pair) => {
    if (!pair.upstream) {
      const upstream = connect(targetPort, "127.0.0.1");
      upstream.on("error", () => {});
      upstream.on("close", () => pair.client.destroy());
      pair.upstream = upstream;
    }
    pair.client.pipe(pair.upstream);
    pair.upstream.pipe(pair.client);
    pair.client.resume();
    pair.upstream.resume();
  };

  const server: Server = createServer((client) => {
    client.on("error", () => {});
    if (state === "reset") {
      client.destroy();
      return;
    }
    const pair: Pair = { client, upstream: null };
    pairs.add(pair);
    client.on("close", () => {
      pairs.delete(pair);
      pair.upstream?.destroy();
    });
    if (state === "blackhole") client.pause();
    else join(pair);
    if (state === "replies") holdReplies(pair);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  console.log((server.address() as { port: number }).port);

  const holdReplies = (pair: Pair) => {
    pair.upstream?.unpipe();
    pair.upstream?.pause();
  };
  const cut = (style: CutStyle) => {
    state = style;
    for (const pair of [...pairs]) {
      if (style === "reset") {
        pair.client.destroy();
        pair.upstream?.destroy();
        continue;
      }
      if (style === "replies") {
        holdReplies(pair);
        continue;
      }
      pair.client.unpipe();
      pair.upstream?.unpipe();
      pair.client.pause();
      pair.upstream?.pause();
    }
  };
  const restore = () => {
    state = "open";
    for (const pair of pairs) {
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
      const [verb, arg] = pending.slice(0, nl).split(" ");
      pending = pending.slice(nl + 1);
      if (verb === "cut") cut(arg as CutStyle);
      else if (verb === "restore") restore();
      console.log("ok");
    }
  });
  // The test process gone (stdin closed): so is the proxy.
  process.stdin.on("end", () => process.exit(0));
}

if (import.meta.main) await serve(Number(process.argv[2]));
