// The operator console's HTTP surface at /console (docs/console.md): the page and its assets, the login
// form, the data endpoints (JSON and a server-sent event stream) and the operator actions. Every data
// endpoint and action answers 401 without the operator token (Bearer) or a console session (cookie);
// actions with a cookie also need the session's CSRF token.
import type { Log } from "../log.ts";
import type { ConsoleAuth, Principal } from "./auth.ts";
import { MACHINES, machineCharts, type MachineName } from "./charts.ts";
import type { ConsoleLive } from "./live.ts";
import { ASSETS, pageHtml, loginHtml } from "./page.ts";

export const CONSOLE_PATH = "/console";

export type ConsoleActionName = "ban" | "unban" | "pin" | "drain" | "revokeKey";
export type ActionResult = { ok: true; detail: string } | { ok: false; status: number; message: string };

export interface ConsoleActions {
  ban(providerId: string): Promise<ActionResult>;
  unban(providerId: string): Promise<ActionResult>;
  pin(providerId: string): Promise<ActionResult>;
  drain(providerId: string): Promise<ActionResult>;
  revokeKey(keyId: string): Promise<ActionResult>;
}

export interface ConsoleDeps {
  auth: ConsoleAuth;
  live: ConsoleLive;
  actions: ConsoleActions;
  log: Log;
  /** How often the stream sends the state (ms). */
  intervalMs?: number;
}

const SECURITY_HEADERS = {
  "content-security-policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
  "x-content-type-options": "nosniff",
  // same-origin, not no-referrer: with no-referrer, Chromium sends `Origin: null` on the login form's POST.
  "referrer-policy": "same-origin",
  "cache-control": "no-store",
};

