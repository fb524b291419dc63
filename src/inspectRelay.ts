// `bun run inspect:relay`: the relay between `gateway serve --inspect` and the Stately inspector in a
// browser (docs/inspector.md). It speaks @statelyai/inspect's relay protocol (every text message from
// one socket goes to all others; the last 200 are replayed to a late page) but binds 127.0.0.1 unless
// asked for another host: the events name accounts and providers, and the library's relay listens on
// every interface with no way to choose.

export const RELAY_DEFAULT_HOST = "127.0.0.1";
export const RELAY_DEFAULT_PORT = 8090;
const REPLAYED_EVENTS = 200;
const STATELY_INSPECT_URL = "https://stately.ai/inspect";

export interface RelayOptions {
  host?: string;
  port?: number;
}

export interface RunningRelay {
  host: string;
  port: number;
  stop(): void;
}

/** The browser page: embeds the Stately inspector and forwards the relay's events into it. */
function bridgePage(wsUrl: string): string {
  return `<!doctype html>
<html><head><meta charset="utf-8"><title>Gateway inspector relay</title>
<style>html,body{height:100%;margin:0}iframe{width:100%;height:100%;border:0}</style></head>
<body><iframe id="inspector" src="${STATELY_INSPECT_URL}"></iframe>
<script>
const frame = document.getElementById("inspector");
const waiting = [];
let connected = false;
addEventListener("message", (e) => {
  if (e.data && e.data.type === "@statelyai.connected") {
    connected = true;
    for (const event of waiting.splice(0)) frame.contentWindow.postMessage(event, "*");
  }
});
new WebSocket(${JSON.stringify(wsUrl)}).onmessage = (m) => {
  const event = JSON.parse(m.data);
  if (connected) frame.contentWindow.postMessage(event, "*");
  else waiting.push(event);
};
</script></body></html>`;
}

export function startInspectorRelay(options: RelayOptions = {}): RunningRelay {
  const host = options.host ?? RELAY_DEFAULT_HOST;
  const recent: string[] = [];
  type Peer = Bun.ServerWebSocket<unknown>;
  const peers = new Set<Peer>();
  const server = Bun.serve({
    hostname: host,
    port: options.port ?? RELAY_DEFAULT_PORT,
    fetch(request, srv) {
      if (srv.upgrade(request)) return undefined;
      const wsHost = host === "0.0.0.0" || host === "::" ? new URL(request.url).host : `${host.includes(":") ? `[${host}]` : host}:${srv.port}`;
      return new Response(bridgePage(`ws://${wsHost}`), { headers: { "content-type": "text/html; charset=utf-8" } });
    },
    websocket: {
      open(ws) {
        peers.add(ws);
        for (const message of recent) ws.send(message);
      },
      message(ws, data) {
        const message = String(data);
        recent.push(message);
        if (recent.length > REPLAYED_EVENTS) recent.shift();
        for (const peer of peers) if (peer !== ws) peer.send(message);
      },
      close(ws) {
        peers.delete(ws);
      },
    },
  });
  return { host, port: server.port!, stop: () => server.stop(true) };
}

/** `--host H --port P`, else INSPECT_HOST / INSPECT_PORT, else 127.0.0.1:8090. */
export function relayOptionsFrom(argv: readonly string[], env: Record<string, string | undefined>): RelayOptions {
  const flag = (name: string) => {
    const i = argv.indexOf(name);
    if (i >= 0) return argv[i + 1];
    return argv.find((a) => a.startsWith(`${name}=`))?.slice(name.length + 1);
  };
  const host = flag("--host") ?? (env.INSPECT_HOST || undefined);
  const port = flag("--port") ?? (env.INSPECT_PORT || undefined);
  return { host, port: port === undefined ? undefined : Number(port) };
}

if (import.meta.main) {
  const relay = startInspectorRelay(relayOptionsFrom(process.argv.slice(2), process.env));
  const shown = relay.host.includes(":") ? `[${relay.host}]` : relay.host;
  console.error(`inspector relay on ws://${shown}:${relay.port} — open http://${shown}:${relay.port} in a browser; start the gateway with --inspect=ws://${shown}:${relay.port}`);
}
