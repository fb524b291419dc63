// The browser demo page: plain HTML and one script, no build step. The page asks for a demo session
// only when the first prompt is sent and keeps its token in sessionStorage, so reloading does not spend
// the visitor's hourly allowance. Answers stream into a chat-like transcript; a refusal says when to
// come back, disables Send, and says how to get a key.
// Buyer-facing text: prompts are plaintext on provider machines — say so, promise nothing more.

/** What the operator runs to give someone a key when sign-up is off (docs/operator.md). */
export const OPERATOR_KEY_COMMAND = "gateway accounts create --tier free --name NAME";

export interface DemoPageOptions {
  /** An identity provider is configured: /account signs people up. */
  signupEnabled: boolean;
}

export function demoPageHtml(options: DemoPageOptions): string {
  const getKey = options.signupEnabled
    ? `For regular use, <a id="get-key" href="/account">sign up for an API key</a>.`
    : `For regular use you need an API key. Sign-up is not enabled on this gateway: ask its operator, who runs
<code id="get-key">${OPERATOR_KEY_COMMAND}</code> to create one.`;
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Gateway demo</title>
<style>
  body { font: 16px/1.5 system-ui, sans-serif; max-width: 46rem; margin: 2rem auto; padding: 0 1rem; color: #1d1d1f; }
  textarea { width: 100%; min-height: 4rem; font: inherit; box-sizing: border-box; }
  #transcript { display: flex; flex-direction: column; gap: .75rem; margin: 1rem 0; }
  .turn { white-space: pre-wrap; border-radius: 10px; padding: .6rem .8rem; max-width: 85%; }
  .turn.user { align-self: flex-end; background: #e8f0fe; }
  .turn.assistant { align-self: flex-start; background: #f3f3f3; }
  .turn.assistant.error { background: #fdecea; color: #8a1c10; }
  .usage { display: block; color: #666; font-size: .8rem; margin-top: .3rem; white-space: normal; }
  #status { color: #555; font-size: .9rem; }
  #refusal { background: #fff4e5; border-radius: 6px; padding: .6rem .8rem; }
  .note { color: #555; font-size: .9rem; }
</style>
</head>
<body>
<h1>Try the gateway</h1>
<p class="note">Demo sessions are limited per network address (a few sessions per hour, a small daily token
allowance). Your prompt is processed as plain text on a provider's machine: do not type anything private.
${getKey}</p>
<div id="transcript" aria-live="polite"></div>
<p id="refusal" hidden></p>
<form id="ask">
  <label>Model <select id="model"><option value="">loading…</option></select></label>
  <p><textarea id="prompt" required>Say hello in one sentence.</textarea></p>
  <button id="send" type="submit">Send</button>
</form>
<p id="status" data-state="idle">Loading the models…</p>
<script src="/demo/app.js" defer></script>
</body>
</html>
`;
}

export const DEMO_PAGE_SCRIPT = `"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const status = (state, text) => { $("status").dataset.state = state; $("status").textContent = text; };
  const STORED = "gateway-demo-session";

  // A live token from an earlier load of this tab is reused; a new one is asked for only when needed.
  function storedToken() {
    try {
      const saved = JSON.parse(sessionStorage.getItem(STORED) || "null");
      if (saved && saved.token && saved.expires_at * 1000 > Date.now() + 5000) return saved.token;
    } catch {}
    return null;
  }
  let token = storedToken();

  /** A refusal the visitor can act on: what happened, and when to come back (a local time). */
  class Refusal extends Error {
    constructor(message, retryAt) { super(message); this.retryAt = retryAt; }
  }

  async function errorOf(response) {
    let message = response.statusText;
    try { const body = await response.json(); if (body.error && body.error.message) message = body.error.message; } catch {}
    if (response.status !== 429) return new Error(message);
    const seconds = Number(response.headers.get("retry-after"));
    const reset = Number(response.headers.get("x-ratelimit-reset"));
    const retryAt = new Date(seconds > 0 ? Date.now() + seconds * 1000 : reset > 0 ? reset * 1000 : Date.now() + 3600000);
    return new Refusal(message, retryAt);
  }

  async function newSession() {
    const response = await fetch("/auth/demo-session", { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
    if (!response.ok) throw await errorOf(response);
    const session = await response.json();
    token = session.token;
    try { sessionStorage.setItem(STORED, JSON.stringify({ token: session.token, expires_at: session.expires_at })); } catch {}
  }

  // One call with the demo token; on invalid_demo_token (expired, or the network address changed) the
  // session is refreshed once, as the error message advises.
  async function call(path, init) {
    for (let attempt = 0; ; attempt++) {
      if (!token) await newSession();
      const headers = Object.assign({ authorization: "Bearer " + token }, init && init.headers);
      const response = await fetch(path, Object.assign({}, init, { headers }));
      if (response.status !== 401 || attempt > 0) return response;
      const body = await response.clone().json().catch(() => ({}));
      if (!body.error || body.error.code !== "invalid_demo_token") return response;
      token = null;
      try { sessionStorage.removeItem(STORED); } catch {}
    }
  }

  // The list needs no session: with a live token it is /v1/models (what a request can reach), without
  // one the public /v1/status (models warm on some provider), so loading the page spends nothing.
  async function loadModels() {
    const response = token ? await call("/v1/models") : await fetch("/v1/status");
    if (!response.ok) throw await errorOf(response);
    const body = await response.json();
    const ids = token ? (body.data || []).map((m) => m.id) : (body.models || []).map((m) => m.id);
    const select = $("model");
    select.textContent = "";
    for (const id of ids) {
      const option = document.createElement("option");
      option.value = option.textContent = id;
      select.appendChild(option);
    }
    if (ids.length === 0) throw new Error("No model is available right now. Try again in a minute.");
  }

  // Server-sent events: events end with a blank line; each "data: " line carries one JSON chunk, the
  // last one "[DONE]". An in-band {"error": …} chunk ends a stream that failed after it started.
  async function stream(response, onText, onUsage) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffered = "";
    for (;;) {
      const { done, value } = await reader.read();
      if (done) throw new Error("The answer ended early. Send the prompt again.");
      buffered += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffered.indexOf("\\n\\n")) >= 0) {
        const event = buffered.slice(0, end);
        buffered = buffered.slice(end + 2);
        for (const line of event.split("\\n")) {
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") return;
          const chunk = JSON.parse(data);
          if (chunk.error) throw new Error(chunk.error.message);
          const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
          if (delta && delta.content) onText(delta.content);
          if (chunk.usage) onUsage(chunk.usage);
        }
      }
    }
  }

  function turn(role, text) {
    const element = document.createElement("div");
    element.className = "turn " + role;
    element.textContent = text;
    $("transcript").appendChild(element);
    return element;
  }

  // Send stays off until the time the gateway named; the page says that time in words.
  function refuse(refusal) {
    const at = refusal.retryAt.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
    const box = $("refusal");
    box.hidden = false;
    // The gateway's first sentence says what ran out; the rest of its message names headers for API users.
    box.textContent = refusal.message.split(/(?<=\\.)\\s/)[0] + " You can send again at " + at + " (your time). ";
    const getKey = $("get-key");
    if (getKey && getKey.tagName === "A") {
      const link = document.createElement("a");
      link.href = getKey.getAttribute("href");
      link.textContent = "Get an API key to keep going now.";
      box.appendChild(link);
    } else {
      box.appendChild(document.createTextNode("For more, ask this gateway's operator for an API key."));
    }
    box.dataset.retryAt = refusal.retryAt.toISOString();
    $("send").disabled = true;
    status("refused", "Refused until " + at + ".");
    setTimeout(() => { box.hidden = true; $("send").disabled = false; status("ready", "Ready."); }, Math.max(0, refusal.retryAt.getTime() - Date.now()));
  }

  async function ask(event) {
    event.preventDefault();
    const prompt = $("prompt").value;
    $("send").disabled = true;
    turn("user", prompt);
    const answer = turn("assistant", "");
    answer.dataset.state = "streaming";
    status("streaming", "Streaming…");
    let refused = null;
    try {
      const response = await call("/v1/chat/completions", {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: $("model").value, messages: [{ role: "user", content: prompt }], stream: true, stream_options: { include_usage: true }, max_tokens: 256 }),
      });
      if (!response.ok) throw await errorOf(response);
      const text = document.createTextNode("");
      answer.appendChild(text);
      await stream(response, (piece) => { text.data += piece; }, (usage) => {
        const line = document.createElement("span");
        line.className = "usage";
        line.textContent = usage.prompt_tokens + " prompt + " + usage.completion_tokens + " answer tokens";
        answer.appendChild(line);
      });
      answer.dataset.state = "done";
      status("done", "Done.");
    } catch (error) {
      answer.classList.add("error");
      answer.dataset.state = "error";
      answer.appendChild(document.createTextNode((answer.textContent ? "\\n" : "") + String(error && error.message ? error.message : error)));
      if (error instanceof Refusal) refused = error;
      else status("error", "The last answer failed; see above.");
    } finally {
      if (refused) refuse(refused);
      else $("send").disabled = false;
    }
  }

  $("ask").addEventListener("submit", ask);
  loadModels()
    .then(() => status("ready", "Ready."))
    .catch((error) => status("error", String(error && error.message ? error.message : error)));
})();
`;
