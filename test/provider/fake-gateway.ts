// A scripted fake gateway for provider-runtime tests: a real Bun.serve WebSocket on a loopback port.
// It runs the handshake itself (verifying the signature independently with node:crypto) and records
// every frame, so tests drive jobs and assert on what the runtime sent.
import { createPublicKey, randomBytes, verify } from "node:crypto";
import type { ServerWebSocket } from "bun";
import { decodeProviderFrame, encodeFrame } from "../../src/wire/codec.ts";
import type { GatewayFrame, HelloFrame, JobFrame, ProviderFrame } from "../../src/wire/frames.ts";

export interface FakeSession {
  readonly index: number;
  hello: HelloFrame | null;
  authOk: boolean | null;
  readonly sessionId: string;
  /** Every frame received after the handshake, in order. */
  readonly frames: ProviderFrame[];
  textFrames: number;
  /** Decode failures of frames the runtime sent (must stay empty). */
  readonly badFrames: string[];
  readonly welcomed: Promise<void>;
  readonly closed: Promise<{ code: number; reason: string }>;
  /** Resolves with the first not-yet-taken frame matching `match` (waiting if needed). */
  take<F extends ProviderFrame = ProviderFrame>(match: (f: ProviderFrame) => boolean, timeoutMs?: number): Promise<F>;
  send(frame: GatewayFrame): void;
  sendRaw(data: string | Uint8Array): void;
  close(code?: number, reason?: string): void;
  terminate(): void;
}

export interface FakeGateway {
  readonly url: string;
  readonly sessions: FakeSession[];
  /** Resolves with the n-th session (0-based) once it has connected. */
  session(n: number, timeoutMs?: number): Promise<FakeSession>;
  stop(): Promise<void>;
}

/** Independent re-implementation of the handshake check, so the test does not trust src/provider/keys. */
function verifyAuth(hello: HelloFrame, sessionId: string, nonce: Uint8Array, signature: Uint8Array): boolean {
  const x = Buffer.from(hello.receipt_public_key).toString("base64url");
  const key = createPublicKey({ key: { kty: "OKP", crv: "Ed25519", x }, format: "jwk" });
  const message = `provider-auth-v1\n${sessionId}\n${hello.provider_id}\n${Buffer.from(nonce).toString("hex")}`;
  return verify(null, Buffer.from(message, "utf8"), key, signature);
}

export function withTimeout<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

export interface FakeGatewayOptions {
  heartbeatIntervalMs?: number;
  tls?: { cert: string; key: string };
  /** Answers plain HTTP requests on the gateway's port (e.g. the catalog feed); undefined → 426. */
  http?: (request: Request) => Response | Promise<Response> | undefined;
}

export function startFakeGateway(options: FakeGatewayOptions = {}): FakeGateway {
  const sessions: FakeSession[] = [];
  const bySocket = new Map<ServerWebSocket<unknown>, Session>();
  const sessionWaiters: Array<() => void> = [];

  class Session implements FakeSession {
    hello: HelloFrame | null = null;
    authOk: boolean | null = null;
    readonly sessionId: string;
    readonly frames: ProviderFrame[] = [];
    textFrames = 0;
    readonly badFrames: string[] = [];
    readonly welcomed: Promise<void>;
    readonly closed: Promise<{ code: number; reason: string }>;
    markWelcomed!: () => void;
    markClosed!: (c: { code: number; reason: string }) => void;
    private readonly taken = new Set<number>();
    private readonly waiters = new Set<() => void>();
    private readonly nonce = new Uint8Array(randomBytes(32));

    constructor(
      readonly index: number,
      private readonly ws: ServerWebSocket<unknown>,
    ) {
      this.sessionId = `sess-${index}-${randomBytes(4).toString("hex")}`;
      this.welcomed = new Promise((resolve) => (this.markWelcomed = resolve));
      this.closed = new Promise((resolve) => (this.markClosed = resolve));
    }

    receive(data: string | Buffer): void {
      if (typeof data === "string") {
        this.textFrames++;
        return;
      }
      const decoded = decodeProviderFrame(new Uint8Array(data));
      if (!decoded.ok) {
        this.badFrames.push(decoded.reason);
        return;
      }
      const frame = decoded.frame;
      if (frame.type === "hello") {
        this.hello = frame;
        return this.send({ type: "challenge", session_id: this.sessionId, nonce: this.nonce });
      }
      if (frame.type === "auth") {
        this.authOk = this.hello !== null && verifyAuth(this.hello, this.sessionId, this.nonce, frame.signature);
        if (!this.authOk) return this.close(4003, "auth_failed");
        this.send({
          type: "welcome",
          session_id: this.sessionId,
          tier: "provisional",
          heartbeat_interval_ms: options.heartbeatIntervalMs ?? 10_000,
          catalog_id: "",
        });
        return this.markWelcomed();
      }
      this.frames.push(frame);
      for (const wake of [...this.waiters]) wake();
    }

    take<F extends ProviderFrame = ProviderFrame>(match: (f: ProviderFrame) => boolean, timeoutMs = 1500): Promise<F> {
      const found = new Promise<F>((resolve) => {
        const check = () => {
          const i = this.frames.findIndex((f, n) => !this.taken.has(n) && match(f));
          if (i < 0) return false;
          this.taken.add(i);
          this.waiters.delete(check);
          resolve(this.frames[i] as F);
          return true;
        };
        if (!check()) this.waiters.add(check);
      });
      return withTimeout(found, timeoutMs, `a frame in session ${this.index}`);
    }

    send(frame: GatewayFrame): void {
      this.ws.send(encodeFrame(frame));
    }
    sendRaw(data: string | Uint8Array): void {
      this.ws.send(data);
    }
    close(code = 1000, reason = ""): void {
      this.ws.close(code, reason);
    }
    terminate(): void {
      this.ws.terminate();
    }
  }

  const server = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    ...(options.tls ? { tls: options.tls } : {}),
    fetch(req, srv) {
      if (req.headers.get("upgrade")?.toLowerCase() !== "websocket") {
        const answer = options.http?.(req);
        if (answer !== undefined) return answer;
      }
      return srv.upgrade(req) ? undefined : new Response("upgrade required", { status: 426 });
    },
    websocket: {
      open(ws) {
        const session = new Session(sessions.length, ws);
        bySocket.set(ws, session);
        sessions.push(session);
        for (const wake of sessionWaiters.splice(0)) wake();
      },
      message(ws, data) {
        bySocket.get(ws)?.receive(data);
      },
      close(ws, code, reason) {
        bySocket.get(ws)?.markClosed({ code, reason });
      },
    },
  });

  return {
    url: `${options.tls ? "wss" : "ws"}://127.0.0.1:${server.port}/v1/provider/connect`,
    sessions,
    session(n, timeoutMs = 1500) {
      const found = new Promise<FakeSession>((resolve) => {
        const check = () => {
          const s = sessions[n];
          if (s) resolve(s);
          else sessionWaiters.push(check);
        };
        check();
      });
      return withTimeout(found, timeoutMs, `session ${n}`);
    },
    async stop() {
      await server.stop(true);
    },
  };
}

