// GET /dashboard: one small page over the API (no build step, no dependencies): held locks with a
// live expiry countdown and waiters, the last hour's acquisitions, wait p50/p99, busy and lost
// leases as SVG charts, the uses' counters and the audit; operators break locks from it. The API
// key is typed in and kept in sessionStorage, never in a URL or a cookie; the page's CSP allows
// only its own script, style and API.
import type { Context, Hono } from "hono";
import type { AppEnv } from "./_env.ts";

const HTML = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>edgelock</title>
<link rel="icon" href="/dashboard/icon.svg" type="image/svg+xml">
<link rel="stylesheet" href="/dashboard/app.css">
<script src="/dashboard/app.js" defer></script>
</head>
<body>
<header>
  <h1>edgelock</h1>
  <form id="login">
    <input id="key" type="password" autocomplete="off" placeholder="API key" aria-label="API key">
    <button>Show</button>
    <select id="tenant" aria-label="Tenant" hidden></select>
    <button id="logout" type="button" hidden>Forget key</button>
  </form>
  <p id="status" role="status"></p>
</header>
<main id="main" hidden>
  <section class="cards" id="cards"></section>
  <section class="charts">
    <figure><figcaption>Acquisitions per minute: <span class="k-granted">granted</span>, <span class="k-busy">busy</span>, <span class="k-timeout">timeout</span></figcaption><svg id="rate" viewBox="0 0 360 120" role="img" aria-label="Acquisitions per minute"></svg></figure>
    <figure><figcaption>Wait per minute, ms: <span class="k-p50">p50</span>, <span class="k-p99">p99</span></figcaption><svg id="wait" viewBox="0 0 360 120" role="img" aria-label="Wait p50 and p99"></svg></figure>
    <figure><figcaption>Lost leases per minute</figcaption><svg id="lost" viewBox="0 0 360 120" role="img" aria-label="Lost leases per minute"></svg></figure>
  </section>
  <section>
    <h2>Held locks <span id="held-count"></span></h2>
    <table id="locks"><thead><tr><th>name</th><th>fence</th><th>waiters</th><th>expires in</th><th>held as</th><th></th></tr></thead><tbody></tbody></table>
  </section>
  <section>
    <h2>Uses (last hour)</h2>
    <table id="uses"><tbody></tbody></table>
  </section>
  <section>
    <h2>Audit</h2>
    <table id="audit"><thead><tr><th>when</th><th>by</th><th>name</th><th>fence</th><th>reason</th></tr></thead><tbody></tbody></table>
  </section>
