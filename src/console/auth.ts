// Who may use the operator console (docs/console.md): the holder of the operator token. Scripts send it
// as `Authorization: Bearer`; browsers trade it once, through the login form, for a session cookie
// (HttpOnly, SameSite=Strict, path /console) that carries no token. State-changing requests with the
// cookie also need the session's CSRF token (a header the page sends) and a same-origin Origin. The
// token itself is compared by SHA-256 digest in constant time and is never logged or echoed.
import { createHash, randomBytes, timingSafeEqual } from "node:crypto";

export const SESSION_COOKIE = "gw_console";
const SESSION_TTL_MS = 12 * 60 * 60 * 1000;
const MAX_SESSIONS = 1_000;

export type Principal = { via: "bearer" } | { via: "session"; sessionId: string; csrf: string };

interface Session {
  csrf: string;
  expiresAt: number;
}

const digest = (text: string) => createHash("sha256").update(text).digest();
const newSecret = () => randomBytes(32).toString("base64url");

/** The operator token: the configured one, else the one stored in the gateway's database. */
export async function operatorToken(configured: string | undefined, stored: () => Promise<Uint8Array>): Promise<string> {
  return configured && configured.length > 0 ? configured : Buffer.from(await stored()).toString("base64url");
}

function cookieValue(header: string | null, name: string): string | null {
  if (!header) return null;
  for (const part of header.split(";")) {
    const eq = part.indexOf("=");
    if (eq > 0 && part.slice(0, eq).trim() === name) return part.slice(eq + 1).trim();
  }
  return null;
}

export function createConsoleAuth(token: string, now: () => number = Date.now) {
  const tokenDigest = digest(token);
  const sessions = new Map<string, Session>();

  const tokenMatches = (candidate: string): boolean => timingSafeEqual(digest(candidate), tokenDigest);

  /** The principal of a request, or null (answer 401). */
  function principal(request: Request): Principal | null {
    const auth = request.headers.get("authorization");
    if (auth !== null) {
      const m = /^Bearer\s+(\S+)\s*$/i.exec(auth);
      return m && tokenMatches(m[1]!) ? { via: "bearer" } : null;
    }
    const id = cookieValue(request.headers.get("cookie"), SESSION_COOKIE);
    if (id === null) return null;
    const session = sessions.get(id);
    if (!session) return null;
    if (session.expiresAt <= now()) {
      sessions.delete(id);
      return null;
    }
    return { via: "session", sessionId: id, csrf: session.csrf };
  }

  /**
   * Whether a state-changing request of `who` is not a cross-site forgery: a Bearer request cannot be
   * forged (browsers never add the header on their own); a cookie one must carry the session's CSRF
   * token in `X-CSRF-Token` and, when the browser sends an Origin, come from the console's own origin.
   */
  function sameSiteIntent(request: Request, who: Principal): boolean {
    if (who.via === "bearer") return true;
    const origin = request.headers.get("origin");
    if (origin !== null && origin !== new URL(request.url).origin) return false;
    const sent = request.headers.get("x-csrf-token") ?? "";
    return sent.length === who.csrf.length && timingSafeEqual(Buffer.from(sent), Buffer.from(who.csrf));
  }

  /** Trades the token for a session; null when the token is wrong. */
  function login(candidate: string): { cookie: string; sessionId: string } | null {
    if (!tokenMatches(candidate)) return null;
    const t = now();
    for (const [id, s] of sessions) if (s.expiresAt <= t || sessions.size >= MAX_SESSIONS) sessions.delete(id);
    const sessionId = newSecret();
    sessions.set(sessionId, { csrf: newSecret(), expiresAt: t + SESSION_TTL_MS });
    return { sessionId, cookie: `${SESSION_COOKIE}=${sessionId}; HttpOnly; SameSite=Strict; Path=/console; Max-Age=${SESSION_TTL_MS / 1000}` };
  }

  function logout(who: Principal): string {
    if (who.via === "session") sessions.delete(who.sessionId);
    return `${SESSION_COOKIE}=; HttpOnly; SameSite=Strict; Path=/console; Max-Age=0`;
  }

  /** Who did something, for the log: never the token, never a whole session id. */
  const actor = (who: Principal): string => (who.via === "bearer" ? "bearer" : `session:${digest(who.sessionId).toString("hex").slice(0, 8)}`);

  return { principal, sameSiteIntent, login, logout, actor };
}

export type ConsoleAuth = ReturnType<typeof createConsoleAuth>;
