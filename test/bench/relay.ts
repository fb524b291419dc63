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

type ClientSocket<S> = import("bun").ServerWebSocket<{ session?: S }>;

interface Session {
  ws: ClientSocket<Session>;
  inFlight: number;
}

/** The server's client sessions, in connection order; a request goes to the first with a free slot. Shared with floor.ts. */
export class ClientSessions<S extends { inFlight: number }> {
  private readonly all: S[] = [];

  add(session: S): void {
    this.all.push(session);
  }

  remove(session: S | undefined): void {
    const i = session === undefined ? -1 : this.all.indexOf(session);
    if (i >= 0) this.all.splice(i, 1);
  }

  /** The first session with fewer than SESSION_LIMIT requests in flight (and `ready`, when given). */
  withRoom(ready: (session: S) => boolean = () => true): S | undefined {
    return this.all.find((x) => x.inFlight < SESSION_LIMIT && ready(x));
  }
}

/**
 * The listener of a two-hop bench server (the relay's and floor.ts's): a buyer's request goes to
 * `post`; a client upgrading at /connect becomes a session (`newSession`) in `sessions`, its frames
 * handed to `message`. Prints `{event: "<name>_listening", port, pid}`.
 */
export function listenForClients<S extends { inFlight: number }>(o: {
  name: string;
  sessions: ClientSessions<S>;
  newSession: (ws: ClientSocket<S>) => S;
  post: (request: Request) => Response | Promise<Response>;
  message: (ws: ClientSocket<S>, message: Uint8Array) => void;
}): void {
  const srv = Bun.serve<{ session?: S }>({
    port: 0,
    hostname: "127.0.0.1",
    idleTimeout: 0,
    fetch(request, s) {
      if (new URL(request.url).pathname === "/connect") return s.upgrade(request, { data: {} }) ? undefined : new Response("upgrade", { status: 400 });
      return o.post(request);
    },
    websocket: {
      maxPayloadLength: 1 << 20,
      idleTimeout: 0,
      open(ws) {
        o.sessions.add((ws.data.session = o.newSession(ws)));
      },
      close(ws) {
        o.sessions.remove(ws.data.session);
      },
      message(ws, message) {
        o.message(ws, message as Uint8Array);
      },
    },
  });
  console.log(JSON.stringify({ event: `${o.name}_listening`, port: srv.port, pid: process.pid }));
}

/**
 * Buyer responses a client's head / data / end messages feed, by request id; a request holds one of
 * its session's slots until it ends or the buyer hangs up. Shared with floor.ts.
 */
export class RelayedResponses {
  private readonly pending = new Map<
    number,
    { resolve: (r: Response) => void; controller: ReadableStreamDefaultController<Uint8Array> | null; session: { inFlight: number } }
  >();

  /** The response of request `id`, taking one of `session`'s slots. */
  open(id: number, session: { inFlight: number }): Promise<Response> {
    session.inFlight++;
    return new Promise<Response>((resolve) => this.pending.set(id, { resolve, controller: null, session }));
  }

  has(id: number): boolean {
    return this.pending.has(id);
  }

  /** The upstream's status line: the response starts, its body streamed from the data that follows. */
  head(id: number, status: number, contentType: string): void {
    const p = this.pending.get(id);
    if (!p) return;
    const stream = new ReadableStream<Uint8Array>({
      start: (c) => {
        p.controller = c;
      },
      cancel: () => this.release(id),
    });
    p.resolve(new Response(stream, { status, headers: { "content-type": contentType } }));
  }

  data(id: number, bytes: Uint8Array): void {
    this.pending.get(id)?.controller?.enqueue(bytes);
  }

  /** The upstream's answer ended; without a head it failed. */
  end(id: number): void {
    const p = this.pending.get(id);
    if (!p) return;
    this.release(id);
    if (!p.controller) return p.resolve(new Response("upstream failed", { status: 502 }));
    try {
      p.controller.close();
    } catch {}
  }

  /** Answers request `id` with `response` instead, before anything was relayed. */
  settle(id: number, response: Response): void {
    const p = this.pending.get(id);
    if (!p) return;
    this.release(id);
    p.resolve(response);
  }

  private release(id: number): void {
    const p = this.pending.get(id);
    if (!p) return;
    this.pending.delete(id);
    p.session.inFlight--;
  }
}

function server() {
  const sessions = new ClientSessions<Session>();
  const responses = new RelayedResponses();
  let nextId = 1;

  listenForClients({
    name: "relay",
    sessions,
    newSession: (ws) => ({ ws, inFlight: 0 }),
    async post(request) {
      const body = await request.text();
      const session = sessions.withRoom();
      if (!session) return new Response("no capacity", { status: 503 });
      const id = nextId++;
      const response = responses.open(id, session);
      session.ws.send(`${id}\n${body}`);
      return response;
    },
    message(_ws, bytes) {
      const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
      const id = view.getUint32(0);
      const kind = bytes[4];
      if (kind === HEAD) responses.head(id, view.getUint16(5), decoder.decode(bytes.subarray(7)));
      else if (kind === DATA) responses.data(id, bytes.slice(5));
      else if (kind === END) responses.end(id);
    },
  });
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