const ID = /^[A-Za-z0-9._:#-]{1,128}$/;

const json = (body: unknown, status = 200, headers: Record<string, string> = {}) =>
  new Response(JSON.stringify(body), { status, headers: { ...SECURITY_HEADERS, "content-type": "application/json", ...headers } });
const html = (body: string, status = 200, headers: Record<string, string> = {}) =>
  new Response(body, { status, headers: { ...SECURITY_HEADERS, "content-type": "text/html; charset=utf-8", ...headers } });
const unauthorized = (request: Request) =>
  request.headers.get("accept")?.includes("text/html")
    ? html(loginHtml(null), 401, { "www-authenticate": 'Bearer realm="console"' })
    : json({ error: { code: "unauthorized", message: "The console needs the operator token (Authorization: Bearer) or a console session." } }, 401, { "www-authenticate": 'Bearer realm="console"' });

export function createConsoleHandler(deps: ConsoleDeps) {
  const { auth, live, log } = deps;
  const intervalMs = deps.intervalMs ?? 1000;
  const streams = new Set<ReadableStreamDefaultController<Uint8Array>>();
  const encoder = new TextEncoder();
  let timer: ReturnType<typeof setInterval> | null = null;

  // One tick a second while any console is connected (none: the gateway does no console work at all).
  const pump = async () => {
    live.tick();
    const frame = encoder.encode(`event: state\ndata: ${JSON.stringify(await live.state())}\n\n`);
    for (const c of streams) {
      try {
        c.enqueue(frame);
      } catch {
        streams.delete(c);
      }
    }
    if (streams.size === 0 && timer !== null) {
      clearInterval(timer);
      timer = null;
    }
  };

  function stream(): Response {
    let controller: ReadableStreamDefaultController<Uint8Array>;
    const body = new ReadableStream<Uint8Array>({
      start(c) {
        controller = c;
        streams.add(c);
        timer ??= setInterval(() => void pump().catch((error) => log.warn("console_stream_failed", { error: String(error) })), intervalMs);
        void live.state().then((s) => c.enqueue(encoder.encode(`event: state\ndata: ${JSON.stringify(s)}\n\n`)), () => {});
      },
      cancel() {
        streams.delete(controller);
      },
    });
    return new Response(body, { headers: { ...SECURITY_HEADERS, "content-type": "text/event-stream", connection: "keep-alive" } });
  }

  async function act(request: Request, who: Principal): Promise<Response> {
    if (!auth.sameSiteIntent(request, who)) return json({ error: { code: "csrf", message: "Missing or wrong X-CSRF-Token, or another origin." } }, 403);
    let body: { action?: unknown; providerId?: unknown; keyId?: unknown };
    try {
      body = (await request.json()) as typeof body;
    } catch {
      return json({ error: { code: "invalid_request", message: "Expected a JSON body." } }, 400);
    }
    const action = body.action;
    const target = action === "revokeKey" ? body.keyId : body.providerId;
    if (typeof action !== "string" || !["ban", "unban", "pin", "drain", "revokeKey"].includes(action)) {
      return json({ error: { code: "invalid_request", message: "action must be ban, unban, pin, drain or revokeKey." } }, 400);
    }
    if (typeof target !== "string" || !ID.test(target)) return json({ error: { code: "invalid_request", message: "A providerId (or keyId for revokeKey) is required." } }, 400);
    const result = await deps.actions[action as ConsoleActionName](target);
    log.info("console_action", { action, target, by: auth.actor(who), ok: result.ok, ...(result.ok ? { detail: result.detail } : { error: result.message }) });
    return result.ok ? json({ ok: true, detail: result.detail }) : json({ error: { code: "action_failed", message: result.message } }, result.status);
  }

  /** Handles a request under /console; null when the path is not the console's. */
  return async function handle(request: Request): Promise<Response | null> {
    const url = new URL(request.url);
    const path = url.pathname;
    if (path !== CONSOLE_PATH && !path.startsWith(`${CONSOLE_PATH}/`)) return null;
    const method = request.method;

    // Assets hold no data: the login form needs them too.
    if (path.startsWith(`${CONSOLE_PATH}/assets/`) && method === "GET") {
      const asset = ASSETS[path.slice(`${CONSOLE_PATH}/assets/`.length)];
      if (!asset) return new Response("not found", { status: 404 });
      return new Response(Bun.file(asset.file), { headers: { ...SECURITY_HEADERS, "cache-control": "public, max-age=300", "content-type": asset.type } });
    }
    if (path === `${CONSOLE_PATH}/login` && method === "POST") {
      const origin = request.headers.get("origin");
      if (origin !== null && origin !== url.origin) return html(loginHtml("Sign in from the console's own page."), 403);
      const form = await request.formData().catch(() => null);
      const candidate = form?.get("token");
      const session = typeof candidate === "string" ? auth.login(candidate.trim()) : null;
      if (!session) {
        log.warn("console_login_refused", {});
        return html(loginHtml("That is not the operator token."), 401);
      }
      log.info("console_login", { by: auth.actor({ via: "session", sessionId: session.sessionId, csrf: "" }) });
      const secure = url.protocol === "https:" ? "; Secure" : "";
      return new Response(null, { status: 303, headers: { ...SECURITY_HEADERS, location: CONSOLE_PATH, "set-cookie": session.cookie + secure } });
    }

    const who = auth.principal(request);
    if (!who) return unauthorized(request);

    if ((path === CONSOLE_PATH || path === `${CONSOLE_PATH}/`) && method === "GET") return html(pageHtml(who.via === "session" ? who.csrf : ""));
    if (path === `${CONSOLE_PATH}/logout` && method === "POST") {
      if (!auth.sameSiteIntent(request, who)) return json({ error: { code: "csrf", message: "Missing or wrong X-CSRF-Token." } }, 403);
      return new Response(null, { status: 204, headers: { ...SECURITY_HEADERS, "set-cookie": auth.logout(who) } });
    }
    if (path === `${CONSOLE_PATH}/api/state` && method === "GET") return json(await live.state());
    if (path === `${CONSOLE_PATH}/api/machines` && method === "GET") return json(await machineCharts());
    if (path === `${CONSOLE_PATH}/api/stream` && method === "GET") return stream();
    if (path === `${CONSOLE_PATH}/api/actor` && method === "GET") {
      const machine = url.searchParams.get("machine") ?? "";
      const state = url.searchParams.get("state") ?? machine;
      if (!Object.hasOwn(MACHINES, machine)) return json({ error: { code: "invalid_request", message: "Unknown machine." } }, 400);
      const found = live.actorIn(machine as MachineName, state);
      return found ? json(found) : json({ error: { code: "not_found", message: "No live actor in that state right now." } }, 404);
    }
    if (path === `${CONSOLE_PATH}/api/actions` && method === "POST") return act(request, who);
    return json({ error: { code: "not_found", message: "No such console endpoint." } }, 404);
  };
}

export type ConsoleHandler = ReturnType<typeof createConsoleHandler>;