</main>
</body>
</html>
`;

const CSS = `
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{display:flex;gap:1rem;align-items:center;padding:.6rem 1rem;background:#1d2330;color:#fff;flex-wrap:wrap}
h1{font-size:1.1rem;margin:0}h2{font-size:1rem;margin:1rem 0 .4rem}
main{padding:0 1rem 2rem}#status{margin:0;opacity:.8}
input,select,button{font:inherit;padding:.2rem .5rem}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(9rem,1fr));gap:.5rem;margin-top:1rem}
.card{background:#fff;border-radius:6px;padding:.5rem .7rem;box-shadow:0 1px 2px #0002}
.card b{display:block;font-size:1.3rem}.card span{opacity:.7;font-size:.8rem}
.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(18rem,1fr));gap:.5rem}
figure{margin:.5rem 0;background:#fff;border-radius:6px;padding:.5rem;box-shadow:0 1px 2px #0002}
figcaption{font-size:.8rem;opacity:.7}svg{width:100%;height:120px}
table{border-collapse:collapse;background:#fff;width:100%;box-shadow:0 1px 2px #0002}
td,th{padding:.25rem .6rem;border-bottom:1px solid #e4e6ea;text-align:left}
.granted{fill:#2f7d4f}.busy{fill:#d08a1c}.timeout{fill:#b33a3a}.lost{fill:#b33a3a}
.p50{stroke:#2f62b3;fill:none;stroke-width:2}.p99{stroke:#b33a3a;fill:none;stroke-width:2}
.k-granted{color:#2f7d4f}.k-busy{color:#d08a1c}.k-timeout,.k-p99{color:#b33a3a}.k-p50{color:#2f62b3}
.dot-p50{fill:#2f62b3}.dot-p99{fill:#b33a3a}.axis{stroke:#9aa1ad;stroke-width:1}.label{font-size:10px;fill:#5b6270}
.none{font-size:12px;fill:#5b6270;text-anchor:middle}.empty td{opacity:.7;font-style:italic}
`;

const ICON = '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16">' +
  '<rect width="16" height="16" rx="3" fill="#1d2330"/>' +
  '<path d="M5 7V5a3 3 0 0 1 6 0v2h1v7H4V7zm2 0h2V5a1 1 0 0 0-2 0z" fill="#fff"/></svg>';

export const JS = `"use strict";
const $ = (id) => document.getElementById(id);
const KEY = "edgelock.apiKey";
let me = null, tenant = "", locks = [], timer = 0;

function cell(row, text) { const td = row.insertCell(); td.textContent = String(text); return td; }

async function api(path, init = {}) {
  const key = sessionStorage.getItem(KEY);
  const headers = { authorization: "Bearer " + key, ...(init.body ? { "content-type": "application/json" } : {}) };
  const res = await fetch(path, { ...init, headers, cache: "no-store", credentials: "omit" });
  if (res.status === 401) throw new Error("This key was refused: check it and try again.");
  const body = await res.json();
  if (!res.ok) throw new Error(body.detail || res.statusText);
  return body;
}

// The plot area inside each 360×120 chart: a value axis on the left, times along the bottom.
const X0 = 30, X1 = 354, Y0 = 6, Y1 = 100;
const SVG = "http://www.w3.org/2000/svg";
function el(name, attributes, text) {
  const e = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attributes)) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = text;
  return e;
}
const hhmm = (at) => new Date(at).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });

// Axes with the top value and zero, the first, middle and last minute's times; a line saying so
// when there is nothing to plot.
function frame(svg, minutes, max, empty) {
  svg.replaceChildren(
    el("line", { x1: X0, y1: Y0, x2: X0, y2: Y1, class: "axis" }),
    el("line", { x1: X0, y1: Y1, x2: X1, y2: Y1, class: "axis" }),
    el("text", { x: X0 - 4, y: Y0 + 8, class: "label", "text-anchor": "end" }, String(max)),
    el("text", { x: X0 - 4, y: Y1, class: "label", "text-anchor": "end" }, "0"),
  );
  if (minutes.length > 0) {
    const mid = minutes[Math.floor(minutes.length / 2)];
    svg.append(
      el("text", { x: X0, y: 116, class: "label" }, hhmm(minutes[0].at)),
      el("text", { x: (X0 + X1) / 2, y: 116, class: "label", "text-anchor": "middle" }, hhmm(mid.at)),
      el("text", { x: X1, y: 116, class: "label", "text-anchor": "end" }, hhmm(minutes[minutes.length - 1].at)),
    );
  }
  if (empty) svg.append(el("text", { x: (X0 + X1) / 2, y: (Y0 + Y1) / 2, class: "none" }, empty));
}

function scoped(path) {
  if (me.role !== "operator") return path;
  return path + (path.includes("?") ? "&" : "?") + "tenant=" + encodeURIComponent(tenant);
}

function bars(svg, minutes, series, empty) {
  const total = (m) => series.reduce((s, k) => s + m[k], 0);
  const max = Math.max(1, ...minutes.map(total));
  frame(svg, minutes, max, minutes.some((m) => total(m) > 0) ? "" : empty);
  const w = (X1 - X0) / Math.max(1, minutes.length);
  minutes.forEach((m, i) => {
    let y = Y1;
    for (const k of series) {
      const h = (m[k] / max) * (Y1 - Y0);
      if (h <= 0) continue;
      y -= h;
      const r = el("rect", { x: X0 + i * w, y, width: Math.max(1, w - 1), height: h, class: k === "lease_lost" ? "lost" : k });
      r.append(el("title", {}, hhmm(m.at) + " " + k + ": " + m[k]));
      svg.append(r);
    }
  });
}

function lines(svg, minutes) {
  const values = minutes.flatMap((m) => [m.wait_p50_ms, m.wait_p99_ms]).filter((v) => v !== null);
  const max = Math.max(1, ...values);
  frame(svg, minutes, max, values.length > 0 ? "" : "No waits in the last hour");
  const w = (X1 - X0) / Math.max(1, minutes.length - 1);
  for (const k of ["wait_p50_ms", "wait_p99_ms"]) {
    const points = minutes.map((m, i) => m[k] === null ? null : (X0 + i * w) + "," + (Y1 - (m[k] / max) * (Y1 - Y0))).filter(Boolean);
    if (points.length === 0) continue;
    const kind = k === "wait_p50_ms" ? "p50" : "p99";
    svg.append(el("polyline", { points: points.join(" "), class: kind }));
    // A minute alone draws no line: a dot shows it.
    if (points.length === 1) {
      const [cx, cy] = points[0].split(",");
      svg.append(el("circle", { cx, cy, r: 2.5, class: "dot-" + kind }));
    }
  }
}

// A table body's one row that says it has nothing to show.
function none(body, columns, text) {
  const row = body.insertRow(); row.className = "empty";
  const td = cell(row, text); td.colSpan = columns;
}

// How a lock is held: exclusive, shared by n, or a semaphore's permits out of its limit.
function holding(lock) {
  if (lock.mode === "shared") return "shared ×" + lock.holders;
  if (lock.mode === "semaphore") return "semaphore " + lock.permits + "/" + lock.limit;
  return "exclusive";
}

function showLocks() {
  const body = $("locks").tBodies[0];
  body.replaceChildren();
  if (locks.length === 0) none(body, 6, "No locks held now.");
  for (const lock of locks) {
    const row = body.insertRow();
    row.dataset.name = lock.name;
    cell(row, lock.name); cell(row, lock.fence); cell(row, lock.waiters);
    cell(row, "").className = "countdown";
    cell(row, holding(lock));
    const action = row.insertCell();
    if (me.role === "operator") {
      const button = document.createElement("button");
      button.textContent = "Break";
      button.onclick = async () => {
        const reason = prompt("Break " + lock.name + "? Its holder loses the lease.\\nWhy (kept in the audit):", "");
        if (reason === null) return;
        try {
          await api(scoped("/v1/locks/" + encodeURIComponent(lock.name) + "/break"), { method: "POST", body: JSON.stringify({ reason: reason.trim().slice(0, 200), ...(lock.mode === "shared" || lock.mode === "semaphore" ? {} : { fence: lock.fence }) }) });
        } catch (e) { $("status").textContent = e.message; }
        refresh();
      };
      action.append(button);
    }
  }
  tick();
}

function tick() {
  const rows = $("locks").tBodies[0].rows;
  for (let i = 0; i < locks.length; i++) {
    const left = Math.max(0, locks[i].expiresAt - (Date.now() + skew));
    rows[i].querySelector(".countdown").textContent = (left / 1000).toFixed(1) + " s";
  }
}

let skew = 0;
async function refresh() {
  try {
    const [stats, list, audit] = await Promise.all([
      api(scoped("/v1/stats")), api(scoped("/v1/locks?limit=200")), api(scoped("/v1/audit?limit=20")),
    ]);
    skew = stats.at - Date.now();
    locks = list.locks;
    const h = stats.last_hour;
    const cards = [
      ["held now", stats.locks_held], ["granted", h.acquire.granted], ["busy", h.acquire.busy],
      ["timeouts", h.acquire.timeout], ["lost leases", h.lease_lost],
      ["wait p50", h.wait.p50_ms === null ? "–" : h.wait.p50_ms + " ms"],
      ["wait p99", h.wait.p99_ms === null ? "–" : h.wait.p99_ms + " ms"],
      ["broken", h.break.broken],
    ];
    $("cards").replaceChildren(...cards.map(([label, value]) => {
      const d = document.createElement("div"); d.className = "card"; d.dataset.stat = label;
      const b = document.createElement("b"); b.textContent = String(value);
      const s = document.createElement("span"); s.textContent = label;
      d.append(b, s); return d;
    }));
    $("held-count").textContent = "(" + stats.locks_held + ")";
    bars($("rate"), stats.minutes, ["granted", "busy", "timeout"], "No acquisitions in the last hour");
    lines($("wait"), stats.minutes);
    bars($("lost"), stats.minutes, ["lease_lost"], "No lost leases in the last hour");
    const uses = $("uses").tBodies[0]; uses.replaceChildren();
    for (const use of ["idempotency", "dedupe", "cron"]) {
      const row = uses.insertRow(); cell(row, use);
      cell(row, Object.entries(h[use]).map(([k, v]) => k + " " + v).join(" · "));
    }
    const rows = $("audit").tBodies[0]; rows.replaceChildren();
    if (audit.entries.length === 0) none(rows, 5, "No lock was broken.");
    for (const e of audit.entries) {
      const row = rows.insertRow();
      cell(row, new Date(e.at).toLocaleString()); cell(row, e.by); cell(row, e.name); cell(row, e.fence); cell(row, e.reason);
    }
    showLocks();
    $("status").textContent = (me.role === "operator" ? "operator " + me.name + " · tenant " : "tenant ") + tenant + " · " + new Date().toLocaleTimeString();
  } catch (e) { $("status").textContent = e.message; }
}

async function start() {
  try { me = await api("/v1/me"); } catch (e) {
    sessionStorage.removeItem(KEY); $("status").textContent = e.message; $("key").focus(); return;
  }
  const select = $("tenant");
  select.replaceChildren(...me.tenants.map((t) => new Option(t, t)));
  select.hidden = me.role !== "operator";
  tenant = sessionStorage.getItem(KEY + ".tenant") || me.tenants[0];
  select.value = tenant;
  $("key").hidden = true; $("login").querySelector("button").hidden = true;
  $("logout").hidden = false; $("main").hidden = false;
  clearInterval(timer);
  timer = setInterval(() => { tick(); }, 250);
  setInterval(refresh, 5000);
  refresh();
}

$("login").onsubmit = (event) => {
  event.preventDefault();
  const key = $("key").value.trim();
  if (key) { sessionStorage.setItem(KEY, key); $("key").value = ""; start(); }
};
$("tenant").onchange = () => { tenant = $("tenant").value; sessionStorage.setItem(KEY + ".tenant", tenant); refresh(); };
$("logout").onclick = () => { sessionStorage.clear(); location.reload(); };
if (sessionStorage.getItem(KEY)) start();
`;

const CSP = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; " +
  "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/** Registers GET /dashboard and its script and style (outside the API key: they hold no data). */
export function dashboardRoutes(app: Hono<AppEnv>): void {
  const headers = (type: string) => ({
    "content-type": type,
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
  });
  app.get("/dashboard", (c) => c.body(HTML, 200, headers("text/html; charset=utf-8")));
  app.get("/dashboard/app.js", (c) => c.body(JS, 200, headers("text/javascript; charset=utf-8")));
  app.get("/dashboard/app.css", (c) => c.body(CSS, 200, headers("text/css; charset=utf-8")));
  const icon = (c: Context) => c.body(ICON, 200, headers("image/svg+xml"));
  app.get("/dashboard/icon.svg", icon);
  app.get("/favicon.ico", icon);
}
