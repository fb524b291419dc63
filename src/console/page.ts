// The console's page, login form and static assets. uPlot and elkjs come from their npm packages and the page's own
// script and stylesheet from src/console/assets; all are embedded with `type: "file"` (so the single
// binary has them too) and served by the gateway: the console needs no CDN and no internet.
// @ts-expect-error -- a plain JavaScript asset imported as a file path, not as a module
import uplotJs from "../../node_modules/uplot/dist/uPlot.iife.min.js" with { type: "file" };
// @ts-expect-error -- a stylesheet imported as a file path
import uplotCss from "../../node_modules/uplot/dist/uPlot.min.css" with { type: "file" };
// (typed by elkjs as the module; with `type: "file"` the import is the file's path)
import elkBundle from "../../node_modules/elkjs/lib/elk.bundled.js" with { type: "file" };
// @ts-expect-error -- a plain JavaScript asset imported as a file path, not as a module
import elkWorkerJs from "../../node_modules/elkjs/lib/elk-worker.min.js" with { type: "file" };
// @ts-expect-error -- a plain JavaScript asset imported as a file path, not as a module
import consoleJs from "./assets/console.js" with { type: "file" };
// @ts-expect-error -- a stylesheet imported as a file path
import consoleCss from "./assets/console.css" with { type: "file" };

export const ASSETS: Record<string, { file: string; type: string }> = {
  "uPlot.js": { file: uplotJs, type: "text/javascript; charset=utf-8" },
  "uPlot.css": { file: uplotCss, type: "text/css; charset=utf-8" },
  "elk.js": { file: elkBundle as unknown as string, type: "text/javascript; charset=utf-8" },
  "elk-worker.js": { file: elkWorkerJs, type: "text/javascript; charset=utf-8" },
  "console.js": { file: consoleJs, type: "text/javascript; charset=utf-8" },
  "console.css": { file: consoleCss, type: "text/css; charset=utf-8" },
};

const escape = (text: string) => text.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

const head = (title: string) => `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>${title}</title><link rel="icon" href="data:,"><link rel="stylesheet" href="/console/assets/uPlot.css"><link rel="stylesheet" href="/console/assets/console.css"></head>`;

/** The console itself; the page's data arrives over /console/api/stream. `csrf`: the session's token ("" for Bearer). */
export function pageHtml(csrf: string): string {
  return `${head("Gateway console")}
<body>
<header class="top">
  <div class="brand"><span class="dot" id="live-dot"></span> Gateway console</div>
  <div class="kpis" id="kpis"></div>
  <form id="logout" class="logout"><button type="submit">Sign out</button></form>
</header>
<main>
  <section class="charts" id="charts"></section>
  <section class="panel"><h2>Actors <small>live count of actors in each state — click a state to follow one actor</small></h2><div id="machines" class="machines"></div></section>
  <section class="panel"><h2>Providers</h2><div id="providers"></div></section>
  <div class="two">
    <section class="panel"><h2>Requests in flight</h2><div id="requests"></div></section>
    <section class="panel"><h2>Money and settlement</h2><div id="ledger"></div>
      <form id="revoke" class="revoke"><label>Revoke an API key <input id="revoke-key" placeholder="key id" autocomplete="off" spellcheck="false"></label><button type="submit" class="danger">Revoke</button></form>
    </section>
  </div>
</main>
<aside id="actor" class="drawer" hidden></aside>
<div id="toast" class="toast" hidden></div>
<meta name="csrf-token" content="${escape(csrf)}">
<script src="/console/assets/uPlot.js"></script>
<script src="/console/assets/elk.js"></script>
<script src="/console/assets/console.js"></script>
</body></html>`;
}

/** The login form (also the body of a 401 for browsers): it never holds data. */
export function loginHtml(message: string | null): string {
  return `${head("Gateway console — sign in")}
<body class="login">
<form method="post" action="/console/login" class="login-box">
  <h1>Gateway console</h1>
  <p>Paste the operator token (<code>gateway console token</code> prints it).</p>
  ${message ? `<p class="error">${escape(message)}</p>` : ""}
  <input type="password" name="token" autocomplete="current-password" autofocus required aria-label="operator token">
  <button type="submit">Sign in</button>
</form>
</body></html>`;
}
