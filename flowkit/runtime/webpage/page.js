// The live page of a flowkit worker: draws /graph once, then puts /status figures on it.
// Plain JavaScript served from the package: no build step, no CDN.
"use strict";
const NS = "http://www.w3.org/2000/svg";
const W = 250, H = 62, GAP_X = 60, GAP_Y = 18, NAME_CHARS = 30;
let previous = null;  // the last /status, to turn totals into rates
const figures = {};   // node id -> its <text class="figure">

// The endpoint's token, when it has one: given once in the address (#token=...), which
// the page then removes from it (a fragment is never sent to a server), or typed in the
// form; kept for this tab only and sent as a header, never in a URL.
const TOKEN_KEY = "flowkit-web-token";
function takeTokenFromAddress() {
  const params = new URLSearchParams(location.hash.slice(1));
  const given = params.get("token");
  if (given) sessionStorage.setItem(TOKEN_KEY, given);
  if (location.hash) history.replaceState(null, "", location.pathname + location.search);
}

class Unauthorized extends Error {}

async function api(path) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const headers = token ? { "Authorization": "Bearer " + token } : {};
  const response = await fetch(path, { headers, cache: "no-store" });
  if (response.status === 401) throw new Unauthorized();
  return response;
}

function askForToken() {
  const form = document.getElementById("login");
  if (!form.hidden) return;  // asked already
  form.hidden = false;
  document.getElementById("state").textContent = "needs its token";
  document.getElementById("state").className = "badge down";
  form.addEventListener("submit", event => {
    event.preventDefault();
    const field = document.getElementById("login-token");
    sessionStorage.setItem(TOKEN_KEY, field.value.trim());
    field.value = "";
    form.hidden = true;
    if (!started) start();
  }, { once: true });
}

function el(name, attrs, parent) {
  const node = document.createElementNS(NS, name);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (parent) parent.appendChild(node);
  return node;
}

function layout(graph) {
  // Columns by longest path from a node with no inputs; rows in declaration order.
  const incoming = {}, depth = {};
  graph.nodes.forEach(n => { incoming[n.id] = []; });
  graph.edges.forEach(e => { if (incoming[e.target]) incoming[e.target].push(e.source); });
  const visit = (id, seen) => {
    if (depth[id] !== undefined) return depth[id];
    if (seen.has(id)) return 0;
    seen.add(id);
    const d = incoming[id].length ? 1 + Math.max(...incoming[id].map(s => visit(s, seen))) : 0;
    depth[id] = d;
    return d;
  };
  graph.nodes.forEach(n => visit(n.id, new Set()));
  const columns = {};
  graph.nodes.forEach(n => { (columns[depth[n.id]] = columns[depth[n.id]] || []).push(n); });
  const pos = {};
  Object.entries(columns).forEach(([c, nodes]) => nodes.forEach((n, r) => {
    pos[n.id] = { x: 20 + c * (W + GAP_X), y: 20 + r * (H + GAP_Y) };
  }));
  return pos;
}

