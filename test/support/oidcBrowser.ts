// Sign-up test support: a fetch-driven "browser" (manual redirects, a cookie jar keyed like a real
// browser's — host-only cookies are shared across ports of one host), the local oidc-provider child
// process, and the scripted login at its development interaction pages.
import { join } from "node:path";
import { type GatewayConfig } from "../../src/config/index.ts";
import { createLog } from "../../src/log.ts";
import { startTestGateway, type TestGateway } from "./harness.ts";

interface StoredCookie {
  value: string;
  path: string;
  expiresAt: number | null;
}

export class Browser {
  private readonly jar = new Map<string, Map<string, StoredCookie>>();

  /** One request, redirects not followed; cookies sent and stored like a browser does. */
  async request(url: string, init: RequestInit = {}): Promise<Response> {
    const target = new URL(url);
    const headers = new Headers(init.headers);
    const cookie = this.cookieHeader(target);
    if (cookie) headers.set("cookie", cookie);
    const response = await fetch(target, { ...init, headers, redirect: "manual" });
    for (const line of response.headers.getSetCookie()) this.store(target, line);
    return response;
  }

  get(url: string): Promise<Response> {
    return this.request(url);
  }

  postForm(url: string, fields: Record<string, string>, headers: Record<string, string> = {}): Promise<Response> {
    return this.request(url, {
      method: "POST",
      headers: { "content-type": "application/x-www-form-urlencoded", ...headers },
      body: new URLSearchParams(fields).toString(),
    });
  }

  /** GETs `url` and follows redirects while `until` is false; returns the last URL and response. */
  async follow(url: string, until: (url: string) => boolean = () => false, maxHops = 10): Promise<{ url: string; response: Response }> {
    let current = url;
    for (let hop = 0; hop <= maxHops; hop++) {
      if (hop > 0 && until(current)) return { url: current, response: new Response(null, { status: 204 }) };
      const response = await this.get(current);
      const location = response.headers.get("location");
      if (response.status < 300 || response.status >= 400 || !location) return { url: current, response };
      await response.body?.cancel();
      current = new URL(location, current).href;
    }
    throw new Error(`too many redirects from ${url}`);
  }

  cookie(url: string, name: string): string | undefined {
    return this.jar.get(new URL(url).hostname)?.get(name)?.value;
  }

  private cookieHeader(url: URL): string {
    const now = Date.now();
    const found: string[] = [];
    for (const [name, c] of this.jar.get(url.hostname) ?? []) {
      if (c.expiresAt !== null && c.expiresAt <= now) continue;
      if (url.pathname === c.path || url.pathname.startsWith(c.path.endsWith("/") ? c.path : `${c.path}/`)) found.push(`${name}=${c.value}`);
    }
    return found.join("; ");
  }

  private store(url: URL, line: string): void {
    const [pair, ...attributes] = line.split(";");
    const eq = pair!.indexOf("=");
    const name = pair!.slice(0, eq).trim();
    const value = pair!.slice(eq + 1).trim();
    let path = url.pathname.slice(0, url.pathname.lastIndexOf("/")) || "/";
    let expiresAt: number | null = null;
    for (const attribute of attributes) {
      const [k, v = ""] = attribute.split("=").map((s) => s.trim());
      const key = k!.toLowerCase();
      if (key === "path" && v.startsWith("/")) path = v;
      else if (key === "max-age") expiresAt = Date.now() + Number(v) * 1000;
      else if (key === "expires" && expiresAt === null) expiresAt = Date.parse(v);
    }
    const host = this.jar.get(url.hostname) ?? new Map<string, StoredCookie>();
    this.jar.set(url.hostname, host);
    if (expiresAt !== null && expiresAt <= Date.now()) host.delete(name);
    else host.set(name, { value, path, expiresAt });
  }
}

/** A free loopback TCP port (bound and released: the caller uses it right away). */
export function freePort(): number {
  const server = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => new Response(null) });
  const port = server.port!;
  server.stop(true);
  return port;
}

