// `gateway serve --inspect[=URL]` (docs/architecture.md): every actor's inspection events go to a Stately
// inspector over a WebSocket, after redaction. This module is the only way out to an inspector, so the
// rule "nothing sent to an inspector holds raw API keys, prompts or outputs" is enforced here, once.
//
// Event conversion (XState inspection event → Stately's wire shape) is @statelyai/inspect's own
// `createInspector`. The transport is ours: the library's WebSocketAdapter re-arms its reconnect timer
// after stop(), so a gateway with an unreachable inspector would never exit after SIGTERM; this adapter
// stops for good, buffers a bounded number of events while disconnected and speaks the same protocol
// (one JSON text message per Stately inspection event), so the library's relay server still works.
import { createInspector, type StatelyInspectionEvent } from "@statelyai/inspect";
import type { InspectionEvent } from "xstate";
import type { Log } from "./log.ts";

export const REDACTED = "[redacted]";

/**
 * Keys whose values are buyer or provider text (prompts, outputs, tool arguments) or credentials.
 * Matched case-insensitively with `_` and `-` removed, at any depth, whatever the value's type.
 */
const SENSITIVE_KEYS: ReadonlySet<string> = new Set([
  // prompts and outputs
  "content",
  "messages",
  "prompt",
  "prompts",
  "text",
  "delta",
  "arguments",
  "toolcalls",
  "tools",
  "instructions",
  "inputtext",
  "outputtext",
  "responseformat",
  "stop",
  // credentials
  "apikey",
  "authorization",
  "bearer",
  "secret",
  "gatewaysecret",
  "password",
  "privatekey",
  "upstreamkey",
  "token" /* a credential; `tokens` (a count) is not matched */,
]);

/** Credentials recognisable by shape inside any string (e.g. an error message or a definition dump). */
const SECRET_PATTERNS: readonly RegExp[] = [
  /-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(-----END [A-Z ]*PRIVATE KEY-----|$)/g,
  /\bBearer\s+\S+/gi,
  // API keys look like <service prefix>_<43 base64url chars>; any long token after a short prefix counts.
  /\b[A-Za-z][A-Za-z0-9]{0,15}_[A-Za-z0-9_-]{32,}/g,
];

const MAX_DEPTH = 12;

const normalizeKey = (key: string) => key.toLowerCase().replace(/[_-]/g, "");

function scrubString(value: string): string {
  let out = value;
  for (const pattern of SECRET_PATTERNS) out = out.replace(pattern, REDACTED);
  return out;
}

function walk(value: unknown, depth: number, ancestors: object[]): unknown {
  if (value === null || value === undefined) return value;
  switch (typeof value) {
    case "string":
      return scrubString(value);
    case "number":
    case "boolean":
      return value;
    case "bigint":
      return value.toString();
    case "function":
    case "symbol":
      return undefined;
  }
  if (ArrayBuffer.isView(value)) return `[${value.byteLength} bytes]`;
  if (value instanceof ArrayBuffer) return `[${value.byteLength} bytes]`;
  if (value instanceof Error) return { name: value.name }; // messages may quote provider or buyer text
  let obj = value as object;
  if (typeof (obj as { toJSON?: unknown }).toJSON === "function") {
    // As JSON.stringify would: XState snapshots and actor refs shed their machine and internals here.
    const json: unknown = (obj as { toJSON(): unknown }).toJSON();
    if (json === null || typeof json !== "object") return walk(json, depth, ancestors);
    obj = json;
  }
  if (ancestors.includes(obj)) return "[circular]";
  if (depth >= MAX_DEPTH) return "[too deep]";
  const next = [...ancestors, obj];
  if (Array.isArray(obj)) return obj.map((item) => walk(item, depth + 1, next) ?? null);
  if (obj instanceof Set) return [...obj].map((item) => walk(item, depth + 1, next) ?? null);
  const entries = obj instanceof Map ? [...obj.entries()].map(([k, v]) => [String(k), v] as const) : Object.entries(obj);
  const out: Record<string, unknown> = {};
  for (const [key, item] of entries) {
    if (SENSITIVE_KEYS.has(normalizeKey(key))) {
      out[key] = item === null || item === undefined ? item : REDACTED;
      continue;
    }
    const walked = walk(item, depth + 1, next);
    if (walked !== undefined) out[key] = walked;
  }
  return out;
}