function draw(graph) {
  const svg = document.getElementById("graph");
  svg.innerHTML = "";
  const defs = el("defs", {}, svg);
  const marker = el("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5,
    markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" }, defs);
  el("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "#8a93a3" }, marker);
  const pos = layout(graph);
  let maxX = 0, maxY = 0;
  graph.edges.forEach(e => {
    const a = pos[e.source], b = pos[e.target];
    if (!a || !b) return;
    const x1 = a.x + W, y1 = a.y + H / 2, x2 = b.x, y2 = b.y + H / 2;
    el("path", { class: "edge " + e.kind,
      d: `M ${x1} ${y1} C ${x1 + 40} ${y1}, ${x2 - 40} ${y2}, ${x2} ${y2}` }, svg);
  });
  graph.nodes.forEach(n => {
    const p = pos[n.id];
    const kind = n.dead_letter ? "dlq" : n.kind;
    const g = el("g", { class: "node " + kind, "data-id": n.id, "data-name": n.name,
      transform: `translate(${p.x},${p.y})` }, svg);
    el("title", {}, g).textContent = n.name;
    el("rect", { width: W, height: H }, g);
    const name = n.name.length > NAME_CHARS ? n.name.slice(0, NAME_CHARS - 1) + "\u2026" : n.name;
    el("text", { x: 8, y: 18, class: "name" }, g).textContent = name;
    el("text", { x: 8, y: 34, class: "kind" }, g).textContent =
      n.dead_letter ? "dead letters" : n.kind.replace("_", " ");
    figures[n.id] = el("text", { x: 8, y: 52, class: "figure" }, g);
    maxX = Math.max(maxX, p.x + W); maxY = Math.max(maxY, p.y + H);
  });
  svg.setAttribute("viewBox", `0 0 ${maxX + 20} ${maxY + 20}`);
  svg.setAttribute("data-rendered", String(graph.nodes.length));
  const select = document.getElementById("lookup-table");
  graph.nodes.filter(n => n.kind.endsWith("table")).forEach(n => {
    const option = document.createElement("option");
    option.value = option.textContent = n.name;
    select.appendChild(option);
  });
}

function rate(now, before, seconds) {
  if (!before || seconds <= 0) return 0;
  return Math.max(now - before, 0) / seconds;
}

function fmt(n) { return n >= 1000 ? (n / 1000).toFixed(1) + "k" : String(Math.round(n)); }

function show(status) {
  const seconds = previous ? status.elapsed - previous.elapsed : 0;
  const badge = document.getElementById("state");
  badge.textContent = !status.alive ? "failed" : status.ready ? "ready" : "starting";
  badge.className = "badge " + (!status.alive ? "down" : status.ready ? "ready" : "starting");
  document.getElementById("totals").textContent =
    `${status.records_in} records in · ${status.dead_letters} dead letters`;
  for (const [name, a] of Object.entries(status.agents)) {
    const text = figures["agent:" + name];
    if (!text) continue;
    const before = previous && previous.agents[name] ? previous.agents[name].records : null;
    text.textContent = `${fmt(rate(a.records, before, seconds))} rec/s · ${a.records} done` +
      (a.errors ? ` · ${a.errors} errors` : "");
    text.setAttribute("data-records", String(a.records));
  }
  for (const [name, t] of Object.entries(status.topics)) {
    const text = figures["topic:" + name];
    if (text) text.textContent = `lag ${t.lag} (${t.lag_seconds.toFixed(1)} s)`;
  }
  for (const [name, t] of Object.entries(status.tables)) {
    const text = figures["table:" + name];
    if (!text) continue;
    let line = `${t.keys} keys`;
    if (t.watermark !== undefined && t.watermark !== null) {
      line += " · wm " + new Date(t.watermark).toISOString().substring(11, 19);
    }
    text.textContent = line;
  }
  const r = status.recovery;
  document.getElementById("recovery").textContent = r.active
    ? `${r.done} read, ${r.left} left, ${Math.round(r.rate)} records/s`
    : `idle (${r.done} records read in all)`;
  previous = status;
}

async function poll() {
  try {
    const response = await api("/status");
    show(await response.json());
  } catch (err) {
    if (err instanceof Unauthorized) { askForToken(); return; }
    const badge = document.getElementById("state");
    badge.textContent = "unreachable";
    badge.className = "badge down";
  }
}

async function lookup(event) {
  event.preventDefault();
  const table = document.getElementById("lookup-table").value;
  const key = document.getElementById("lookup-key").value;
  const out = document.getElementById("lookup-result");
  try {
    const response = await api(`/tables/${encodeURIComponent(table)}/${encodeURIComponent(key)}`);
    out.textContent = JSON.stringify(await response.json(), null, 2);
  } catch (err) {
    if (err instanceof Unauthorized) askForToken();
    else throw err;
  }
}

let started = false;  // the graph is drawn and the figures polled

async function start() {
  let graph;
  try {
    graph = await (await api("/graph")).json();
  } catch (err) {
    if (err instanceof Unauthorized) { askForToken(); return; }
    throw err;
  }
  document.getElementById("app").textContent = graph.app;
  document.title = `${graph.app} · flowkit`;
  started = true;
  draw(graph);
  document.getElementById("lookup").addEventListener("submit", lookup);
  await poll();
  setInterval(poll, 1000);
}

takeTokenFromAddress();
window.addEventListener("hashchange", takeTokenFromAddress);
start();