export interface LocalIdp {
  issuer: string;
  proc: ReturnType<typeof Bun.spawn>;
  stop(): Promise<void>;
}

/** Starts test/support/oidcProvider.ts as a child process and waits until it listens. */
export async function startLocalIdp(options: {
  port: number;
  clients: { client_id: string; client_secret: string; redirect_uris: string[] }[];
}): Promise<LocalIdp> {
  const proc = Bun.spawn(["bun", join(import.meta.dir, "oidcProvider.ts"), JSON.stringify(options)], { stdout: "pipe", stderr: "pipe" });
  const reader = (proc.stdout as ReadableStream<Uint8Array>).getReader();
  const decoder = new TextDecoder();
  let buffered = "";
  const deadline = Date.now() + 15_000;
  while (!buffered.includes("\n")) {
    if (Date.now() > deadline) throw new Error("oidc-provider did not start");
    const { done, value } = await reader.read();
    if (done) throw new Error(`oidc-provider exited: ${await new Response(proc.stderr as ReadableStream).text()}`);
    buffered += decoder.decode(value, { stream: true });
  }
  reader.releaseLock();
  const ready = JSON.parse(buffered.slice(0, buffered.indexOf("\n"))) as { issuer: string };
  return {
    issuer: ready.issuer,
    proc,
    async stop() {
      proc.kill("SIGTERM");
      await proc.exited;
    },
  };
}

/**
 * Plays the user at the local IdP: from an authorization URL, logs in as `login` and consents,
 * following redirects until the IdP sends the browser to a URL starting with `stopAt` (the gateway's
 * callback). Returns that URL without visiting it, or the IdP's final response when it never does.
 */
export async function loginAtIdp(
  browser: Browser,
  authorizationUrl: string,
  login: string,
  stopAt: string,
): Promise<{ callbackUrl: string } | { callbackUrl: null; response: Response }> {
  let url = authorizationUrl;
  for (let step = 0; step < 6; step++) {
    const { url: last, response } = await browser.follow(url, (u) => u.startsWith(stopAt));
    if (last.startsWith(stopAt)) return { callbackUrl: last };
    const html = response.status === 200 ? await response.text() : "";
    const prompt = /name="prompt" value="(login|consent)"/.exec(html)?.[1];
    const action = /<form[^>]*action="([^"]+)"/.exec(html)?.[1];
    if (!prompt || !action) return { callbackUrl: null, response: new Response(html || response.body, { status: response.status }) };
    const fields: Record<string, string> = prompt === "login" ? { prompt, login, password: "any" } : { prompt };
    const submitted = await browser.postForm(new URL(action, last).href, fields);
    const next = submitted.headers.get("location");
    await submitted.body?.cancel();
    if (!next) return { callbackUrl: null, response: submitted };
    url = new URL(next, last).href;
  }
  throw new Error("the IdP login did not finish");
}

/** The API key the account page shows once, or null when it shows none. */
export function shownApiKey(html: string): string | null {
  return /<code id="new-api-key">([^<]+)<\/code>/.exec(html)?.[1] ?? null;
}

/** Like startTestGateway, but keeps the gateway's log lines, so tests can check why it refused. */
export async function startLoggingGateway(overrides: Partial<GatewayConfig>): Promise<TestGateway & { logs: Record<string, unknown>[] }> {
  const logs: Record<string, unknown>[] = [];
  const log = createLog("info", (line) => logs.push(JSON.parse(line) as Record<string, unknown>));
  return { ...(await startTestGateway({ logLevel: "info", ...overrides }, { log })), logs };
}

/** The reason of the last `signin_refused` log line. */
export function lastRefusal(logs: readonly Record<string, unknown>[]): string {
  const found = logs.findLast((l) => l.event === "signin_refused");
  return typeof found?.reason === "string" ? found.reason : "";
}
