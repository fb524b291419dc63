// The browser demo page: plain HTML and one script, no build step. The script gets a demo session,
// lists the models, and streams a chat answer with fetch + server-sent-event parsing.
// Buyer-facing text: prompts are plaintext on provider machines — say so, promise nothing more.

export const DEMO_PAGE_HTML = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Gateway demo</title>
<style>
  body { font: 16px/1.5 system-ui, sans-serif; max-width: 46rem; margin: 2rem auto; padding: 0 1rem; color: #1d1d1f; }
  textarea { width: 100%; min-height: 5rem; font: inherit; }
  #answer { white-space: pre-wrap; border: 1px solid #ccc; border-radius: 6px; padding: .75rem; min-height: 4rem; }
  #status { color: #555; font-size: .9rem; }
  .note { color: #555; font-size: .9rem; }
</style>
</head>
<body>
<h1>Try the gateway</h1>
<p class="note">Demo sessions are limited per network address (a few sessions per hour, a small daily token
allowance). Your prompt is processed as plain text on a provider's machine: do not type anything private.
For regular use, sign up for an API key.</p>
<form id="ask">
  <label>Model <select id="model"><option value="">loading…</option></select></label>
  <p><textarea id="prompt" required>Say hello in one sentence.</textarea></p>
  <button id="send" type="submit">Send</button>
</form>
<p id="status" data-state="idle">Getting a demo session…</p>
<div id="answer" aria-live="polite"></div>
<script src="/demo/app.js" defer></script>
</body>
</html>
`;

export const DEMO_PAGE_SCRIPT = `"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const status = (state, text) => { $("status").dataset.state = state; $("status").textContent = text; };
  let token = null;

  async function errorMessage(response) {
    try { const body = await response.json(); return body.error && body.error.message ? body.error.message : response.statusText; }
    catch { return response.statusText; }
  }

  async function newSession() {
    const response = await fetch("/auth/demo-session", { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
    if (!response.ok) throw new Error(await errorMessage(response));
    token = (await response.json()).token;
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
    }
  }

  async function loadModels() {
    const response = await call("/v1/models");
    if (!response.ok) throw new Error(await errorMessage(response));
    const list = (await response.json()).data || [];
    const select = $("model");
    select.textContent = "";
    for (const model of list) {
      const option = document.createElement("option");
      option.value = option.textContent = model.id;
      select.appendChild(option);
    }
    if (list.length === 0) throw new Error("No model is available right now. Try again in a minute.");
  }

  // Server-sent events: events end with a blank line; each "data: " line carries one JSON chunk, the
  // last one "[DONE]". An in-band {"error": …} chunk ends a stream that failed after it started.
  async function stream(response, onText) {
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
        }
      }
    }
  }

  async function ask(event) {
    event.preventDefault();
    $("send").disabled = true;
    $("answer").textContent = "";
    status("streaming", "Streaming…");
    try {
      const response = await call("/v1/chat/completions", {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: $("model").value, messages: [{ role: "user", content: $("prompt").value }], stream: true, max_tokens: 256 }),
      });
      if (!response.ok) throw new Error(await errorMessage(response));
      await stream(response, (text) => { $("answer").textContent += text; });
      status("done", "Done.");
    } catch (error) {
      status("error", String(error && error.message ? error.message : error));
    } finally {
      $("send").disabled = false;
    }
  }

  $("ask").addEventListener("submit", ask);
  newSession()
    .then(loadModels)
    .then(() => status("ready", "Ready."))
    .catch((error) => status("error", String(error && error.message ? error.message : error)));
})();
`;
