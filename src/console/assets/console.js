// The operator console's page script (served by the gateway; no build step, no CDN). It draws the four
// statecharts from their ELK layouts, then applies the state the gateway streams once a second.
(() => {
  "use strict";
  const SVG = "http://www.w3.org/2000/svg";
  const csrf = document.querySelector('meta[name="csrf-token"]').getAttribute("content");
  const $ = (id) => document.getElementById(id);
  const el = (tag, attrs = {}, ...children) => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (k === "class") e.className = v;
      else if (k === "style") e.style.cssText = v; // CSSOM, which the page's CSP allows (style attributes it refuses)
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else if (v !== undefined && v !== null && v !== false) e.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat()) if (c !== null && c !== undefined) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return e;
  };
  const svg = (tag, attrs = {}) => {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
    return e;
  };
  const fmt = (n) => (n === null || n === undefined ? "–" : Number(n).toLocaleString("en-US"));
  const ms = (n) => (n === null || n === undefined ? "–" : n < 10 ? `${n.toFixed(1)} ms` : `${Math.round(n)} ms`);
  const pct = (x) => `${(x * 100).toFixed(x < 0.01 && x > 0 ? 2 : 1)} %`;

  function toast(text, bad) {
    const t = $("toast");
    t.textContent = text;
    t.className = bad ? "toast bad" : "toast";
    t.hidden = false;
    clearTimeout(toast.timer);
    toast.timer = setTimeout(() => (t.hidden = true), 4000);
  }

  // ── machines ──────────────────────────────────────────────────────────────────────────────────
  const TITLES = { gateway: "gateway — the process", providerSession: "providerSession — one per provider socket", request: "request — one per buyer request", settlement: "settlement — one per provider attempt" };
  const badges = new Map();
  const nodesByState = new Map();
  const machineCards = new Map();

  /** Runs ELK (in a worker) on a machine's graph and returns absolute node boxes and edge polylines. */
  async function layout(input, elk) {
    const out = await elk.layout(input.graph);
    const offset = new Map([["root", { x: 0, y: 0 }]]);
    const nodes = [];
    const walk = (n, at) => {
      for (const c of n.children || []) {
        const abs = { x: at.x + (c.x || 0), y: at.y + (c.y || 0) };
        offset.set(c.id, abs);
        nodes.push({ id: c.id, ...input.nodes[c.id], x: abs.x, y: abs.y, width: c.width, height: c.height });
        walk(c, abs);
      }
    };
    walk(out, { x: 0, y: 0 });
    const edges = [];
    const collect = (n) => {
      for (const e of n.edges || []) {
        const s = e.sections && e.sections[0];
        if (!s) continue;
        // Edge coordinates are relative to the edge's container (ELK sets it under hierarchical layout).
        const o = offset.get(e.container || n.id) || { x: 0, y: 0 };
        const points = [s.startPoint, ...(s.bendPoints || []), s.endPoint].map((p) => ({ x: p.x + o.x, y: p.y + o.y }));
        const l = e.labels && e.labels[0];
        edges.push({ ...input.edges[e.id], points, labelAt: l && l.x !== undefined ? { x: l.x + o.x, y: l.y + o.y } : null });
      }
      for (const c of n.children || []) collect(c);
    };
    collect(out);
    return { name: input.name, width: out.width, height: out.height, nodes, edges };
  }

  function drawMachine(chart) {
    const pad = 8;
    const root = svg("svg", { viewBox: `${-pad} ${-pad} ${chart.width + 2 * pad} ${chart.height + 2 * pad}`, class: "chart", role: "img", "aria-label": `${chart.name} statechart` });
    // Fit to the card, but never below 80 % (text stays readable): wider charts scroll sideways.
    root.style.minWidth = `${Math.round((chart.width + 2 * pad) * 0.8)}px`;
    root.style.maxWidth = `${Math.round((chart.width + 2 * pad) * 1.1)}px`;
    const defs = svg("defs");
    const marker = svg("marker", { id: `arrow-${chart.name}`, viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" });
    marker.append(svg("path", { d: "M 0 0 L 10 5 L 0 10 z", class: "arrowhead" }));
    defs.append(marker);
    root.append(defs);
    // Compound states first (behind), then edges, then the other states on top.
    const compound = chart.nodes.filter((n) => n.kind === "compound");
    const simple = chart.nodes.filter((n) => n.kind !== "compound");
    const drawNode = (n) => {
      const g = svg("g", { class: `state ${n.kind}`, "data-state": n.id, transform: `translate(${n.x},${n.y})` });
      if (n.kind === "initial") {
        g.append(svg("circle", { cx: 6, cy: 6, r: 6, class: "initial-dot" }));
        root.append(g);
        return;
      }
      g.append(svg("rect", { width: n.width, height: n.height, rx: n.kind === "any" ? 16 : 8, class: "box" }));
      if (n.kind === "final") g.append(svg("rect", { x: 3, y: 3, width: n.width - 6, height: n.height - 6, rx: 6, class: "final-ring" }));
      const label = svg("text", { x: 10, y: 19, class: "label" });
      label.textContent = n.label;
      g.append(label);
      n.notes.forEach((note, i) => {
        const t = svg("text", { x: 10, y: 33 + i * 12, class: "note" });
        t.textContent = note;
        g.append(t);
      });
      if (n.kind !== "any") {
        const badge = svg("g", { class: "badge", transform: `translate(${n.width - 22},${4})` });
        badge.append(svg("rect", { width: 18 + 0, height: 18, rx: 9, class: "badge-bg" }));
        const num = svg("text", { x: 9, y: 13, class: "badge-num", "data-count-for": n.id });
        num.textContent = "0";
        badge.append(num);
        g.append(badge);
        badges.set(n.id, { num, g, bg: badge.firstChild });
        g.addEventListener("click", (e) => {
          e.stopPropagation();
          openActor(chart.name, n.id);
        });
        const title = svg("title");
        title.textContent = `${n.id} — click to follow one actor in this state`;
        g.append(title);
      }
      nodesByState.set(n.id, g);
      root.append(g);
    };
    compound.forEach(drawNode);
    for (const e of chart.edges) {
      const d = e.points.map((p, i) => `${i === 0 ? "M" : "L"} ${p.x} ${p.y}`).join(" ");
      root.append(svg("path", { d, class: `edge${e.label.startsWith("after ") ? " delayed" : ""}${e.label.startsWith("always") ? " eventless" : ""}`, "marker-end": `url(#arrow-${chart.name})` }));
      if (e.label && e.labelAt) {
        const t = svg("text", { x: e.labelAt.x + 2, y: e.labelAt.y + 10, class: "edge-label" });
        t.textContent = e.label;
        root.append(t);
      }
    }
    simple.forEach(drawNode);
    const total = el("span", { class: "machine-total", "data-total-for": chart.name }, "0");
    const card = el("div", { class: "machine", "data-machine": chart.name }, el("h3", {}, TITLES[chart.name] || chart.name, " ", total, " live"), el("div", { class: "scroll" }, root));
    machineCards.set(chart.name, { card, total });
    $("machines").append(card);
  }

  function applyCounts(counts) {
    for (const [id, b] of badges) {
      const n = counts[id] || 0;
      if (b.num.textContent !== String(n)) {
        b.num.textContent = String(n);
        const w = Math.max(18, 8 + String(n).length * 7);
        b.bg.setAttribute("width", w);
        b.num.setAttribute("x", w / 2);
        b.g.classList.add("bump");
        setTimeout(() => b.g.classList.remove("bump"), 350);
      }
      b.g.classList.toggle("occupied", n > 0);
    }
    for (const [name, m] of machineCards) m.total.textContent = fmt(counts[name] || 0);
  }

  // ── actor drawer ──────────────────────────────────────────────────────────────────────────────
  let following = null;
  async function openActor(machine, state) {
    following = { machine, state };
    await refreshActor();
  }
  async function refreshActor() {
    if (!following) return;
    const drawer = $("actor");
    const res = await fetch(`/console/api/actor?machine=${encodeURIComponent(following.machine)}&state=${encodeURIComponent(following.state)}`, { credentials: "same-origin" });
    const close = el("button", { class: "close", onclick: () => ((following = null), (drawer.hidden = true)) }, "×");
    drawer.replaceChildren();
    drawer.hidden = false;
    if (!res.ok) {
      drawer.append(close, el("h2", {}, following.state), el("p", { class: "muted" }, "No live actor in this state right now. It updates every second."));
      return;
    }
    const a = await res.json();
    if (following && a.id) following = { ...following, id: a.id };
    const value = typeof a.value === "string" ? a.value : JSON.stringify(a.value);
    drawer.append(
      close,
      el("h2", {}, `${a.machine} `, el("code", {}, a.id)),
      el("p", {}, "state ", el("span", { class: "pill" }, value), " ", el("span", { class: `pill ${a.status}` }, a.status)),
      el("h3", {}, "Recent events ", el("small", { class: "muted" }, `since ${new Date(a.watchingSince).toLocaleTimeString()}`)),
      a.events.length === 0
        ? el("p", { class: "muted" }, "None yet since the console started following it.")
        : el("ol", { class: "events" }, a.events.slice().reverse().map((ev) => el("li", {}, el("time", {}, new Date(ev.at).toLocaleTimeString()), " ", el("code", {}, ev.type)))),
      el("h3", {}, "Context ", el("small", { class: "muted" }, "redacted: no prompt, output or key")),
      el("pre", { class: "context" }, JSON.stringify(a.context, null, 2)),
    );
  }

  // ── tables ────────────────────────────────────────────────────────────────────────────────────
  async function act(action, target, question) {
    if (question && !confirm(question)) return;
    const body = action === "revokeKey" ? { action, keyId: target } : { action, providerId: target };
    const res = await fetch("/console/api/actions", { method: "POST", credentials: "same-origin", headers: { "content-type": "application/json", "x-csrf-token": csrf }, body: JSON.stringify(body) });
    const out = await res.json().catch(() => ({}));
    if (res.ok) toast(`${action} ${target}: ${out.detail}`);
    else toast(`${action} ${target} failed: ${(out.error && out.error.message) || res.status}`, true);
  }

  function table(head, rows, empty) {
    if (rows.length === 0) return el("p", { class: "muted" }, empty);
    return el("table", {}, el("thead", {}, el("tr", {}, head.map((h) => el("th", {}, h)))), el("tbody", {}, rows));
  }

  function renderProviders(s) {
    const rows = s.providers.map((p) =>
      el(
        "tr",
        { class: p.banned ? "banned" : "" },
        el("td", {}, el("code", {}, p.providerId || p.sessionId)),
        el("td", {}, el("span", { class: `pill ${p.tier || ""}` }, p.tier || "handshaking"), p.pinned && p.tier !== "pinned" ? el("small", { class: "muted" }, " pinned (next connection)") : null),
        el("td", {}, el("span", { class: `pill st-${p.state.split(".").pop()}` }, p.state)),
        el("td", {}, p.models.join(", ") || "–"),
        el("td", { class: "num" }, `${p.inFlight} / ${p.slots}`),
        el("td", {}, el("div", { class: "meter" }, el("div", { class: "fill", style: `width:${p.slots ? Math.min(100, (100 * p.inFlight) / p.slots) : 0}%` }))),
        el("td", { class: `num ${p.recentFailures ? "warn" : ""}` }, p.recentFailures ? `${p.recentFailures} (${p.lastFailure})` : "0"),
        el("td", { class: "num" }, fmt(p.earnings)),
        el(
          "td",
          { class: "actions" },
          p.providerId
            ? [
                el("button", { onclick: () => act("drain", p.providerId, `Drain ${p.providerId}? It finishes its work and takes no new requests.`), disabled: p.state.endsWith("draining") }, "Drain"),
                p.pinned ? null : el("button", { onclick: () => act("pin", p.providerId, `Pin ${p.providerId} to the key it is bound to?`) }, "Pin"),
                p.banned
                  ? el("button", { onclick: () => act("unban", p.providerId) }, "Unban")
                  : el("button", { class: "danger", onclick: () => act("ban", p.providerId, `Ban ${p.providerId}? Its connection is closed and it cannot reconnect.`) }, "Ban"),
              ]
            : null,
        ),
      ),
    );
    const offline = s.offlineProviders.map((p) =>
      el(
        "tr",
        { class: "offline" },
        el("td", {}, el("code", {}, p.providerId)),
        el("td", {}, el("span", { class: "pill" }, p.pinned ? "pinned" : "provisional")),
        el("td", {}, el("span", { class: `pill ${p.banned ? "st-banned" : "st-offline"}` }, p.banned ? "banned" : "offline")),
        el("td", {}, "–"),
        el("td", { class: "num" }, "–"),
        el("td", {}, ""),
        el("td", { class: "num" }, "–"),
        el("td", { class: "num" }, fmt(p.earnings)),
        el("td", { class: "actions" }, p.banned ? el("button", { onclick: () => act("unban", p.providerId) }, "Unban") : el("button", { class: "danger", onclick: () => act("ban", p.providerId, `Ban ${p.providerId}?`) }, "Ban")),
      ),
    );
    $("providers").replaceChildren(table(["provider", "tier", "state", "models", "in flight / slots", "load", "failures (10 min)", "earnings (credits)", ""], [...rows, ...offline], "No provider has connected yet."));
  }

  function renderRequests(s) {
    const rows = s.requests.inFlight.map((r) =>
      el("tr", {}, el("td", {}, el("code", {}, r.requestId)), el("td", {}, el("span", { class: `pill st-${r.state}` }, r.state)), el("td", {}, r.streaming ? "stream" : "json"), el("td", { class: "num" }, r.attempt === null ? "–" : `#${r.attempt}`), el("td", {}, r.providerId || "–")),
    );
    $("requests").replaceChildren(table(["request", "state", "kind", "attempt", "provider"], rows, "Nothing in flight."));
  }

  function renderLedger(s) {
    const kinds = Object.entries(s.ledger).sort();
    const t = s.settlements.totals;
    $("ledger").replaceChildren(
      el("div", { class: "tiles" }, [
        el("div", { class: "tile good" }, el("b", {}, fmt(t.verified)), "verified"),
        el("div", { class: "tile bad" }, el("b", {}, fmt(t.quarantined)), "quarantined"),
        el("div", { class: "tile" }, el("b", {}, fmt(t.zero_settled)), "zero_settled"),
        el("div", { class: "tile" }, el("b", {}, fmt(s.settlements.pending)), "pending"),
      ]),
      table(["ledger accounts", "balance (credits)"], kinds.map(([k, v]) => el("tr", {}, el("td", {}, k), el("td", { class: "num" }, fmt(v)))), "The ledger is empty."),
    );
  }

  function renderKpis(s) {
    const h = s.history;
    const last = (a) => (a.length ? a[a.length - 1] : 0);
    const kpi = (label, value, cls = "") => el("div", { class: `kpi ${cls}` }, el("b", {}, value), el("span", {}, label));
    $("kpis").replaceChildren(
      kpi("gateway", s.gateway.state, s.gateway.state === "running" ? "good" : "warn"),
      kpi("in flight", fmt(s.counts.request || 0)),
      kpi("req/s", fmt(last(h.rps))),
      kpi("error rate", pct(s.requests.errorRate), s.requests.errorRate > 0.05 ? "bad" : ""),
      kpi("TTFT p50", ms(s.ttft.p50)),
      kpi("TTFT p99", ms(s.ttft.p99)),
      kpi("providers", fmt(s.providers.filter((p) => p.tier).length)),
    );
  }

  // ── charts (uPlot) ────────────────────────────────────────────────────────────────────────────
  const plots = [];
  function makePlots() {
    const specs = [
      { title: "Requests per second", series: [{ label: "completed", stroke: "#4ea1ff", fill: "rgba(78,161,255,.15)" }, { label: "failed", stroke: "#ff6b6b" }], pick: (h) => [h.rps, h.errors] },
      { title: "Time to first token (ms)", series: [{ label: "p50", stroke: "#46d39a" }, { label: "p99", stroke: "#ffb347" }], pick: (h) => [h.ttftP50, h.ttftP99] },
      {
        title: "Settlements per second",
        series: [{ label: "verified", stroke: "#46d39a", fill: "rgba(70,211,154,.12)" }, { label: "quarantined", stroke: "#ff6b6b" }, { label: "zero_settled", stroke: "#a0a7b4" }, { label: "pending (live)", stroke: "#c89bff", dash: [4, 3] }],
        pick: (h) => [h.verified, h.quarantined, h.zeroSettled, h.pending],
      },
    ];
    for (const spec of specs) {
      const box = el("div", { class: "plot" }, el("h3", {}, spec.title));
      $("charts").append(box);
      const opts = {
        width: 400,
        height: 170,
        legend: { live: false },
        cursor: { drag: { x: false, y: false } },
        scales: { x: { time: true } },
        axes: [
          { stroke: "#8a93a6", grid: { stroke: "rgba(255,255,255,.05)" }, ticks: { stroke: "rgba(255,255,255,.1)" } },
          { stroke: "#8a93a6", grid: { stroke: "rgba(255,255,255,.05)" }, ticks: { stroke: "rgba(255,255,255,.1)" }, size: 44 },
        ],
        series: [{}, ...spec.series.map((s) => ({ ...s, width: 2, points: { show: false }, spanGaps: true }))],
      };
      const plot = new uPlot(opts, [[], ...spec.series.map(() => [])], box);
      plots.push({ plot, spec, box });
    }
    const resize = () => plots.forEach(({ plot, box }) => plot.setSize({ width: Math.max(260, box.clientWidth - 16), height: 170 }));
    window.addEventListener("resize", resize);
    resize();
  }
  function applyPlots(h) {
    for (const { plot, spec } of plots) plot.setData([h.t, ...spec.pick(h)]);
  }

  // ── wiring ────────────────────────────────────────────────────────────────────────────────────
  $("logout").addEventListener("submit", async (e) => {
    e.preventDefault();
    await fetch("/console/logout", { method: "POST", credentials: "same-origin", headers: { "x-csrf-token": csrf } });
    location.reload();
  });
  $("revoke").addEventListener("submit", (e) => {
    e.preventDefault();
    const id = $("revoke-key").value.trim();
    if (id) act("revokeKey", id, `Revoke key ${id}? Requests with it fail from now on.`).then(() => ($("revoke-key").value = ""));
  });

  function apply(s) {
    document.body.dataset.updatedAt = String(s.at);
    renderKpis(s);
    applyCounts(s.counts);
    renderProviders(s);
    renderRequests(s);
    renderLedger(s);
    applyPlots(s.history);
    if (following) refreshActor();
  }

  async function start() {
    const res = await fetch("/console/api/machines", { credentials: "same-origin" });
    if (res.status === 401) return location.reload();
    const inputs = await res.json();
    // The layout runs in a Web Worker (the page's own origin), so a big chart never blocks the page.
    const elk = new ELK({ workerFactory: () => new Worker("/console/assets/elk-worker.js") });
    for (const input of inputs) drawMachine(await layout(input, elk));
    elk.terminateWorker();
    makePlots();
    const stream = new EventSource("/console/api/stream");
    stream.addEventListener("state", (e) => {
      $("live-dot").className = "dot on";
      apply(JSON.parse(e.data));
    });
    stream.addEventListener("error", () => ($("live-dot").className = "dot off"));
    document.body.dataset.ready = "true";
  }
  start();
})();
