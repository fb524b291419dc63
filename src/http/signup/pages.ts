// HTML of the sign-in and account pages and of browser-flow errors. Plain server-rendered forms, no
// script. Every interpolated value goes through `esc`. Buyer-facing text stays within docs/receipts.md: no
// claim of private inference, attestation or verified provider honesty.
import { errorTable, publicCode, type GatewayError } from "../errors.ts";
import type { ApiKeyRow, IdentityRow } from "../../store/index.ts";
import type { IdentityProvider } from "./idps.ts";

const ENTITIES: Record<string, string> = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
export const esc = (value: string): string => value.replace(/[&<>"']/g, (c) => ENTITIES[c]!);

export const PAGE_HEADERS: Record<string, string> = {
  "content-type": "text/html; charset=utf-8",
  // The account page can hold a key shown once: never cache it, never let the back button replay it.
  "cache-control": "no-store",
  "x-content-type-options": "nosniff",
  "referrer-policy": "no-referrer",
  "content-security-policy": "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
};

const STYLE = `body{font:16px/1.5 system-ui,sans-serif;max-width:52rem;margin:2rem auto;padding:0 1rem;color:#1d1d1f}
table{border-collapse:collapse;width:100%}td,th{text-align:left;padding:.3rem .5rem;border-bottom:1px solid #ddd}
code{background:#f3f3f3;padding:.1rem .3rem;border-radius:4px}.key{font-size:1.05rem;word-break:break-all}
.once{border:2px solid #c60;border-radius:6px;padding:.75rem 1rem;background:#fff8f0}form.inline{display:inline}`;

function layout(title: string, body: string): string {
  return `<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>${esc(title)}</title><style>${STYLE}</style></head><body>${body}</body></html>`;
}

export function htmlPage(title: string, body: string, status = 200, headers: Record<string, string> = {}): Response {
  return new Response(layout(title, body), { status, headers: { ...PAGE_HEADERS, ...headers } });
}

/** A browser-flow error: the status and code come from the one error table. */
export function htmlErrorPage(err: GatewayError, requestId: string, providers: readonly IdentityProvider[] = []): Response {
  const row = errorTable[err.code];
  const body = `<h1>Something went wrong</h1><p>${esc(err.message)}</p>${signInLinks(providers)}
<p><small>Error code <code>${esc(publicCode(err.code))}</code> · request id <code>${esc(requestId)}</code></small></p>`;
  return htmlPage("Error", body, row.status, { "x-request-id": requestId });
}

function signInLinks(providers: readonly IdentityProvider[]): string {
  if (providers.length === 0) return "";
  const items = providers.map((p) => `<li><a href="/auth/${esc(p.name)}/start">Sign in with ${esc(p.label)}</a></li>`).join("");
  return `<ul>${items}</ul>`;
}

export function signInPage(providers: readonly IdentityProvider[], requestId: string): Response {
  const body =
    providers.length === 0
      ? "<h1>Sign in</h1><p>Sign-up is not enabled on this gateway.</p>"
      : `<h1>Sign in</h1><p>Sign in or sign up with an identity provider to get an API key.</p>${signInLinks(providers)}`;
  return htmlPage("Sign in", body, errorTable.signin_required.status, { "x-request-id": requestId });
}

const when = (ms: number | null): string => (ms === null ? "never" : new Date(ms).toISOString().replace(/\.\d+Z$/, "Z"));

export interface AccountView {
  accountId: string;
  identities: IdentityRow[];
  keys: ApiKeyRow[];
  /** A key issued by the previous action, shown now and never again. */
  newKey: string | null;
  csrf: string;
  baseUrl: string;
  requestId: string;
}

export function accountPage(view: AccountView): Response {
  const csrf = `<input type="hidden" name="csrf" value="${esc(view.csrf)}">`;
  const reveal = view.newKey
    ? `<div class="once"><p><strong>Your new API key</strong> — copy it now: it is shown only this once and cannot be shown again
(the gateway keeps only a hash of it).</p><p class="key"><code id="new-api-key">${esc(view.newKey)}</code></p>
<p>Use it as a bearer token with any OpenAI-compatible client: base URL <code>${esc(view.baseUrl)}/v1</code>.</p></div>`
    : "";
  const rows = view.keys
    .map((k) => {
      const live = k.revoked_at_ms === null;
      const actions = live
        ? `<form class="inline" method="post" action="/account/keys/${esc(k.key_id)}/rotate">${csrf}<button>Rotate</button></form>
<form class="inline" method="post" action="/account/keys/${esc(k.key_id)}/revoke">${csrf}<button>Revoke</button></form>`
        : "";
      return `<tr data-key-id="${esc(k.key_id)}"><td><code>${esc(k.display_prefix)}…</code></td><td>${esc(k.label ?? "")}</td>
<td>${when(k.created_at_ms)}</td><td>${when(k.last_used_at_ms)}</td><td>${live ? "active" : `revoked ${when(k.revoked_at_ms)}`}</td><td>${actions}</td></tr>`;
    })
    .join("");
  const who = view.identities.map((i) => `${esc(i.email ?? i.subject)} (${esc(i.idp)})`).join(", ");
  const body = `<h1>Your account</h1><p>Account <code>${esc(view.accountId)}</code>${who ? ` · signed in as ${who}` : ""}</p>${reveal}
<h2>API keys</h2><table><thead><tr><th>Key</th><th>Label</th><th>Created</th><th>Last used</th><th>Status</th><th></th></tr></thead>
<tbody>${rows || '<tr><td colspan="6">No keys.</td></tr>'}</tbody></table>
<p>Rotating issues a new key (shown once) and revokes the old one at the same moment.</p>
<form method="post" action="/account/keys">${csrf}<button>Create a new key</button></form>
<p>Prompts and outputs are processed as plain text on provider machines.</p>
<form method="post" action="/account/logout">${csrf}<button>Sign out</button></form>`;
  return htmlPage("Your account", body, 200, { "x-request-id": view.requestId });
}