/** A job frame with plausible route fields. */
export function makeJob(overrides: Partial<JobFrame> = {}): JobFrame {
  return {
    type: "job",
    request_id: "req-1",
    attempt_n: 0,
    model_id: "demo-model",
    messages: [
      { role: "system", content: "You are terse." },
      { role: "user", content: "Tell me about rivers." },
    ],
    params: { max_tokens: 100 },
    route: {
      account_scope: "a".repeat(64),
      catalog_id: "",
      catalog_body_digest: "",
      expected_catalog_model_hash: "",
      route_snapshot_digest: "b".repeat(64),
      route_snapshot_mode: "observe",
      route_snapshot_policy_version: "gw-settlement-v1",
      prompt_hash: "c".repeat(64),
    },
    deadline_ms: 60_000,
    ...overrides,
  };
}

export interface BlackholeProxy {
  /** ws:// URL of the proxy, forwarding to the target's path. */
  readonly url: string;
  /** TCP connections accepted so far. */
  readonly accepted: number;
  /**
   * From now on, every connection open *now* swallows bytes in both directions without closing — a
   * half-open socket, as after a NAT drop or a sleeping host. Later connections forward normally.
   */
  silenceOpenConnections(): void;
  /** Every connection from now on is accepted and then never answered (not even the upgrade). */
  blackholeNewConnections(): void;
  stop(): void;
}

/** A loopback TCP proxy in front of a fake gateway that can go silent (Bun's server always answers pings). */
export function startBlackholeProxy(targetUrl: string): BlackholeProxy {
  const target = new URL(targetUrl);
  interface Pair {
    silent: boolean;
    upstream: Bun.Socket<undefined> | null;
    pending: Uint8Array[];
  }
  const pairs = new Map<Bun.Socket<Pair>, Pair>();
  let accepted = 0;
  let blackholeNew = false;
  const listener = Bun.listen<Pair>({
    hostname: "127.0.0.1",
    port: 0,
    socket: {
      open(client) {
        accepted++;
        const pair: Pair = { silent: blackholeNew, upstream: null, pending: [] };
        client.data = pair;
        pairs.set(client, pair);
        if (pair.silent) return;
        void Bun.connect({
          hostname: target.hostname,
          port: Number(target.port),
          socket: {
            data: (_up, bytes) => void (pair.silent || client.write(bytes)),
            close: () => void (pair.silent || client.end()),
            error: () => void (pair.silent || client.end()),
          },
        }).then((upstream) => {
          pair.upstream = upstream;
          for (const bytes of pair.pending.splice(0)) upstream.write(bytes);
        }, () => client.end());
      },
      data(client, bytes) {
        const pair = client.data;
        if (pair.silent) return;
        if (pair.upstream) pair.upstream.write(bytes);
        else pair.pending.push(new Uint8Array(bytes));
      },
      close(client) {
        const pair = client.data;
        pairs.delete(client);
        if (!pair.silent) pair.upstream?.end();
      },
    },
  });
  return {
    url: `ws://127.0.0.1:${listener.port}${target.pathname}`,
    get accepted() {
      return accepted;
    },
    silenceOpenConnections() {
      for (const pair of pairs.values()) pair.silent = true;
    },
    blackholeNewConnections() {
      blackholeNew = true;
    },
    stop() {
      for (const [client, pair] of pairs) {
        client.terminate();
        pair.upstream?.terminate();
      }
      listener.stop(true);
    },
  };
}
