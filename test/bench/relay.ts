// The bare relay: the practical floor of the gateway's two-hop shape on this machine, with none of
// its logic (no auth, quota, routing policy, actors, schema checks, settlement, SQLite, msgpack).
//   bun test/bench/relay.ts server            HTTP + WebSocket server; POST /v1/chat/completions is
//                                             sent as one text frame to a connected client, whose
//                                             binary frames come back as the HTTP response
//   bun test/bench/relay.ts client WS_URL UPSTREAM
//                                             connects to the server, POSTs each job's body to the
//                                             upstream and relays the answer's bytes as they arrive
// Binary frames, client → server: u32 request id, u8 kind (0 head: u16 status + content type,
// 1 data: raw upstream bytes, 2 end), payload. Sessions fill one at a time (up to 1024 in flight),
// as the gateway's router does.

const HEAD = 0;
const DATA = 1;
const END = 2;
const SESSION_LIMIT = 1024;
const encoder = new TextEncoder();
const decoder = new TextDecoder();

interface Pending {
  resolve: (r: Response) => void;
  controller: ReadableStreamDefaultController<Uint8Array> | null;
  session: Session;
}

interface Session {
  ws: import("bun").ServerWebSocket<{ session?: Session }>;
  inFlight: number;
}

function server() {
  const sessions: Session[] = [];
  const pending = new Map<number, Pending>();
  let nextId = 1;

  const finish = (id: number, p: Pending) => {
    pending.delete(id);
    p.session.inFlight--;
  };

  const srv = Bun.serve<{ session?: Session }>({
    port: 0,
    hostname: "127.0.0.1",
    idleTimeout: 0,
    async fetch(request, s) {
      const url = new URL(request.url);
      if (url.pathname === "/connect") return s.upgrade(request, { data: {} }) ? undefined : new Response("upgrade", { status: 400 });
      const body = await request.text();
      const session = sessions.find((x) => x.inFlight < SESSION_LIMIT);
      if (!session) return new Response("no capacity", { status: 503 });
      const id = nextId++;
      session.inFlight++;
      const response = new Promise<Response>((resolve) => pending.set(id, { resolve, controller: null, session }));
      session.ws.send(`${id}\n${body}`);
      return response;
    },
    websocket: {
      maxPayloadLength: 1 << 20,
      idleTimeout: 0,
      open(ws) {
        const session: Session = { ws, inFlight: 0 };
        ws.data.session = session;
        sessions.push(session);
      },
      close(ws) {
        const i = sessions.indexOf(ws.data.session!);
        if (i >= 0) sessions.splice(i, 1);
      },
      message(_ws, message) {
        const bytes = message as Uint8Array;
        const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
        const id = view.getUint32(0);
        const p = pending.get(id);
        if (!p) return;
        const kind = bytes[4];
        if (kind === HEAD) {
          const status = view.getUint16(5);
          const contentType = decoder.decode(bytes.subarray(7));
          const stream = new ReadableStream<Uint8Array>({
            start: (c) => {
              p.controller = c;
            },
            cancel: () => finish(id, p),
          });
          p.resolve(new Response(stream, { status, headers: { "content-type": contentType } }));
        } else if (kind === DATA) {
          p.controller?.enqueue(bytes.slice(5));
        } else if (kind === END) {
          finish(id, p);
          if (!p.controller) return p.resolve(new Response("upstream failed", { status: 502 }));
          try {
            p.controller.close();
          } catch {}
        }
      },
    },
  });
  console.log(JSON.stringify({ event: "relay_listening", port: srv.port, pid: process.pid }));
}

function frame(id: number, kind: number, payload: Uint8Array | null): Uint8Array {
  const out = new Uint8Array(5 + (payload?.byteLength ?? 0));
  new DataView(out.buffer).setUint32(0, id);
  out[4] = kind;
  if (payload) out.set(payload, 5);
  return out;
}

function client(wsUrl: string, upstream: string) {
  const target = `${upstream}/v1/chat/completions`;
  const ws = new WebSocket(wsUrl);
  ws.binaryType = "nodebuffer";
  ws.onopen = () => console.log(JSON.stringify({ event: "relay_client_connected" }));
  ws.onmessage = async (event) => {
    const text = event.data as string;
    const nl = text.indexOf("\n");
    const id = Number(text.slice(0, nl));
    try {
      const res = await fetch(target, { method: "POST", headers: { "content-type": "application/json" }, body: text.slice(nl + 1) });
      const ct = encoder.encode(res.headers.get("content-type") ?? "application/octet-stream");
      const head = new Uint8Array(2 + ct.byteLength);
      new DataView(head.buffer).setUint16(0, res.status);
      head.set(ct, 2);
      ws.send(frame(id, HEAD, head));
      for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) ws.send(frame(id, DATA, chunk));
    } catch {}
    ws.send(frame(id, END, null));
  };
}

if (import.meta.main) {
  const [role, a, b] = process.argv.slice(2);
  if (role === "server") server();
  else if (role === "client") client(a!, b!);
  else throw new Error("usage: relay.ts server | client WS_URL UPSTREAM");
}