/**
 * A JSON-safe deep copy of `value` with prompts, outputs and credentials removed: values under
 * sensitive keys become "[redacted]", key-shaped substrings of every string are replaced, byte arrays
 * become their length, errors keep only their name. Never mutates its input (events hold live state).
 */
export function redactForInspector<T>(value: T): T {
  return walk(value, 0, []) as T;
}

export interface InspectorTransport {
  /** Called with each redacted inspection event as one JSON text message. */
  send(message: string): void;
}

export interface GatewayInspector {
  /** Pass to createActor({ inspect }) of every actor. */
  readonly inspect: (event: InspectionEvent) => void;
  /** Closes the socket and cancels reconnects; events after this are dropped. */
  stop(): void;
}

export interface InspectorOptions {
  log?: Log;
  /** Events kept while the inspector is unreachable (oldest dropped first). */
  maxBufferedEvents?: number;
  /** Delay before reconnecting after the socket closed or could not connect. */
  reconnectDelayMs?: number;
}

/**
 * Attaches a WebSocket inspector at `url` (ws:// or wss://). The gateway runs whether or not the
 * inspector is reachable: while it is not, events are buffered (bounded) and connection is retried.
 */
export function startInspector(url: string, options: InspectorOptions = {}): GatewayInspector {
  const maxBuffered = options.maxBufferedEvents ?? 500;
  const reconnectDelayMs = options.reconnectDelayMs ?? 2000;
  const log = options.log;
  const buffered: string[] = [];
  let ws: WebSocket | null = null;
  let retry: ReturnType<typeof setTimeout> | null = null;
  let stopped = false;
  let warned = false;

  const connect = () => {
    retry = null;
    if (stopped) return;
    const socket = new WebSocket(url);
    ws = socket;
    socket.onopen = () => {
      warned = false;
      log?.info("inspector_connected", { url });
      for (const message of buffered.splice(0)) socket.send(message);
    };
    socket.onclose = () => {
      if (ws !== socket) return;
      ws = null;
      if (stopped) return;
      if (!warned) log?.warn("inspector_unreachable", { url, retry_ms: reconnectDelayMs });
      warned = true;
      retry = setTimeout(connect, reconnectDelayMs);
    };
    socket.onerror = () => {}; // followed by close, which handles it
    socket.onmessage = () => {}; // the inspector protocol is one-way
  };

  const adapter = {
    send(event: StatelyInspectionEvent) {
      if (stopped) return;
      const message = JSON.stringify(redactForInspector(event));
      if (ws?.readyState === WebSocket.OPEN) return ws.send(message);
      buffered.push(message);
      if (buffered.length > maxBuffered) buffered.shift();
    },
  };
  const inspector = createInspector(adapter);
  connect();

  return {
    inspect: (event) => {
      if (!stopped) inspector.inspect.next?.(event);
    },
    stop() {
      stopped = true;
      if (retry !== null) clearTimeout(retry);
      retry = null;
      const socket = ws;
      ws = null;
      buffered.length = 0;
      socket?.close(1000, "gateway stopping");
    },
  };
}

const LOOPBACK = new Set(["127.0.0.1", "localhost", "::1", "[::1]", "0.0.0.0", "::", "[::]"]);

/**
 * Why `url` cannot be the inspector URL of a gateway listening on host:port, or null when it can:
 * it must be ws:// or wss://, and never the gateway's own port (the gateway is not an inspector).
 */
export function inspectorUrlProblem(url: string, gateway: { host: string; port: number }): string | null {
  if (!URL.canParse(url)) return `--inspect: ${JSON.stringify(url)} is not a URL`;
  const parsed = new URL(url);
  if (parsed.protocol !== "ws:" && parsed.protocol !== "wss:") return "--inspect: the URL must start with ws:// or wss://";
  const port = Number(parsed.port || (parsed.protocol === "wss:" ? 443 : 80));
  const sameHost = parsed.hostname === gateway.host || (LOOPBACK.has(parsed.hostname) && LOOPBACK.has(gateway.host));
  if (gateway.port !== 0 && port === gateway.port && sameHost) return `--inspect: ${url} is the gateway's own port; run the inspector elsewhere (default ws://127.0.0.1:8090)`;
  return null;
}
